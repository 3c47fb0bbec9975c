"""``allow`` and ``deny``: change a running bottle's allowlist at once, and with ``--save`` its agent's file."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import click

from claude_bottle.commands import agent_file
from claude_bottle.errors import ConfigError

if TYPE_CHECKING:
    from docker.models.containers import Container


def gate_for(agent: str | None, workspace: str | None) -> Container:
    """The gate of the bottle to change: ``agent``'s, this workspace's, or the only one running."""
    from pathlib import Path

    from claude_bottle.runtime import engine
    from claude_bottle.runtime.bottle import gate_of

    return gate_of(engine.connect(), agent, Path(workspace or os.getcwd()).expanduser().resolve())


def allow(agent: str | None, entry: str, workspace: str | None, save: bool, yes: bool) -> None:
    """Allow ``entry`` (HOST[:PORT] as in an allow list) in the running bottle; with ``save`` also add it to
    the agent's file."""
    from claude_bottle import suggest
    from claude_bottle.runtime.bottle import AGENT_LABEL, control_gate

    gate = gate_for(agent, workspace)
    reply = control_gate(gate, "allow", entry)
    click.echo(f"{reply['message']} in {gate.name.removeprefix('claude-bottle-').removesuffix('-gate')}")
    if save:
        name = gate.labels.get(AGENT_LABEL, agent or "")
        if reply["message"].removeprefix("allowed ") in agent_file.allowlist(name):
            click.echo(f"agent {name} already lists it")
            return
        agent_file.add(name, suggest.host_table(reply["message"].removeprefix("allowed "),
                                                "added by `claude-bottle allow --save`"), yes)


def deny(agent: str | None, entry: str, workspace: str | None, save: bool, yes: bool) -> None:
    """Refuse ``entry`` in the running bottle from now on; with ``save`` also remove it from the agent's file
    (ConfigError when the file does not list it as written)."""
    from claude_bottle import suggest
    from claude_bottle.runtime.bottle import AGENT_LABEL, control_gate

    gate = gate_for(agent, workspace)
    reply = control_gate(gate, "deny", entry)
    click.echo(f"{reply['message']} in {gate.name.removeprefix('claude-bottle-').removesuffix('-gate')}")
    if not save:
        return
    name, pattern = gate.labels.get(AGENT_LABEL, agent or ""), reply["message"].removeprefix("denied ")
    path = agent_file.path_of(name)
    before = path.read_text() if path.exists() else ""
    try:
        after = suggest.without_entry(before, pattern)
    except ValueError as exc:
        raise ConfigError(f"{path}: {exc}; remove {pattern} from it by hand") from None
    if after == before:
        raise ConfigError(f"{path} lists no entry {pattern} (in allow or as an [[egress]] host); it may come from "
                          "a preset or another spelling: edit the file by hand")
    agent_file.rewrite(name, before, after, yes)
