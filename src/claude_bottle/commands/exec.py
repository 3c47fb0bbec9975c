"""``exec``: run a command inside a running bottle, as its user."""

from __future__ import annotations

import os
import subprocess
import sys


def exec_in(agent: str | None, workspace: str | None, command: list[str]) -> int:
    """Run ``command`` in the bottle of ``agent``, or of this workspace, or the only one running, attached to
    this terminal; its exit code."""
    from pathlib import Path

    from claude_bottle.launch import docker_cli
    from claude_bottle.runtime.docker_engine import open_engine
    from claude_bottle.runtime.listing import bottle_of

    place = Path(workspace or os.getcwd()).expanduser().resolve()
    bottle = bottle_of(open_engine(), agent, place)
    terminal = ["-it"] if sys.stdin.isatty() else ["-i"]
    # no -u: docker exec runs as the container's own user, the one the bottle was started as
    return subprocess.call([docker_cli(), "exec", *terminal, bottle.name, *command])
