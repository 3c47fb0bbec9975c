"""``stop``: stop bottles and remove their containers."""

from __future__ import annotations

import click

from claude_bottle.errors import ConfigError


def stop(agent: str | None, stop_all: bool) -> None:
    """Stop the bottles of ``agent``, or every bottle and the kept internal networks with ``stop_all``."""
    from claude_bottle.runtime.engines import open_engine
    from claude_bottle.runtime.listing import runs
    from claude_bottle.runtime.names import image_repository
    from claude_bottle.runtime.pool import trim_pool
    from claude_bottle.runtime.removal import remove_run

    if not agent and not stop_all:
        raise ConfigError("name an AGENT to stop, or pass --all")
    engine = open_engine()
    stopped = [r["run"] for r in runs(engine) if stop_all or r["agent"] == agent]
    for run_id in stopped:
        remove_run(engine, run_id)
    if stop_all and (gates := engine.image_ids(image_repository("gate"))):
        trim_pool(engine, gates[0], kept=0)  # a claim needs an image: any gate image will do
    click.echo(f"stopped {', '.join(stopped)}" if stopped else "nothing to stop")
