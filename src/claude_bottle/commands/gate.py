"""``gate``: run the credential-holding proxy; ``stub-upstream``: a stand-in for the Messages API.

Both run inside the gate image, which has no Docker SDK: import nothing of the bottle side here.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import TextIO

import click

from claude_bottle.errors import ConfigError


@contextlib.contextmanager
def audit_stream(path: str | None) -> Iterator[TextIO | None]:
    """Where the audit goes: nowhere (None), stderr ('-') or appended to the file ``path``."""
    if path is None:
        yield None
    elif path == "-":
        yield sys.stderr
    else:
        try:
            stream = open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed below
        except OSError as exc:
            raise ConfigError(f"--audit-log {path}: {exc.strerror}") from None
        with stream:
            yield stream


def run_gate(
    api_listen: str, proxy_listen: str, upstream: str, token_file: str, allow: tuple[str, ...],
    allow_tcp: tuple[str, ...], allow_private: tuple[str, ...], allow_api_path: tuple[str, ...],
    allow_server_tool: tuple[str, ...], egress_rule: tuple[str, ...], no_inspect: tuple[str, ...],
    dlp_rule: tuple[str, ...], dlp_off: tuple[str, ...], credential_route: tuple[str, ...],
    extra_ca: tuple[str, ...], audit_log: str | None,
    ca_cert_out: str | None, max_tunnels: int, max_connections: int, idle_timeout: float, drain_seconds: float,
    learn: bool, control_socket: str | None,
) -> None:
    """Parse the gate's options (each as its command-line flag names it) and serve until stopped."""
    from pathlib import Path

    from claude_bottle.gate import settings as gc
    from claude_bottle.gate.audit import AuditLog
    from claude_bottle.gate.server import serve

    request_policy = gc.parse_egress_rules(egress_rule, no_inspect)
    route_specs = gc.parse_routes(credential_route, request_policy)
    credential, routes = gc.read_secrets(token_file, route_specs)
    config = gc.GateSettings(
        api_listen=gc.parse_listen(api_listen, "--api-listen"),
        proxy_listen=gc.parse_listen(proxy_listen, "--proxy-listen"),
        upstream=gc.parse_upstream(upstream),
        allowlist=gc.parse_allowlist(allow, extra=request_policy.patterns + gc.route_patterns(route_specs)),
        allow_tcp=gc.parse_allowlist(allow_tcp, "--allow-tcp"),
        request_policy=request_policy,
        dlp=gc.parse_dlp(dlp_rule, dlp_off),
        allow_private=gc.parse_networks(allow_private),
        api_policy=gc.parse_api_paths(allow_api_path),
        messages_policy=gc.parse_server_tools(allow_server_tool),
        extra_ca_files=tuple(Path(p) for p in extra_ca),
        credential=credential,
        routes=routes,
        limits=gc.Limits(max_tunnels=max_tunnels, max_connections=max_connections, idle_timeout=idle_timeout,
                         drain_seconds=drain_seconds),
        learn=learn,
        control_socket=Path(control_socket) if control_socket else None,
    )
    config.ssl_context()  # fail now, not on the first request, if an extra CA cannot be loaded
    if config.upstream.scheme == "http" and not gc.loopback(config.upstream.host):
        click.echo(f"warning: --upstream {upstream} is plain HTTP: the credential crosses the network "
                   "unencrypted", err=True)
    with audit_stream(audit_log) as stream:
        serve(config, AuditLog(stream, secrets=config.injected_secrets),
              ca_cert_out=Path(ca_cert_out) if ca_cert_out else None)


def run_stub_upstream(listen: str, text: str | None, log: bool, tls_file: str | None) -> None:
    """Serve the stand-in Messages API on ``listen`` (HTTPS with the PEM chain and key in ``tls_file``)
    until interrupted."""
    import asyncio
    import ssl

    from claude_bottle.gate.settings import parse_listen
    from claude_bottle.stub import DEFAULT_TEXT, serve

    endpoint = parse_listen(listen, "--listen")
    tls = None
    if tls_file is not None:
        tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        try:
            tls.load_cert_chain(tls_file)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"--tls {tls_file}: cannot load a certificate chain and key ({exc})") from None
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(endpoint.host, endpoint.port, text or DEFAULT_TEXT, log, tls))
