"""The command line. The only place a BottleError becomes a message and an exit code."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import traceback
from collections.abc import Iterator
from typing import TextIO

import click

from claude_bottle import __version__
from claude_bottle.credentials import read_token_file
from claude_bottle.errors import EXIT_FAILURE, BottleError, ConfigError

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


@click.group(context_settings=CONTEXT)
@click.version_option(__version__, prog_name="claude-bottle")
@click.option("--debug", is_flag=True, help="Show tracebacks for errors.")
@click.pass_context
def cli(ctx: click.Context, debug: bool) -> None:
    """Run Claude Code where it can neither read your credential nor reach what you did not allow."""
    ctx.obj = {"debug": debug}


@contextlib.contextmanager
def _audit_stream(path: str | None) -> Iterator[TextIO | None]:
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


@cli.command(context_settings=CONTEXT)
@click.option("--api-listen", required=True, metavar="HOST:PORT",
              help="Where ANTHROPIC_BASE_URL points: the credential-injecting API route.")
@click.option("--proxy-listen", required=True, metavar="HOST:PORT",
              help="Where HTTPS_PROXY/HTTP_PROXY point: the allowlisting egress proxy.")
@click.option("--upstream", default="https://api.anthropic.com", show_default=True, metavar="URL",
              help="The Anthropic-compatible API the API route forwards to.")
@click.option("--token-file", required=True, metavar="PATH",
              help="File holding the OAuth token or API key (mode 0600); '-' reads standard input.")
@click.option("--allow", "allow", multiple=True, metavar="PATTERN",
              help="Allow proxy traffic to HOST or *.SUFFIX, optionally :PORT (default ports 443 and 80). "
                   "Repeatable.")
@click.option("--allow-private", multiple=True, metavar="CIDR",
              help="Let the proxy reach these non-public addresses (refused by default). Repeatable.")
@click.option("--allow-api-path", multiple=True, metavar="[METHOD] PATH",
              help="Forward this API path too, besides the ones Claude Code uses. Repeatable.")
@click.option("--extra-ca", multiple=True, metavar="PATH", type=click.Path(dir_okay=False),
              help="Also trust these CA certificates (PEM) toward the upstream, e.g. for TLS inspection.")
@click.option("--audit-log", metavar="PATH", help="Append one JSON line per decision here; '-' for stderr.")
@click.option("--max-tunnels", type=click.IntRange(1, 100_000), default=256, show_default=True,
              help="Concurrent proxy tunnels and forwarded requests.")
@click.option("--idle-timeout", type=click.FloatRange(1, 86_400), default=600, show_default=True,
              help="Seconds without traffic before a stream or tunnel is closed.")
@click.option("--drain-seconds", type=click.FloatRange(0, 3600), default=10, show_default=True,
              help="On SIGTERM, how long in-flight requests may finish.")
def gate(
    api_listen: str, proxy_listen: str, upstream: str, token_file: str, allow: tuple[str, ...],
    allow_private: tuple[str, ...], allow_api_path: tuple[str, ...], extra_ca: tuple[str, ...],
    audit_log: str | None, max_tunnels: int, idle_timeout: float, drain_seconds: float,
) -> None:
    """Run the gate: hold the credential, forward API calls, filter egress.

    The token is read once from --token-file and kept in memory only. Clients never see it: their own
    credentials are stripped and the real one is added toward the upstream.
    """
    from pathlib import Path

    from claude_bottle.gate import config as gc
    from claude_bottle.gate.audit import AuditLog
    from claude_bottle.gate.server import run

    config = gc.GateConfig(
        api_listen=gc.parse_listen(api_listen, "--api-listen"),
        proxy_listen=gc.parse_listen(proxy_listen, "--proxy-listen"),
        upstream=gc.parse_upstream(upstream),
        allowlist=gc.parse_allowlist(allow),
        allow_private=gc.parse_networks(allow_private),
        api_policy=gc.parse_api_paths(allow_api_path),
        extra_ca_files=tuple(Path(p) for p in extra_ca),
        credential=read_token_file(token_file),
        limits=gc.Limits(max_tunnels=max_tunnels, idle_timeout=idle_timeout, drain_seconds=drain_seconds),
    )
    config.ssl_context()  # fail now, not on the first request, if an extra CA cannot be loaded
    if config.upstream.scheme == "http" and not gc.loopback(config.upstream.host):
        click.echo(f"warning: --upstream {upstream} is plain HTTP: the credential crosses the network "
                   "unencrypted", err=True)
    with _audit_stream(audit_log) as stream:
        asyncio.run(run(config, AuditLog(stream, secrets=(config.credential.secret,))))


@cli.command("stub-upstream", context_settings=CONTEXT)
@click.option("--listen", default="127.0.0.1:0", show_default=True, metavar="HOST:PORT")
@click.option("--text", default=None, help="The answer text.")
def stub_upstream(listen: str, text: str | None) -> None:
    """Serve a stand-in for the Anthropic Messages API (for tests, benchmarks and verify).

    It answers /v1/messages with a fixed text, streaming or not, and spends no tokens.
    """
    from claude_bottle.gate.config import parse_listen
    from claude_bottle.stub import DEFAULT_TEXT, serve

    endpoint = parse_listen(listen, "--listen")
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(endpoint.host, endpoint.port, text or DEFAULT_TEXT))


def main() -> None:
    """Entry point: run the command; a BottleError becomes one line on stderr and its exit code."""
    debug = "--debug" in sys.argv[1:]
    try:
        cli.main(standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except BottleError as exc:
        if debug:
            traceback.print_exc()
        click.echo(f"claude-bottle: error: {exc}", err=True)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception:
        traceback.print_exc()
        click.echo("claude-bottle: internal error (above); please report it", err=True)
        sys.exit(EXIT_FAILURE)
