"""``forget``: a workspace's Claude state removed, so the next run there starts afresh.

Each agent keeps ``~/.claude`` per workspace in a volume of its own (conversations for ``--continue`` and
``--resume``, history, Claude Code's memory, and any skills, subagents or commands made in the bottle). A
hijacked run can leave instructions there for later runs of that agent on that workspace (docs/trust.md's
known limits); forgetting the state ends that, with the conversations.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from claude_bottle.errors import ConfigError, DockerError


def forget(agent: str | None, workspace: str | None, yes: bool) -> None:
    """Remove ``agent``'s Claude state on the workspace (default: here), or every agent's there, once
    confirmed (a prompt on a terminal, else ``yes``); refused while a bottle of it runs there."""
    from claude_bottle.runtime.engines import open_engine
    from claude_bottle.runtime.listing import runs
    from claude_bottle.runtime.names import AGENT_LABEL, WORKSPACE_LABEL

    place = Path(workspace or os.getcwd()).expanduser().resolve()
    engine = open_engine()
    found = {name: labels.get(AGENT_LABEL, "") for name, labels in
             engine.volumes_labelled(f"{WORKSPACE_LABEL}={place}").items()
             if agent is None or labels.get(AGENT_LABEL) == agent}
    whose = f"agent {agent}'s" if agent else "any agent's"
    if not found:
        click.echo(f"no Claude state of {whose} for {place}")
        return
    running = [r for r in runs(engine) if r["workspace"] == str(place) and r["agent"] in found.values()]
    if running:
        raise DockerError(f"{', '.join(sorted(r['run'] for r in running))} running on {place} use this state: "
                          f"stop {'it' if len(running) == 1 else 'them'} first "
                          f"(`claude-bottle stop {running[0]['agent']}`)")
    for name, owner in sorted(found.items()):
        click.echo(f"{name}: agent {owner}'s Claude state for {place} (conversations, history, memory)")
    if not yes:
        if not sys.stdin.isatty():
            raise ConfigError("nothing removed: run again with --yes to remove what is listed above (no terminal "
                              "to ask on)")
        if not click.confirm("Remove it for good?", default=False):
            raise ConfigError("nothing removed")
    for name in sorted(found):
        engine.remove_volume(name)
    click.echo(f"removed {len(found)} volume{'s' if len(found) > 1 else ''}: the next run starts afresh")
