"""``build``: build the bottle and gate images an agent needs."""

from __future__ import annotations

import click

from claude_bottle.commands.common import progress


def build(agent: str | None, workspace: str | None) -> None:
    """Build what changed of the agent's two images, showing progress, and print their tags. Downloads go
    through the proxy a run of the agent would use (its ``upstream_proxy``, else the host's variables)."""
    import os

    from claude_bottle.agent.load import load_agent
    from claude_bottle.agent.upstream_proxy import choose_upstream_proxy
    from claude_bottle.host_inputs import check_ca_files
    from claude_bottle.launch import build_images, build_inputs, workspace_of
    from claude_bottle.runtime.engines import open_engine

    path = workspace_of(workspace)
    config = load_agent(agent, path)
    check_ca_files(build_inputs(config).extra_ca_files, path, config.mounts)  # as a run of it would
    proxy = choose_upstream_proxy(None, config.upstream_proxy, os.environ)
    bottle, gate_image = build_images(open_engine(), config, progress, proxy)
    click.echo(f"bottle image: {bottle}\ngate image:   {gate_image}")
