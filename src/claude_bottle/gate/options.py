"""The host-to-gate contract: one frozen ``GateOptions``, the only thing that crosses from the host to a gate.

The host (``runtime``) builds it and turns it into the gate's arguments (``args``) and standard input
(``stdin``); the ``gate`` command parses those back (``from_flags``) and loads them into the settings the gate
runs with (``settings``, the one loader); the tests' gate fixtures build it too. Secrets (the Anthropic
credential, the credential routes' values) travel on standard input only, never in the arguments, which any
process on the host may read. The fields hold parsed values (an ``Allowlist``, an ``Upstream``, networks,
paths); their text form exists only on the command line: written by ``args``, read back by ``from_flags``.

Adding a gate option: a field here (with its ``Flag``: the command line is made from it), its use where
``settings`` loads it (or in the gate), and a test; ``tests/unit/test_gate_options.py`` checks the round trip
of every field.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from claude_bottle.credentials import Credential
from claude_bottle.errors import ConfigError
from claude_bottle.gate.ask import ASK_TIMEOUT_BOUNDS
from claude_bottle.gate.ask import DEFAULT_LIMIT as DEFAULT_ASK_LIMIT
from claude_bottle.gate.ask import DEFAULT_TIMEOUT as DEFAULT_ASK_TIMEOUT
from claude_bottle.gate.dlp import DlpPolicy
from claude_bottle.gate.routes import CredentialRoute
from claude_bottle.gate.settings import (
    DEFAULT_UPSTREAM,
    Endpoint,
    GateSettings,
    Limits,
    Upstream,
    parse_allowlist,
    parse_dlp,
    parse_egress_rules,
    parse_extra_api_paths,
    parse_listen,
    parse_mcp_servers,
    parse_networks,
    parse_routes,
    parse_server_tools,
    parse_upstream,
    read_secrets,
)
from claude_bottle.gate.upstream_proxy import UpstreamProxy
from claude_bottle.policy.addresses import IPNetwork
from claude_bottle.policy.decide import CLAUDE_CODE_API_PATHS, ApiPolicy
from claude_bottle.policy.hosts import Allowlist, HostPattern
from claude_bottle.policy.mcp import McpServerRules
from claude_bottle.policy.messages import MessagesPolicy
from claude_bottle.policy.rules import RequestPolicy

TOKEN_FROM_STDIN = "-"
ANTHROPIC_API = parse_upstream(DEFAULT_UPSTREAM)


@dataclass(frozen=True)
class Flag:
    """How a field of ``GateOptions`` is written on the gate's command line. ``bounds``: the range of a number;
    ``path``: a file's path (not a folder); ``show_default``: the help shows the default."""

    name: str
    help: str
    metavar: str = ""
    bounds: tuple[float, float] | None = None
    path: bool = False
    show_default: bool = False

    @property
    def param(self) -> str:
        """The parameter name the command gives the flag's value (``--allow-tcp``: ``allow_tcp``)."""
        return self.name.removeprefix("--").replace("-", "_")


def _flags(*flags: Flag) -> dict[str, tuple[Flag, ...]]:
    return {"flags": flags}


def compose_allowlist(allow: Iterable[HostPattern], egress: RequestPolicy, bound_hosts: Iterable[tuple[str, int]],
                      implied: Iterable[HostPattern] = ()) -> Allowlist:
    """The allowlist rule, in its one place: the listed entries, then the hosts of the ``[[egress]]`` entries
    (``--egress-rule``, ``--no-inspect``), then ``implied`` ones (the agent's remote MCP servers), then each
    credential route's bound host (a bound host is reachable, and only inspected). In that order, each once."""
    bound = (HostPattern(host, False, port) for host, port in bound_hosts)
    return Allowlist(tuple(dict.fromkeys((*allow, *egress.patterns, *implied, *bound))))


@dataclass(frozen=True)
class GateOptions:
    """Everything the host tells a gate, as parsed values: ``from_flags`` parses the command line's texts (a
    ConfigError naming the flag), ``settings`` loads them. ``credential`` and ``routes``' values go on stdin."""

    api_listen: Endpoint = field(metadata=_flags(Flag(
        "--api-listen", "Where ANTHROPIC_BASE_URL points: the credential-injecting API route.", "HOST:PORT")))
    proxy_listen: Endpoint = field(metadata=_flags(Flag(
        "--proxy-listen", "Where HTTPS_PROXY/HTTP_PROXY point: the allowlisting egress proxy.", "HOST:PORT")))
    # On standard input (the command's --token-file -), never in the arguments.
    credential: Credential = field(metadata=_flags(Flag(
        "--token-file", "File holding the OAuth token or API key (mode 0600); '-' reads standard input.", "PATH")))
    upstream: Upstream = field(default=ANTHROPIC_API, metadata=_flags(Flag(
        "--upstream", "The Anthropic-compatible API the API route forwards to.", "URL", show_default=True)))
    allow: Allowlist = field(default=Allowlist(), metadata=_flags(Flag(
        "--allow", "Allow proxy traffic to HOST or *.SUFFIX, optionally :PORT (default ports 443 and 80). "
        "Repeatable.", "PATTERN")))
    allow_tcp: Allowlist = field(default=Allowlist(), metadata=_flags(Flag(
        "--allow-tcp", "Let tunnels to this HOST:PORT carry any TCP, not only TLS naming the host (e.g. SSH). "
        "Implies --allow. Repeatable.", "PATTERN")))
    allow_private: tuple[IPNetwork, ...] = field(default=(), metadata=_flags(Flag(
        "--allow-private", "Let the proxy reach these non-public addresses (refused by default). Repeatable.",
        "CIDR")))
    # The (method, path) pairs forwarded besides Claude Code's own (``CLAUDE_CODE_API_PATHS``).
    allow_api_path: frozenset[tuple[str, str]] = field(default=frozenset(), metadata=_flags(Flag(
        "--allow-api-path", "Forward this API path too, besides the ones Claude Code uses. Repeatable.",
        "[METHOD] PATH")))
    allow_server_tool: tuple[str, ...] = field(default=(), metadata=_flags(Flag(
        "--allow-server-tool", "Let Messages requests use this provider-side server tool, e.g. web_fetch "
        "(refused by default, except the web search Claude Code uses). Repeatable.", "FAMILY")))
    request_policy: RequestPolicy = field(default=RequestPolicy(), metadata=_flags(
        Flag("--egress-rule", "A method and path rule for an inspected host, e.g. 'api.github.com allow GET "
             "/repos/**'; the host joins the allowlist. Repeatable.", "'HOST allow|deny METHOD PATH'"),
        Flag("--no-inspect", "Tunnel this host opaquely (certificate pinning, mTLS), under the TLS name check "
             "only; it joins the allowlist. Weaker: no rules, no DLP. Repeatable.", "HOST")))
    dlp: DlpPolicy = field(default=DlpPolicy(), metadata=_flags(
        Flag("--dlp-rule", "An extra DLP rule refusing requests that match REGEX (bounded length). Repeatable.",
             "'NAME REGEX'"),
        Flag("--dlp-off", "Turn a built-in DLP rule off. Repeatable.", "NAME")))
    # Each route's value follows the token on standard input, one line each, in this order.
    routes: tuple[CredentialRoute, ...] = field(default=(), metadata=_flags(Flag(
        "--credential-route", "Hold a credential for these hosts (scheme bearer, token or basic): injected on "
        "inspected requests to them in place of the client's; SENTINEL, the bottle's stand-in, is refused "
        "elsewhere. Its value is read from standard input after the token (--token-file -), one line per route "
        "in order. Repeatable.", "'NAME SCHEME USERNAME|- SENTINEL HOST[,HOST...]'")))
    # Its password, if it has a user, follows the routes' values on standard input.
    upstream_proxy: UpstreamProxy | None = field(default=None, metadata=_flags(
        Flag("--upstream-proxy", "Connect out through this HTTP proxy (CONNECT; plain HTTP in absolute form). With a "
             "USER, its password is read from standard input after the routes' values (--token-file -).",
             "http://[USER@]HOST[:PORT]"),
        Flag("--upstream-no-proxy", "Dial this destination directly, not through --upstream-proxy: a NO_PROXY entry "
             "(*, a domain and its subdomains, an address, a CIDR). Repeatable.", "ENTRY")))
    mcp_servers: tuple[McpServerRules, ...] = field(default=(), metadata=_flags(Flag(
        "--mcp-server", "Read every request to this origin as a remote MCP server's JSON-RPC: tools/call judged by "
        "the tool globs (deny wins; no tools= allows all), tools/list answers filtered. It joins the allowlist. "
        "Repeatable.", "'NAME HOST:PORT [tools=GLOB,...] [deny_tools=GLOB,...]'")))
    extra_ca: tuple[Path, ...] = field(default=(), metadata=_flags(Flag(
        "--extra-ca", "Also trust these CA certificates (PEM) toward the upstream, e.g. for TLS inspection.",
        "PATH", path=True)))
    audit_log: str | None = field(default=None, metadata=_flags(Flag(  # a path, or "-": standard error
        "--audit-log", "Append one JSON line per decision here; '-' for stderr.", "PATH")))
    ca_cert_out: Path | None = field(default=None, metadata=_flags(Flag(
        "--ca-cert-out", "Write the certificate of the gate's CA (public; its key stays in the gate's memory) "
        "here at start, for clients to trust.", "PATH", path=True)))
    max_tunnels: int = field(default=Limits.max_tunnels, metadata=_flags(Flag(
        "--max-tunnels", "Concurrent proxy tunnels and forwarded requests.", bounds=(1, 100_000),
        show_default=True)))
    max_connections: int = field(default=Limits.max_connections, metadata=_flags(Flag(
        "--max-connections", "Open client connections per listener; more are answered 503 and closed.",
        bounds=(1, 1_000_000), show_default=True)))
    idle_timeout: float = field(default=Limits.idle_timeout, metadata=_flags(Flag(
        "--idle-timeout", "Seconds without traffic before a stream or tunnel is closed.", bounds=(1, 86_400),
        show_default=True)))
    drain_seconds: float = field(default=Limits.drain_seconds, metadata=_flags(Flag(
        "--drain-seconds", "On SIGTERM, how long in-flight requests may finish.", bounds=(0, 3600),
        show_default=True)))
    learn: bool = field(default=False, metadata=_flags(Flag(
        "--learn", "Learn mode: let destinations outside the allowlist through and audit them as would_deny "
        "(never the upstream's host; the address guard, rules and DLP still apply).")))
    ask: bool = field(default=False, metadata=_flags(Flag(
        "--ask", "Ask mode: hold a proxy request to a destination outside the allowlist until the host answers on "
        "the control socket (allow or deny, once or always), or the ask timeout refuses it. Needs "
        "--control-socket; not with --learn.")))
    ask_timeout: float = field(default=DEFAULT_ASK_TIMEOUT, metadata=_flags(Flag(
        "--ask-timeout", "With --ask: seconds a held request waits for an answer before it is refused.",
        "SECONDS", bounds=ASK_TIMEOUT_BOUNDS, show_default=True)))
    ask_limit: int = field(default=DEFAULT_ASK_LIMIT, metadata=_flags(Flag(
        "--ask-limit", "With --ask: destinations waiting for an answer at once; a request to one more is refused "
        "at once.", bounds=(1, 1000), show_default=True)))
    control_socket: Path | None = field(default=None, metadata=_flags(Flag(
        "--control-socket", "A unix socket (mode 0600) through which the allowlist can be changed while the gate "
        "runs (python -m claude_bottle.gate.control PATH allow|deny|show HOST).", "PATH", path=True)))
    exit_with_stdin: bool = field(default=False, metadata=_flags(Flag(
        "--exit-with-stdin", "Read only the secrets' lines from standard input (--token-file -), then stop as on "
        "SIGTERM when it closes: the host holds it open while the run lives.")))
    stdin_heartbeat: float = field(default=0.0, metadata=_flags(Flag(
        "--stdin-heartbeat", "With --exit-with-stdin: stop as well when nothing comes on standard input for this "
        "many seconds (0: never), for an engine that keeps it open after its client is gone; the host then "
        "writes a line there every second.", "SECONDS", bounds=(0, 3600))))

    def __post_init__(self) -> None:
        # The request policy in the form its flags carry (and so the gate sees): entries with rules, then
        # opaque ones. An inspected entry without rules is an allowlist entry only (``compose_allowlist``).
        ruled = tuple(entry for entry in self.request_policy.hosts if entry.inspect and (entry.allow or entry.deny))
        opaque = tuple(entry for entry in self.request_policy.hosts if not entry.inspect)
        object.__setattr__(self, "request_policy", RequestPolicy(ruled + opaque))

    # -- host side: to the command line and standard input -----------------------------------------------

    def args(self) -> list[str]:
        """The gate command's arguments (after ``gate``): every field not at its default, in its text form,
        nothing secret. The credential and the routes' values are read from standard input (``stdin``)."""
        args: list[str] = []
        for item in dataclasses.fields(self):
            value = getattr(self, item.name)
            if item.name == "credential":
                args += ["--token-file", TOKEN_FROM_STDIN]
            elif item.name == "request_policy" or item.name == "dlp":
                args += value.args()
            elif item.name == "routes":
                args += [arg for route in self.routes for arg in ("--credential-route", route.spec.flag())]
            elif item.name == "mcp_servers":
                args += [arg for server in self.mcp_servers for arg in ("--mcp-server", server.flag())]
            elif item.name == "upstream_proxy":
                args += value.args() if value is not None else []
            elif item.default is not dataclasses.MISSING and value == item.default:
                continue
            elif isinstance(value, bool):
                args.append(item.metadata["flags"][0].name)
            else:
                args += [arg for text in _texts(value) for arg in (item.metadata["flags"][0].name, text)]
        return args

    def stdin(self) -> bytes:
        """What the gate reads on its standard input: the token, then each route's value, one line each in the
        order of ``routes`` (``--credential-route``), then the upstream proxy's password if it has a user."""
        proxy = self.upstream_proxy
        password = (proxy.password,) if proxy is not None and proxy.username else ()
        values = (self.credential.secret, *(route.secret for route in self.routes), *password)
        return "".join(f"{value}\n" for value in values).encode()

    # -- gate side: from the command line, then into settings ---------------------------------------------

    @classmethod
    def from_flags(cls, params: Mapping[str, Any]) -> GateOptions:
        """The options from the gate command's parameters (one per ``Flag``, named by ``Flag.param``; texts,
        and numbers click has checked), parsed, reading the secrets as ``--token-file`` says (standard input
        for ``-``). A ConfigError names the flag of a bad value, or standard input that does not hold what the
        routes need."""
        values = dict(params)
        request_policy = parse_egress_rules(values.pop("egress_rule"), values.pop("no_inspect"))
        specs = parse_routes(values.pop("credential_route"), request_policy)
        proxy = parse_proxy_flags(values.pop("upstream_proxy"), values.pop("upstream_no_proxy"))
        credential, routes, password = read_secrets(values.pop("token_file"), specs, not values["exit_with_stdin"],
                                                    proxy_password=proxy is not None and bool(proxy.username))
        if proxy is not None and password:
            proxy = dataclasses.replace(proxy, password=password)
        dlp = parse_dlp(values.pop("dlp_rule"), values.pop("dlp_off"))
        allow_tcp = parse_allowlist(values.pop("allow_tcp"), "--allow-tcp")
        mcp_servers = parse_mcp_servers(values.pop("mcp_server"), request_policy, allow_tcp)
        parsed: dict[str, Any] = {
            "api_listen": parse_listen(values.pop("api_listen"), "--api-listen"),
            "proxy_listen": parse_listen(values.pop("proxy_listen"), "--proxy-listen"),
            "upstream": parse_upstream(values.pop("upstream")),
            "allow": parse_allowlist(values.pop("allow")),
            "allow_tcp": allow_tcp,
            "mcp_servers": mcp_servers,
            "allow_private": parse_networks(values.pop("allow_private")),
            "allow_api_path": parse_extra_api_paths(values.pop("allow_api_path")),
            "allow_server_tool": parse_server_tools(values.pop("allow_server_tool")),
            "extra_ca": tuple(Path(path) for path in values.pop("extra_ca")),
            "ca_cert_out": _path(values.pop("ca_cert_out")),
            "control_socket": _path(values.pop("control_socket")),
        }
        return cls(credential=credential, routes=routes, request_policy=request_policy, dlp=dlp, upstream_proxy=proxy,
                   **parsed, **values)

    def check(self) -> None:
        """ConfigError for options that parse but do not make a gate: ask mode without the control socket the
        host answers on, or with learn mode (which lets through what ask mode would hold)."""
        if self.ask and self.learn:
            raise ConfigError("--ask and --learn: choose one (learn mode lets unlisted destinations through, ask "
                              "mode holds them for the host's answer)")
        if self.ask and self.control_socket is None:
            raise ConfigError("--ask needs --control-socket: the host answers there")

    def settings(self, limits: Limits | None = None) -> GateSettings:
        """The one loader: these options as the settings the gate runs with. The allowlist is composed here
        (``compose_allowlist``). ``limits``: timeouts the command line does not carry (tests shorten them); the
        options' own limits replace theirs."""
        bound_hosts = [host for route in self.routes for host in route.spec.hosts]
        return GateSettings(
            api_listen=self.api_listen,
            proxy_listen=self.proxy_listen,
            upstream=self.upstream,
            allowlist=compose_allowlist(self.allow.patterns, self.request_policy, bound_hosts,
                                        implied=(server.allow_entry for server in self.mcp_servers)),
            allow_tcp=Allowlist(tuple(dict.fromkeys(self.allow_tcp.patterns))),
            request_policy=self.request_policy,
            dlp=self.dlp,
            allow_private=self.allow_private,
            api_policy=ApiPolicy(CLAUDE_CODE_API_PATHS | self.allow_api_path),
            messages_policy=MessagesPolicy(frozenset(self.allow_server_tool)),
            extra_ca_files=self.extra_ca,
            credential=self.credential,
            routes=self.routes,
            limits=dataclasses.replace(limits or Limits(), max_tunnels=self.max_tunnels,
                                       max_connections=self.max_connections, idle_timeout=self.idle_timeout,
                                       drain_seconds=self.drain_seconds),
            learn=self.learn,
            ask=self.ask,
            ask_timeout=self.ask_timeout,
            ask_limit=self.ask_limit,
            control_socket=self.control_socket,
            upstream_proxy=self.upstream_proxy,
            mcp_servers=self.mcp_servers,
        )


def parse_proxy_flags(urls: tuple[str, ...], no_proxy: tuple[str, ...]) -> UpstreamProxy | None:
    """``--upstream-proxy`` (once at most; no password: that comes on standard input) and its
    ``--upstream-no-proxy`` entries. A ConfigError names the flag."""
    if len(urls) > 1:
        raise ConfigError("--upstream-proxy: given more than once")
    if not urls:
        if no_proxy:
            raise ConfigError("--upstream-no-proxy: without --upstream-proxy there is nothing to bypass")
        return None
    proxy = UpstreamProxy.parse(urls[0], "--upstream-proxy", ",".join(no_proxy))
    if proxy.password:
        raise ConfigError("--upstream-proxy: a password does not go in the arguments, which any process may read; "
                          "give http://USER@HOST:PORT and the password on standard input (--token-file -)")
    return proxy


def flags() -> list[tuple[str, Flag, Any]]:
    """Every flag of the gate command in order, with the field it belongs to and that field's default in its
    text form: ``dataclasses.MISSING`` for a required field, a tuple of texts for a repeatable one (and for
    each flag of a field with several), a bool for a switch, a number, a text or None."""
    return [(item.name, flag, () if len(item.metadata["flags"]) > 1 else _default_text(item.default))
            for item in dataclasses.fields(GateOptions) for flag in item.metadata["flags"]]


def _texts(value: Any) -> tuple[str, ...]:
    """A field's value as its flag writes it, one text per repetition (one for a single value)."""
    if isinstance(value, Allowlist):
        return value.texts()
    if isinstance(value, frozenset):  # the API paths
        return tuple(f"{method} {path}" for method, path in sorted(value))
    if isinstance(value, tuple):
        return tuple(str(item) for item in value)
    return (str(value),)


def _default_text(default: Any) -> Any:
    if default is dataclasses.MISSING or default is None or isinstance(default, (bool, int, float, str)):
        return default
    if isinstance(default, (Allowlist, frozenset, tuple)):
        return _texts(default)
    return str(default)


def _path(text: str | None) -> Path | None:
    return Path(text) if text is not None else None
