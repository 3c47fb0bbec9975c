"""``policy suggest``: an allowlist from what a run did."""

from __future__ import annotations

import click

from claude_bottle.commands import agent_file
from claude_bottle.commands.logs import read_audit


def suggest_allowlist(agent: str | None, workspace: str | None, run_id: str | None, write_to: str | None,
            yes: bool) -> None:
    """Print the allowlist (agent-file TOML) the chosen run's audit suggests; with ``write_to``, add what that
    agent does not allow yet to its file instead."""
    from claude_bottle import suggest

    entries, _, source = read_audit(agent, workspace, run_id, False)
    found = suggest.suggest(entries)
    if write_to is None:
        click.echo(suggest.render(found, f"run {source}"), nl=False)
        return
    added = suggest.additions(found, agent_file.allowlist(write_to), f"run {source}")
    if not added:
        click.echo(f"agent {write_to} already allows every destination of run {source}")
        return
    agent_file.add(write_to, added, yes)
