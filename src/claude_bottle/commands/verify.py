"""``verify``: attack a bottle of an agent from inside and report what got through."""

from __future__ import annotations

import click

from claude_bottle.commands.common import progress, with_runtime


def verify(agent: str | None, as_json: bool, runtime: str | None, upstream_proxy: str | None = None) -> int:
    """Run the attacks on a bottle of ``agent`` and print the report (or JSON); 1 if any attack succeeded,
    else 0. ``upstream_proxy`` (``--upstream-proxy``), else the agent's, else the host's variables: the proxy
    the image builds go through; the gates under test reach verify's local stand-ins directly."""
    import os
    from pathlib import Path

    from claude_bottle.agent.load import load_agent
    from claude_bottle.agent.upstream_proxy import choose_upstream_proxy
    from claude_bottle.verify import report, suite

    config = with_runtime(load_agent(agent, Path.cwd()), runtime)
    proxy = choose_upstream_proxy(upstream_proxy, config.upstream_proxy, os.environ)
    outcomes = suite.verify(config, progress, proxy)
    click.echo(report.as_json(config, outcomes) if as_json else report.report(outcomes))
    return 1 if any(not o.blocked for o in outcomes) else 0
