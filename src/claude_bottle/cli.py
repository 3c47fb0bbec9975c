"""The command line. The only place a BottleError becomes a message and an exit code."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import pathlib
import subprocess
import sys
import traceback
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, TextIO

import click

from claude_bottle import __version__
from claude_bottle.errors import EXIT_FAILURE, BottleError, ConfigError

if TYPE_CHECKING:  # the gate image runs this module without the Docker SDK: import the bottle side lazily
    from docker.models.containers import Container

    from claude_bottle.agent.schema import AgentConfig
    from claude_bottle.launch import Launch
    from claude_bottle.records import RunRecord

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
@click.option("--allow-tcp", multiple=True, metavar="PATTERN",
              help="Let tunnels to this HOST:PORT carry any TCP, not only TLS naming the host (e.g. SSH). "
                   "Implies --allow. Repeatable.")
@click.option("--allow-private", multiple=True, metavar="CIDR",
              help="Let the proxy reach these non-public addresses (refused by default). Repeatable.")
@click.option("--allow-api-path", multiple=True, metavar="[METHOD] PATH",
              help="Forward this API path too, besides the ones Claude Code uses. Repeatable.")
@click.option("--allow-server-tool", multiple=True, metavar="FAMILY",
              help="Let Messages requests use this provider-side server tool, e.g. web_fetch (refused by "
                   "default, except the web search Claude Code uses). Repeatable.")
@click.option("--egress-rule", multiple=True, metavar="'HOST allow|deny METHOD PATH'",
              help="A method and path rule for an inspected host, e.g. 'api.github.com allow GET /repos/**'; the "
                   "host joins the allowlist. Repeatable.")
@click.option("--no-inspect", multiple=True, metavar="HOST",
              help="Tunnel this host opaquely (certificate pinning, mTLS), under the TLS name check only; it "
                   "joins the allowlist. Weaker: no rules, no DLP. Repeatable.")
@click.option("--dlp-rule", multiple=True, metavar="'NAME REGEX'",
              help="An extra DLP rule refusing requests that match REGEX (bounded length). Repeatable.")
@click.option("--dlp-off", multiple=True, metavar="NAME", help="Turn a built-in DLP rule off. Repeatable.")
@click.option("--credential-route", multiple=True, metavar="'NAME SCHEME USERNAME|- SENTINEL HOST[,HOST...]'",
              help="Hold a credential for these hosts (scheme bearer, token or basic): injected on inspected "
                   "requests to them in place of the client's; SENTINEL, the bottle's stand-in, is refused "
                   "elsewhere. Its value is read from standard input after the token (--token-file -), one "
                   "line per route in order. Repeatable.")
@click.option("--extra-ca", multiple=True, metavar="PATH", type=click.Path(dir_okay=False),
              help="Also trust these CA certificates (PEM) toward the upstream, e.g. for TLS inspection.")
@click.option("--audit-log", metavar="PATH", help="Append one JSON line per decision here; '-' for stderr.")
@click.option("--ca-cert-out", metavar="PATH", type=click.Path(dir_okay=False),
              help="Write the certificate of the gate's CA (public; its key stays in the gate's memory) here "
                   "at start, for clients to trust.")
@click.option("--max-tunnels", type=click.IntRange(1, 100_000), default=256, show_default=True,
              help="Concurrent proxy tunnels and forwarded requests.")
@click.option("--max-connections", type=click.IntRange(1, 1_000_000), default=512, show_default=True,
              help="Open client connections per listener; more are answered 503 and closed.")
@click.option("--idle-timeout", type=click.FloatRange(1, 86_400), default=600, show_default=True,
              help="Seconds without traffic before a stream or tunnel is closed.")
@click.option("--drain-seconds", type=click.FloatRange(0, 3600), default=10, show_default=True,
              help="On SIGTERM, how long in-flight requests may finish.")
@click.option("--learn", is_flag=True,
              help="Learn mode: let destinations outside the allowlist through and audit them as would_deny "
                   "(never the upstream's host; the address guard, rules and DLP still apply).")
@click.option("--control-socket", metavar="PATH", type=click.Path(dir_okay=False),
              help="A unix socket (mode 0600) through which the allowlist can be changed while the gate runs "
                   "(python -m claude_bottle.gate.control PATH allow|deny|show HOST).")
def gate(
    api_listen: str, proxy_listen: str, upstream: str, token_file: str, allow: tuple[str, ...],
    allow_tcp: tuple[str, ...], allow_private: tuple[str, ...], allow_api_path: tuple[str, ...],
    allow_server_tool: tuple[str, ...], egress_rule: tuple[str, ...], no_inspect: tuple[str, ...],
    dlp_rule: tuple[str, ...], dlp_off: tuple[str, ...], credential_route: tuple[str, ...],
    extra_ca: tuple[str, ...], audit_log: str | None,
    ca_cert_out: str | None, max_tunnels: int, max_connections: int, idle_timeout: float, drain_seconds: float,
    learn: bool, control_socket: str | None,
) -> None:
    """Run the gate: hold the credential, forward API calls, filter egress.

    The token is read once from --token-file and kept in memory only. Clients never see it: their own
    credentials are stripped and the real one is added toward the upstream. The gate makes a CA of its own
    at start, limited to the allowed hosts; it prints the CA's certificate (and --ca-cert-out writes it).
    """
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
    with _audit_stream(audit_log) as stream:
        serve(config, AuditLog(stream, secrets=config.injected_secrets),
              ca_cert_out=Path(ca_cert_out) if ca_cert_out else None)


@cli.command("stub-upstream", context_settings=CONTEXT)
@click.option("--listen", default="127.0.0.1:0", show_default=True, metavar="HOST:PORT")
@click.option("--text", default=None, help="The answer text.")
@click.option("--log", is_flag=True, help="Print each request (with its headers) as a JSON line.")
@click.option("--tls", "tls_file", default=None, metavar="PATH", type=click.Path(dir_okay=False),
              help="Serve HTTPS with the certificate chain and private key in this PEM file.")
def stub_upstream(listen: str, text: str | None, log: bool, tls_file: str | None) -> None:
    """Serve a stand-in for the Anthropic Messages API (for tests, benchmarks and verify).

    It answers /v1/messages with a fixed text, streaming or not, and spends no tokens.
    """
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


# ---- the bottle -------------------------------------------------------------------------------------------

def _progress(message: str) -> None:
    click.echo(message, err=True)


def _with_runtime(agent: AgentConfig, runtime: str | None) -> AgentConfig:
    """The agent, with --runtime (checked like the config key) in place of its own runtime."""
    from claude_bottle.agent.schema import check_runtime_name

    if runtime is None:
        return agent
    check_runtime_name(runtime, lambda key, problem: ConfigError(f"--runtime: {problem}"))
    return dataclasses.replace(agent, runtime=runtime)


def _launch(agent_name: str | None, workspace: str | None, upstream: str | None,
            upstream_network: tuple[str, ...], runtime: str | None = None, learn: bool = False) -> Launch:
    from claude_bottle import tokens
    from claude_bottle.agent.load import load_agent
    from claude_bottle.gate.settings import parse_upstream
    from claude_bottle.launch import Launch, workspace_of

    path = workspace_of(workspace)
    agent = _with_runtime(load_agent(agent_name, path), runtime)
    parsed_upstream = parse_upstream(upstream) if upstream is not None else None
    credential, _ = tokens.find()
    if learn:
        _progress("learn mode: destinations outside the allowlist are let through and recorded as would_deny; "
                  "`claude-bottle policy suggest` turns the run into an allowlist")
    return Launch(agent, path, credential, parsed_upstream, upstream_network, learn=learn,
                  routes=tokens.routes_for(agent.credentials))


_agent_argument = click.argument("agent", required=False)
_workspace_option = click.option("--workspace", metavar="DIR", help="Mount DIR at /workspace (default: here).")
_upstream_option = click.option("--upstream", metavar="URL", default=None,
                                help="Advanced: point the gate at another Anthropic-compatible API.")
_runtime_option = click.option(
    "--runtime", metavar="NAME", default=None,
    help="The bottle's OCI runtime, e.g. runsc (gVisor), instead of the agent's (default: the engine's).")
_learn_option = click.option(
    "--learn", is_flag=True,
    help="Learn mode: let destinations outside the allowlist through and record them as would_deny (the address "
         "guard, credential hosts and DLP still apply); then `claude-bottle policy suggest`.")
_upstream_network_option = click.option(
    "--upstream-network", multiple=True, metavar="NETWORK", hidden=True,
    help="Join the gate to this Docker network, to reach an upstream running there.")


@cli.command(context_settings=CONTEXT)
@_agent_argument
@_workspace_option
@_upstream_option
@_upstream_network_option
@_runtime_option
@_learn_option
@click.option("--keep", is_flag=True, help="Keep the stopped containers and networks for inspection.")
def start(agent: str | None, workspace: str | None, upstream: str | None, upstream_network: tuple[str, ...],
          runtime: str | None, learn: bool, keep: bool) -> None:
    """Start Claude Code interactively in a bottle, in this terminal.

    AGENT names a config in the user's agents folder; without it the project's .claude-bottle.toml is used,
    or the defaults. On exit or Ctrl-C everything of the run is removed (unless --keep).
    """
    from claude_bottle.launch import run_interactive

    sys.exit(run_interactive(_launch(agent, workspace, upstream, upstream_network, runtime, learn), _progress,
                             keep))


@cli.command(context_settings=CONTEXT)
@_agent_argument
@click.option("-p", "--prompt", required=True, help="The prompt for claude -p.")
@_workspace_option
@_upstream_option
@_upstream_network_option
@_runtime_option
@_learn_option
def run(agent: str | None, prompt: str, workspace: str | None, upstream: str | None,
        upstream_network: tuple[str, ...], runtime: str | None, learn: bool) -> None:
    """Run Claude Code headless (claude -p) in a bottle; prints its output and exits with its code."""
    from claude_bottle.launch import run_headless

    sys.exit(run_headless(_launch(agent, workspace, upstream, upstream_network, runtime, learn), prompt,
                         _progress))


@cli.command(context_settings=CONTEXT)
@_agent_argument
@_workspace_option
def build(agent: str | None, workspace: str | None) -> None:
    """Build the bottle and gate images (only what changed), showing progress."""
    from claude_bottle.agent.load import load_agent
    from claude_bottle.launch import build_images, workspace_of
    from claude_bottle.runtime import engine

    config = load_agent(agent, workspace_of(workspace))
    bottle, gate_image = build_images(engine.connect(), config, _progress)
    click.echo(f"bottle image: {bottle}\ngate image:   {gate_image}")


@cli.command("trust", context_settings=CONTEXT)
@click.argument("directory", required=False, metavar="[DIR]")
@click.option("--yes", is_flag=True, help="Approve what is shown without asking (review it first).")
def trust_(directory: str | None, yes: bool) -> None:
    """Review and approve a workspace (default: here) on the host.

    Shows its .claude-bottle.toml with the keys it sets, and the files that can run code on your machine which
    bottles changed. Once you confirm (a prompt on a terminal, else --yes), `start` and `run` use exactly this
    project file, and the changes count as reviewed.
    """
    from claude_bottle import trust
    from claude_bottle.agent.project import project_summary, read_project_file
    from claude_bottle.launch import workspace_of
    from claude_bottle.workspace import printable

    path = workspace_of(directory)
    project = read_project_file(path)
    changes = trust.unreviewed(path)
    new_project = project is not None and trust.approved_digest(path) != project.digest
    if project is not None:
        summary = project_summary(project)  # a key a project file may not set fails here, before approval
        click.echo(f"{project.path} (sha256 {project.digest[:16]}, "
                   f"{'not approved yet' if new_project else 'approved'}):")
        click.echo("-" * 60 + f"\n{printable(project.text).rstrip()}\n" + "-" * 60)
        click.echo("It sets:\n" + "\n".join(f"  {printable(line)}" for line in summary))
    if changes:
        click.echo(f"Bottles changed these files in {path}, which can run code on your machine:\n"
                   f"{trust.listing(changes)}\nLook at them (git diff, an editor that does not run them) first.")
    if not new_project and not changes:
        click.echo(f"nothing to approve in {path}")
        return
    if not yes:
        if not sys.stdin.isatty():
            raise ConfigError(f"review what is shown above, then run `claude-bottle trust {path} --yes` "
                              "(no terminal to ask on)")
        if not click.confirm("Trust this?", default=False):
            raise ConfigError("not approved; nothing changed")
    if project is not None and new_project:
        trust.approve(path, project.digest)
    trust.clear_review(path, changes)
    click.echo(f"approved: {path}")


@cli.command(context_settings=CONTEXT)
@click.argument("name", required=False)
@click.option("--stdin", "from_stdin", is_flag=True, help="Read the token from standard input.")
def login(name: str | None, from_stdin: bool) -> None:
    """Store your token (from `claude setup-token`, or an API key) in the OS keyring or a 0600 file.

    With NAME, store the value of the credential route [credentials.NAME] instead (docs/credentials.md)."""
    from claude_bottle import tokens
    from claude_bottle.credentials import Credential

    what = f"Value for credential {name}" if name else "Token (from `claude setup-token`)"
    text = sys.stdin.read() if from_stdin or not sys.stdin.isatty() else click.prompt(what, hide_input=True)
    where = tokens.store_route(name, text) if name else tokens.store(Credential.parse(text, "the token given"))
    click.echo(f"stored in {where}")


@cli.command(context_settings=CONTEXT)
@click.argument("name", required=False)
def logout(name: str | None) -> None:
    """Forget the stored token (with NAME: the stored value of credential NAME)."""
    from claude_bottle import tokens

    if name:
        removed = tokens.remove_route(name)
        click.echo(f"removed from {', '.join(removed)}" if removed else f"no stored value for {name}")
        return

    removed = tokens.remove()
    click.echo(f"removed from {', '.join(removed)}" if removed else "no stored token")


@cli.command("ls", context_settings=CONTEXT)
@click.option("--json", "as_json", is_flag=True, help="One JSON object per run.")
def list_runs(as_json: bool) -> None:
    """List running bottles."""
    from claude_bottle.runtime import engine
    from claude_bottle.runtime.bottle import runs

    found = runs(engine.connect())
    if as_json:
        click.echo(json.dumps(found, indent=2))
    elif not found:
        click.echo("no bottles")
    else:
        click.echo(f"{'AGENT':16} {'RUN':24} {'STATUS':10} WORKSPACE")
        for r in found:
            click.echo(f"{r['agent']:16} {r['run']:24} {r['status']:10} {r['workspace']}")


@cli.command(context_settings=CONTEXT)
@_agent_argument
@click.option("--all", "stop_all", is_flag=True,
              help="Stop every bottle, and remove the internal networks kept for later runs.")
def stop(agent: str | None, stop_all: bool) -> None:
    """Stop bottles and remove their containers (their Claude state volume stays); on Docker their internal
    networks are kept for later runs, until --all."""
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


def _print_runs(found: list[RunRecord], as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps([dataclasses.asdict(r) for r in found], indent=2))
    elif not found:
        click.echo("no runs recorded yet: a run's audit is kept once it ends")
    else:
        click.echo(f"{'RUN':24} {'AGENT':16} {'STARTED':20} {'ENDED':20} {'LINES':>7} WORKSPACE")
        for r in found:
            click.echo(f"{r.run:24} {r.agent:16} {r.started:20} {r.ended:20} {r.lines:7} {r.workspace}")


def _audit(agent: str | None, workspace: str | None, run_id: str | None, follow: bool
           ) -> tuple[Iterator[dict[str, Any]], str, str]:
    """The audit entries ``logs`` and ``policy suggest`` read: a running bottle's (this workspace's, or
    ``agent``'s, or run ``run_id``), else the last recorded run of those. Also the run's agent and id."""
    from pathlib import Path

    from claude_bottle import records
    from claude_bottle.errors import DockerError
    from claude_bottle.runtime import engine
    from claude_bottle.runtime.bottle import AGENT_LABEL, running_run, runs

    # with AGENT and no --workspace, any workspace of that agent's
    place = None if agent and workspace is None else Path(workspace or os.getcwd()).expanduser().resolve()
    live, client = None, None
    with contextlib.suppress(DockerError):  # no engine: no running bottle, the recorded runs still show
        client = engine.connect()
        live = (run_id if any(r["run"] == run_id for r in runs(client)) else None) if run_id else \
            running_run(client, agent, place)
    if live and client is not None:
        gate = client.containers.get(f"claude-bottle-{live}-gate")
        lines: Iterator[str] = (chunk.decode("utf-8", "replace") for chunk in
                                gate.logs(stdout=False, stderr=True, stream=True, follow=follow))
        owner, source = gate.labels.get(AGENT_LABEL, agent or ""), live
    elif follow:
        raise ConfigError("--follow shows a running bottle's decisions as they come, and none is running here; "
                          "without --follow, the last run's are shown")
    else:
        record = records.find(run_id) if run_id else records.latest(agent, place)
        lines, owner, source = records.audit_lines(record), record.agent, record.run
    entries = (json.loads(text) for text in (line.strip() for line in lines) if text.startswith("{"))
    return entries, owner, source


@cli.command(context_settings=CONTEXT)
@_agent_argument
@click.option("--workspace", metavar="DIR", help="The workspace whose bottle or last run to show (default: here).")
@click.option("--run", "run_id", metavar="ID", help="This run, running or recorded (see --runs).")
@click.option("--runs", "list_recorded", is_flag=True, help="List the recorded runs, oldest first.")
@click.option("--egress", is_flag=True, help="Only the proxy's decisions (not the API route's).")
@click.option("--follow", "-f", is_flag=True,
              help="Keep printing new decisions (a running bottle only), with the command that allows each "
                   "destination the allowlist refused.")
@click.option("--json", "as_json", is_flag=True, help="The raw JSON audit lines.")
def logs(agent: str | None, workspace: str | None, run_id: str | None, list_recorded: bool, egress: bool,
         follow: bool, as_json: bool) -> None:
    """Show the gate's decisions: what was forwarded, what was refused and why.

    Without options: the running bottle of this workspace, else its last run (every run's audit is kept on
    the host when it ends). AGENT: that agent's running bottle, else its last run. --runs lists what is kept.
    A table (time, decision, method, host, path, rule, reason), coloured on a terminal; would_deny marks what
    learn mode let through.
    """
    from claude_bottle import logview, records

    if list_recorded:
        _print_runs(records.recorded(), as_json)
        return
    entries, owner, _ = _audit(agent, workspace, run_id, follow)
    colour = sys.stdout.isatty() and "NO_COLOR" not in os.environ
    shown = 0
    for entry in entries:
        if egress and entry.get("listener") != "proxy":
            continue
        if as_json:
            click.echo(json.dumps(entry, ensure_ascii=False))
            continue
        if not shown:
            click.echo(logview.header())
        shown += 1
        click.echo(logview.row(entry, colour))
        offer = logview.offer(entry, owner) if follow else None
        if offer:
            click.echo(offer)


def _gate_for(agent: str | None, workspace: str | None) -> Container:
    from pathlib import Path

    from claude_bottle.runtime import engine
    from claude_bottle.runtime.bottle import gate_of

    return gate_of(engine.connect(), agent, Path(workspace or os.getcwd()).expanduser().resolve())


def _agent_and_entry(words: tuple[str, ...], ctx: click.Context) -> tuple[str | None, str]:
    if len(words) not in (1, 2):
        raise click.UsageError(f"give HOST[:PORT], optionally after the AGENT: claude-bottle {ctx.info_name} "
                               "[AGENT] HOST", ctx)
    return (words[0] if len(words) == 2 else None), words[-1]


def _agent_allowlist(name: str) -> tuple[str, ...]:
    """What the agent file ``name`` lets the bottle reach (its allowlist and raw-TCP targets); empty when there
    is no such file yet."""
    from pathlib import Path

    from claude_bottle.agent.load import load_agent
    from claude_bottle.paths import agents_dir

    if not (agents_dir() / f"{name}.toml").exists():
        return ()
    agent = load_agent(name, Path.cwd())
    return agent.egress_allowlist.texts() + agent.allow_tcp.texts()


def _agent_file(name: str) -> pathlib.Path:
    from claude_bottle.agent.load import AGENT_NAME
    from claude_bottle.paths import agents_dir

    if not AGENT_NAME.fullmatch(name):
        raise ConfigError(f"agent name {name!r}: use lower-case letters, digits, '-' and '_' (up to 40)")
    return agents_dir() / f"{name}.toml"


def _add_to_agent(name: str, additions: str, yes: bool) -> None:
    """Append ``additions`` (TOML tables) to the agent file ``name`` (created if missing)."""
    path = _agent_file(name)
    before = path.read_text() if path.exists() else ""
    _rewrite_agent(name, before, (before or "version = 1\n") + additions, yes)


def _rewrite_agent(name: str, before: str, after: str, yes: bool) -> None:
    """Replace the agent file ``name`` (whose text is ``before``) with ``after``, once it parses as an agent,
    after showing the diff and asking (or ``yes``); else nothing is written."""
    import tomllib

    from claude_bottle import suggest
    from claude_bottle.agent.schema import parse_agent

    path = _agent_file(name)
    try:
        parse_agent(name, tomllib.loads(after), str(path))
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: would not parse after the change ({exc}); nothing written") from None
    click.echo(suggest.diff(before, after, str(path)), nl=False)
    if not yes:
        if not sys.stdin.isatty():
            raise ConfigError("review the change above, then run again with --yes (no terminal to ask on)")
        if not click.confirm(f"Write {path}?", default=False):
            raise ConfigError("not written")
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    partial.write_text(after)
    os.replace(partial, path)
    click.echo(f"wrote {path}")


@cli.command(context_settings=CONTEXT)
@click.argument("words", nargs=-1, metavar="[AGENT] HOST[:PORT]")
@click.option("--workspace", metavar="DIR", help="Prefer the bottle of this workspace (default: here).")
@click.option("--save", is_flag=True, help="Also add it to the agent's file (shows the change first).")
@click.option("--yes", is_flag=True, help="With --save: write without asking.")
@click.pass_context
def allow(ctx: click.Context, words: tuple[str, ...], workspace: str | None, save: bool, yes: bool) -> None:
    """Allow a destination in a running bottle, at once, without restarting it.

    HOST[:PORT] as in an agent's allow list (*.example.com, host:8443). The change reaches the gate through
    the container engine (a channel the bottle cannot reach) and the bottle's /etc/claude-bottle/policy.toml.
    """
    from claude_bottle import suggest
    from claude_bottle.runtime.bottle import AGENT_LABEL, control_gate

    agent, entry = _agent_and_entry(words, ctx)
    gate = _gate_for(agent, workspace)
    reply = control_gate(gate, "allow", entry)
    click.echo(f"{reply['message']} in {gate.name.removeprefix('claude-bottle-').removesuffix('-gate')}")
    if save:
        name = gate.labels.get(AGENT_LABEL, agent or "")
        if reply["message"].removeprefix("allowed ") in _agent_allowlist(name):
            click.echo(f"agent {name} already lists it")
            return
        _add_to_agent(name, suggest.host_table(reply["message"].removeprefix("allowed "),
                                               "added by `claude-bottle allow --save`"), yes)


@cli.command(context_settings=CONTEXT)
@click.argument("words", nargs=-1, metavar="[AGENT] HOST[:PORT]")
@click.option("--workspace", metavar="DIR", help="Prefer the bottle of this workspace (default: here).")
@click.option("--save", is_flag=True, help="Also remove it from the agent's file (shows the change first).")
@click.option("--yes", is_flag=True, help="With --save: write without asking.")
@click.pass_context
def deny(ctx: click.Context, words: tuple[str, ...], workspace: str | None, save: bool, yes: bool) -> None:
    """Refuse a destination in a running bottle from now on (even in learn mode, even under a wider pattern);
    tunnels already open stay."""
    from claude_bottle import suggest
    from claude_bottle.runtime.bottle import AGENT_LABEL, control_gate

    agent, entry = _agent_and_entry(words, ctx)
    gate = _gate_for(agent, workspace)
    reply = control_gate(gate, "deny", entry)
    click.echo(f"{reply['message']} in {gate.name.removeprefix('claude-bottle-').removesuffix('-gate')}")
    if not save:
        return
    name, pattern = gate.labels.get(AGENT_LABEL, agent or ""), reply["message"].removeprefix("denied ")
    path = _agent_file(name)
    before = path.read_text() if path.exists() else ""
    try:
        after = suggest.without_entry(before, pattern)
    except ValueError as exc:
        raise ConfigError(f"{path}: {exc}; remove {pattern} from it by hand") from None
    if after == before:
        raise ConfigError(f"{path} lists no entry {pattern} (in allow or as an [[egress]] host); it may come from "
                          "a preset or another spelling: edit the file by hand")
    _rewrite_agent(name, before, after, yes)


@cli.group(context_settings=CONTEXT)
def policy() -> None:
    """Allowlists from what runs did."""


@policy.command("suggest", context_settings=CONTEXT)
@_agent_argument
@click.option("--workspace", metavar="DIR", help="The workspace whose bottle or last run to read (default: here).")
@click.option("--run", "run_id", metavar="ID", help="This run, running or recorded (see `logs --runs`).")
@click.option("--write", "write_to", metavar="AGENT", help="Add what the agent does not allow yet to its file.")
@click.option("--yes", is_flag=True, help="With --write: write without asking.")
def policy_suggest(agent: str | None, workspace: str | None, run_id: str | None, write_to: str | None,
                   yes: bool) -> None:
    """Print an allowlist (agent-file TOML) from a run's audit: its hosts, with method and path rules where
    the gate read the requests. Run with --learn first to let everything the task needs through."""
    from claude_bottle import suggest
    from claude_bottle.policy.hosts import Allowlist

    entries, _, source = _audit(agent, workspace, run_id, False)
    found = suggest.suggest(entries)
    if write_to is None:
        click.echo(suggest.render(found, f"run {source}"), nl=False)
        return
    added = suggest.additions(found, Allowlist.parse(_agent_allowlist(write_to)), f"run {source}")
    if not added:
        click.echo(f"agent {write_to} already allows every destination of run {source}")
        return
    _add_to_agent(write_to, added, yes)


class _AfterDoubleDash(click.Command):
    """Everything after the first ``--`` is the command to run, whatever it looks like; click would take its
    first word as the optional AGENT."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if "--" in args:
            ctx.meta["command"] = args[args.index("--") + 1:]
            args = args[:args.index("--")]
        return super().parse_args(ctx, args)


@cli.command("exec", cls=_AfterDoubleDash, context_settings=CONTEXT)
@_agent_argument
@click.option("--workspace", metavar="DIR", help="Prefer the bottle of this workspace (default: here).")
@click.pass_context
def exec_(ctx: click.Context, agent: str | None, workspace: str | None) -> None:
    """Run a command inside a running bottle, as its user: claude-bottle exec [AGENT] -- CMD...

    Without AGENT: the bottle of this workspace, or the only one running.
    """
    from pathlib import Path

    from claude_bottle.launch import docker_cli
    from claude_bottle.runtime import engine
    from claude_bottle.runtime.bottle import bottle_of

    command = ctx.meta.get("command")
    if command is None:
        raise click.UsageError("put the command after --: claude-bottle exec [AGENT] -- CMD...", ctx)
    if not command:
        raise click.UsageError("no command after --: claude-bottle exec [AGENT] -- CMD...", ctx)
    place = Path(workspace or os.getcwd()).expanduser().resolve()
    bottle = bottle_of(engine.connect(), agent, place)
    terminal = ["-it"] if sys.stdin.isatty() else ["-i"]
    # no -u: docker exec runs as the container's own user, the one the bottle was started as
    sys.exit(subprocess.call([docker_cli(), "exec", *terminal, bottle.name, *command]))


@cli.command(context_settings=CONTEXT)
@_agent_argument
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON.")
@_runtime_option
def verify(agent: str | None, as_json: bool, runtime: str | None) -> None:
    """Prove the isolation: attack a bottle of AGENT from inside and report what got through.

    The bottle is the agent's own, with a throwaway credential, a stub Messages API as its upstream (no
    Anthropic account needed, no tokens spent) and a scratch workspace. Exits 1 if any attack succeeded.
    """
    from pathlib import Path

    from claude_bottle import verify as verification
    from claude_bottle.agent.load import load_agent

    config = _with_runtime(load_agent(agent, Path.cwd()), runtime)
    outcomes = verification.verify(config, _progress)
    click.echo(verification.as_json(config, outcomes) if as_json else verification.report(outcomes))
    sys.exit(1 if any(not o.blocked for o in outcomes) else 0)


@cli.command(context_settings=CONTEXT)
def doctor() -> None:
    """Check the container engine (Docker or Podman), its OCI runtimes, the token and the images."""
    from claude_bottle import tokens
    from claude_bottle.agent.schema import AgentConfig
    from claude_bottle.launch import build_inputs
    from claude_bottle.runtime import engine, images

    problems = 0

    def report(ok: bool, text: str) -> None:
        nonlocal problems
        problems += not ok
        click.echo(f"{'ok ' if ok else 'NO '} {text}")

    try:
        client = engine.connect()
        about = engine.describe(client)
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
        client = None
    try:
        _, source = tokens.find()
        report(True, f"token found in {source}")
    except BottleError as exc:
        report(False, str(exc))
    if client is not None:
        inputs = build_inputs(AgentConfig())
        for spec in (images.bottle_spec(inputs), images.gate_spec(inputs)):
            built = images.image_exists(client, spec.tag)
            report(built, f"{spec.name} image {spec.tag} {'built' if built else 'not built: run claude-bottle build'}")
    sys.exit(1 if problems else 0)


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
