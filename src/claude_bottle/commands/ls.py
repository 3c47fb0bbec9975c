"""``ls``: the running bottles."""

from __future__ import annotations

import json

import click


def list_runs(as_json: bool) -> None:
    """Print the running bottles as a table, or as JSON."""
    from claude_bottle.display import printable
    from claude_bottle.runtime.engines import open_engine
    from claude_bottle.runtime.listing import runs

    found = runs(open_engine())
    if as_json:
        click.echo(json.dumps(found, indent=2))
    elif not found:
        click.echo("no bottles")
    else:
        click.echo(f"{'AGENT':16} {'RUN':24} {'STATUS':10} WORKSPACE")
        for r in found:
            click.echo(f"{r['agent']:16} {r['run']:24} {r['status']:10} {printable(r['workspace'])}")
