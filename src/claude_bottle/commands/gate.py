"""``gate``: run the credential-holding proxy; ``stub-upstream``: a stand-in for the Messages API.

Both run inside the gate image, which has no Docker SDK: import nothing of the bottle side here.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
from collections.abc import Iterator, Mapping
from typing import Any, TextIO

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


class GateCommand(click.Command):
    """The ``gate`` command, whose options are made from ``GateOptions`` (gate/options.py): one per ``Flag``,
    in its order. They are made when the command is used, not when the CLI loads: the gate's modules take a
    second to import on a busy machine, and every other command would wait for them."""

    def get_params(self, ctx: click.Context) -> list[click.Parameter]:
        if not self.params:
            self.params = gate_params()
        return super().get_params(ctx)


def gate_params() -> list[click.Parameter]:
    """The gate command's options, one per ``Flag`` of ``GateOptions``: a field's type and default say the
    option's (required, a flag, repeatable, a bounded number); a field with several flags takes each as a
    repeatable text."""
    from claude_bottle.gate.options import flags

    params: list[click.Parameter] = []
    for name, flag, default in flags():
        kind: Any = click.Path(dir_okay=False) if flag.path else None
        settings: dict[str, Any] = {"metavar": flag.metavar or None, "help": flag.help,
                                    "show_default": flag.show_default}
        if default is dataclasses.MISSING:
            settings["required"] = True
        elif isinstance(default, bool):
            settings["is_flag"] = True
        elif isinstance(default, tuple) or flag.param != name:
            settings["multiple"] = True
        elif isinstance(default, int) and flag.bounds:
            kind, settings["default"] = click.IntRange(int(flag.bounds[0]), int(flag.bounds[1])), default
        elif isinstance(default, float) and flag.bounds:
            kind, settings["default"] = click.FloatRange(*flag.bounds), default
        else:
            settings["default"] = default
        params.append(click.Option([flag.name, flag.param], type=kind, **settings))
    return params


def run_gate(params: Mapping[str, Any]) -> None:
    """Read the gate's options from its command's parameters (``GateOptions.from_flags``), load them, and
    serve until stopped."""
    from claude_bottle.gate.audit import AuditLog
    from claude_bottle.gate.options import GateOptions
    from claude_bottle.gate.server import serve
    from claude_bottle.gate.settings import loopback

    options = GateOptions.from_flags(params)
    options.check()
    settings = options.settings()
    settings.ssl_context()  # fail now, not on the first request, if an extra CA cannot be loaded
    if settings.upstream.scheme == "http" and not loopback(settings.upstream.host):
        click.echo(f"warning: --upstream {options.upstream} is plain HTTP: the credential crosses the network "
                   "unencrypted", err=True)
    with audit_stream(options.audit_log) as stream:
        serve(settings, AuditLog(stream, secrets=settings.injected_secrets),
              ca_cert_out=options.ca_cert_out,
              lifeline=sys.stdin.fileno() if options.exit_with_stdin else None, silence=options.stdin_heartbeat)


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
