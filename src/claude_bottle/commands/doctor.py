"""``doctor``: check what a bottle needs on this machine."""

from __future__ import annotations

import os

import click

from claude_bottle.errors import BottleError


def doctor() -> int:
    """Check the container engine, its OCI runtimes, the token and the images, one line each; 1 if any
    check failed, else 0."""
    from claude_bottle import tokens
    from claude_bottle.agent.schema import AgentConfig
    from claude_bottle.launch import build_inputs
    from claude_bottle.runtime import engine, images
    from claude_bottle.runtime.docker_engine import open_engine
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
    if opened is not None:
        inputs = build_inputs(AgentConfig())
        for spec in (images.bottle_spec(inputs), images.gate_spec(inputs)):
            built = opened.image_exists(spec.tag)
            report(built, f"{spec.name} image {spec.tag} {'built' if built else 'not built: run claude-bottle build'}")
    return 1 if problems else 0
