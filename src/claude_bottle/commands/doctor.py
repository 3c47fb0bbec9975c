"""``doctor``: check what a bottle needs on this machine."""

from __future__ import annotations

import os
from collections.abc import Mapping

import click

from claude_bottle.errors import BottleError


def upstream_proxy_check(environ: Mapping[str, str], timeout: float = 10.0) -> tuple[bool, str]:
    """The upstream proxy a run's gate would use by default (the host's proxy variables), and whether the API
    host answers through it (a tunnel opened and closed from this host). ``(ok, line)``."""
    import asyncio

    from claude_bottle.agent.upstream_proxy import choose_upstream_proxy
    from claude_bottle.gate.failures import UpstreamSide
    from claude_bottle.gate.settings import DEFAULT_UPSTREAM, parse_upstream
    from claude_bottle.gate.upstream import Dialer

    try:
        proxy = choose_upstream_proxy(None, "", environ)
    except BottleError as exc:
        return False, f"upstream proxy: {exc}"
    if proxy is None:
        return True, "upstream proxy: none (the gate connects out directly)"
    api = parse_upstream(DEFAULT_UPSTREAM)
    dialer = Dialer(timeout, proxy)
    if dialer.via(api.host) is None:
        return True, f"upstream proxy: {proxy.url}, bypassed for {api.host} (NO_PROXY)"
    try:
        asyncio.run(dialer.check(api.host, api.port))
    except UpstreamSide as exc:
        return False, f"upstream proxy: {proxy.url}: {exc.reason}"
    return True, f"upstream proxy: {proxy.url}; {api.host}:{api.port} answers through it"


def dlp_engine_line() -> str:
    """How the gate built from this installation matches DLP rules (its image pins the packages found here)."""
    from claude_bottle.gate.dlp import DlpPolicy, engine_note

    return engine_note(DlpPolicy().matcher([]))


def doctor() -> int:
    """Check the container engine, its OCI runtimes, the token, the upstream proxy and the images, one line
    each; 1 if any check failed, else 0."""
    from claude_bottle import tokens
    from claude_bottle.agent.schema import AgentConfig
    from claude_bottle.launch import build_inputs
    from claude_bottle.runtime import engine, images
    from claude_bottle.runtime.engines import open_engine
    from claude_bottle.runtime.seam import Engine

    problems = 0

    def report(ok: bool, text: str) -> None:
        nonlocal problems
        problems += not ok
        click.echo(f"{'ok ' if ok else 'NO '} {text}")

    opened: Engine | None = None
    try:
        opened = open_engine()
        about = opened.describe()
        report(True, f"engine: {about.describe()} ({os.environ.get('DOCKER_HOST') or 'the default socket'})")
        gvisor = "available (runtime = 'runsc')" if "runsc" in about.runtimes else "not registered"
        report(True, f"OCI runtimes: {', '.join(about.runtimes) or 'none listed'} (default "
                     f"{about.default_runtime or 'unknown'}); gVisor {gvisor}")
        if limits := engine.unenforced_limits(about):
            report(False, limits)
        if not about.podman:
            report(True, "engine resolves no external names on internal networks"
                   if about.version >= engine.DNS_FIXED_VERSION
                   else "engine older than 25.0.5 (CVE-2024-29018): bottles get a resolver that answers nothing, "
                        "so this is covered, but upgrading is wise")
    except BottleError as exc:
        report(False, str(exc))
        opened = None
    try:
        _, source = tokens.find()
        report(True, f"token found in {source}")
    except BottleError as exc:
        report(False, str(exc))
    report(*upstream_proxy_check(os.environ))
    report(True, dlp_engine_line())
    if opened is not None:
        inputs = build_inputs(AgentConfig())
        for spec in (images.bottle_spec(inputs), images.gate_spec(inputs)):
            built = opened.image_exists(spec.tag)
            report(built, f"{spec.name} image {spec.tag} {'built' if built else 'not built: run claude-bottle build'}")
    return 1 if problems else 0
