"""``trust``: review and approve a workspace's project file and the files bottles changed in it."""

from __future__ import annotations

import sys

import click

from claude_bottle.errors import ConfigError


def review(directory: str | None, yes: bool) -> None:
    """Show what there is to approve in ``directory`` (default: here) and approve it once confirmed (a prompt
    on a terminal, else ``yes``); ConfigError when not confirmed."""
    from claude_bottle import trust
    from claude_bottle.agent.project import project_summary, read_project_file
    from claude_bottle.display import printable, printable_lines
    from claude_bottle.launch import workspace_of

    path = workspace_of(directory)
    project = read_project_file(path)
    changes = trust.unreviewed(path)
    new_project = project is not None and trust.approved_digest(path) != project.digest
    if project is not None:
        summary = project_summary(project)  # a key a project file may not set fails here, before approval
        click.echo(f"{project.path} (sha256 {project.digest[:16]}, "
                   f"{'not approved yet' if new_project else 'approved'}):")
        # Each of the file's lines in a margin: a bottle may have written it, and a line of its own must not
        # pass for the end of the file or for the summary below.
        click.echo("\n".join(f"  | {line}" for line in printable_lines(project.text).rstrip().split("\n")))
        click.echo("It sets:\n" + "\n".join(f"  {printable(line)}" for line in summary))
    if changes:
        click.echo(f"Bottles changed these files in {path}, which can run code on your machine:\n"
                   f"{trust.listing(changes, shown=None)}\n"
                   "Look at them (git diff, an editor that does not run them) first.")
    if not new_project and not changes:
        click.echo(f"nothing to approve in {path}")
        return
    if not yes:
        if not sys.stdin.isatty():
            raise ConfigError(f"review what is shown above, then run `claude-bottle trust {path} --yes` "
                              "(no terminal to ask on)")
        if not click.confirm("Trust this?", default=False):
            raise ConfigError("not approved; nothing changed")
    if project is not None and new_project:
        trust.approve(path, project.digest)
    trust.clear_review(path, changes)
    click.echo(f"approved: {path}")
