"""``stop``: stop bottles and remove their containers."""

from __future__ import annotations

import click

from claude_bottle.errors import ConfigError


def stop(agent: str | None, stop_all: bool) -> None:
    """Stop the bottles of ``agent``, or every bottle and the kept internal networks with ``stop_all``."""
    from claude_bottle.runtime import engine
    from claude_bottle.runtime.bottle import remove_run, runs, trim_pool

    if not agent and not stop_all:
        raise ConfigError("name an AGENT to stop, or pass --all")
    client = engine.connect()
    stopped = [r["run"] for r in runs(client) if stop_all or r["agent"] == agent]
    for run_id in stopped:
        remove_run(client, run_id)
    if stop_all and (gates := client.images.list(name="claude-bottle-gate")):
        trim_pool(client, gates[0].id, kept=0)  # a claim needs an image: any gate image will do
    click.echo(f"stopped {', '.join(stopped)}" if stopped else "nothing to stop")
