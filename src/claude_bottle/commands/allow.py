"""``allow`` and ``deny``: change a running bottle's allowlist at once, and with ``--save`` its agent's file."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import click

from claude_bottle.commands import agent_file
from claude_bottle.errors import ConfigError

if TYPE_CHECKING:
    from claude_bottle.runtime.seam import ContainerInfo, Engine


def gates_for(agent: str | None, workspace: str | None) -> tuple[Engine, list[ContainerInfo]]:
    """The gates of the bottles to change, with their engine: ``agent``'s on this workspace (each, where
    several run there at once), else ``agent``'s, or the only one running."""
    from pathlib import Path

    from claude_bottle.runtime.engines import open_engine
    from claude_bottle.runtime.listing import gates_of

    engine = open_engine()
    return engine, gates_of(engine, agent, Path(workspace or os.getcwd()).expanduser().resolve())


def allow(agent: str | None, entry: str, workspace: str | None, save: bool, yes: bool) -> None:
    """Allow ``entry`` (HOST[:PORT] as in an allow list) in the running bottles (``gates_for``); with ``save``
    also add it to the agent's file."""
    from claude_bottle import suggest
    from claude_bottle.runtime.gate import control_gate
    from claude_bottle.runtime.names import RunNames, run_of

    engine, gates = gates_for(agent, workspace)
    for gate in gates:
        reply = control_gate(engine, gate, "allow", entry)
        click.echo(f"{reply['message']} in {run_of(gate.name)}")
    if save:
        name = RunNames.from_labels(gate.labels).agent or agent or ""
        if reply["message"].removeprefix("allowed ") in agent_file.allowlist(name).texts():
            click.echo(f"agent {name} already lists it")
            return
        agent_file.add(name, suggest.host_table(reply["message"].removeprefix("allowed "),
                                                "added by `claude-bottle allow --save`"), yes)


def deny(agent: str | None, entry: str, workspace: str | None, save: bool, yes: bool) -> None:
    """Refuse ``entry`` in the running bottles (``gates_for``) from now on; with ``save`` also remove it from the
    agent's file (ConfigError when the file does not list it as written)."""
    from claude_bottle import suggest
    from claude_bottle.runtime.gate import control_gate
    from claude_bottle.runtime.names import RunNames, run_of

    engine, gates = gates_for(agent, workspace)
    for gate in gates:  # every bottle of the agent here: one left out would keep reaching what is refused
        reply = control_gate(engine, gate, "deny", entry)
        click.echo(f"{reply['message']} in {run_of(gate.name)}")
    if not save:
        return
    name, pattern = RunNames.from_labels(gate.labels).agent or agent or "", reply["message"].removeprefix("denied ")
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
