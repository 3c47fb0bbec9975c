"""``exec``: run a command inside a running bottle, as its user."""

from __future__ import annotations

import os
import sys


def exec_in(agent: str | None, workspace: str | None, command: list[str]) -> int:
    """Run ``command`` in the bottle of ``agent``, or of this workspace, or the only one running, attached to
    this terminal; its exit code."""
    from pathlib import Path

    from claude_bottle.launch import attached_on_terminal, engine_client, interrupt, on_stop_signals
    from claude_bottle.runtime.engines import open_engine
    from claude_bottle.runtime.listing import bottle_of

    place = Path(workspace or os.getcwd()).expanduser().resolve()
    engine = open_engine()
    bottle = bottle_of(engine, agent, place)
    client = engine.exec_command(bottle.name, command, tty=sys.stdin.isatty())
    signals = on_stop_signals(interrupt)  # unwound: the client killed, the terminal restored
    if not sys.stdin.isatty():  # the streams byte for byte, as a pipe wants them; a terminal's shown
        with engine_client(client) as process, signals:
            return process.wait()
    return attached_on_terminal(client, signals)
