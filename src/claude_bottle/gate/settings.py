"""The gate's settings: parsed once from flags, validated, frozen."""

from __future__ import annotations

import functools
import ipaddress
import ssl
import sys
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from claude_bottle.credentials import Credential, read_token_file
from claude_bottle.errors import ConfigError
from claude_bottle.gate.decode import reflected_forms
from claude_bottle.gate.dlp import DlpMatcher, DlpPolicy, InvalidDlpRule
from claude_bottle.gate.dlp import policy_from_flags as dlp_from_flags
from claude_bottle.gate.routes import (
    CredentialRoute,
    InvalidRoute,
    RouteSpec,
    check_routes,
    check_secret,
    parse_route_flag,
)
from claude_bottle.gate.scan import SecretForms
from claude_bottle.gate.upstream_proxy import UpstreamProxy
from claude_bottle.policy.addresses import AddressGuard, IPNetwork, parse_network
from claude_bottle.policy.decide import CLAUDE_CODE_API_PATHS, ApiPolicy
from claude_bottle.policy.hosts import (
    Allowlist,
    InvalidHost,
    Target,
    normalize_host,
    parse_port,
    split_host_port,
)
from claude_bottle.policy.mcp import InvalidMcpServer, McpServerRules, check_servers, parse_mcp_flag
from claude_bottle.policy.messages import MAX_BODY_BYTES, InvalidServerTool, MessagesPolicy, parse_server_tool
from claude_bottle.policy.rules import InvalidRule, RequestPolicy, policy_from_flags

DEFAULT_UPSTREAM = "https://api.anthropic.com"


@dataclass(frozen=True)
class Endpoint:
    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


@dataclass(frozen=True)
class Upstream:
    scheme: str  # "https", or "http" for local test upstreams
    host: str
    port: int
    base_path: str  # "" or a prefix such as "/anthropic", without a trailing slash

    @property
    def authority(self) -> bytes:
        default = 443 if self.scheme == "https" else 80
        host = f"[{self.host}]" if ":" in self.host else self.host
        return (host if self.port == default else f"{host}:{self.port}").encode()

    def __str__(self) -> str:
        """The URL, as ``parse_upstream`` reads it back."""
        return f"{self.scheme}://{self.authority.decode()}{self.base_path}"


@dataclass(frozen=True)
class Limits:
    """Timeouts in seconds and caps. Defaults suit interactive use; tests shorten them."""

    header_timeout: float = 30.0  # to receive a whole request head (also the keep-alive idle time)
    first_flight_timeout: float = 10.0  # after a CONNECT's 200, to receive the client's TLS ClientHello
    idle_timeout: float = 600.0  # no byte either way on a body, stream or tunnel
    connect_timeout: float = 10.0  # DNS plus TCP (and TLS) connect, per upstream
    max_tunnels: int = 256  # concurrent CONNECT tunnels and forwarded requests on the proxy listener
    max_connections: int = 512  # open client connections per listener; more are answered 503 and closed
    max_header_bytes: int = 32 * 1024
    max_body_bytes: int = MAX_BODY_BYTES  # a body kept whole to be judged (Messages; a form under [[egress]] rules)
    # Of bodies kept whole, what a listener's exchanges may hold at once (more: 503): the gate's memory bounds a
    # bottle that sends many at once, and a flood on the proxy listener leaves the API route's its own.
    api_held_bytes: int = 96 << 20
    proxy_held_bytes: int = 64 << 20
    drain_seconds: float = 10.0  # after SIGTERM, how long in-flight exchanges may finish


@dataclass(frozen=True)
class GateSettings:
    api_listen: Endpoint
    proxy_listen: Endpoint
    credential: Credential
    upstream: Upstream
    allowlist: Allowlist = Allowlist()
    allow_tcp: Allowlist = Allowlist()  # targets whose tunnels may carry other bytes than TLS
    allow_private: tuple[IPNetwork, ...] = ()
    api_policy: ApiPolicy = ApiPolicy()
    messages_policy: MessagesPolicy = MessagesPolicy()
    # Inspected requests (terminated TLS, plain HTTP): method and path rules per host, and whether a host is
    # inspected at all (``RequestPolicy.inspects``); then DLP over each request (``DlpPolicy.scanner``).
    request_policy: RequestPolicy = RequestPolicy()
    dlp: DlpPolicy = DlpPolicy()
    extra_ca_files: tuple[Path, ...] = ()
    limits: Limits = field(default_factory=Limits)
    # Learn mode: a target outside the allowlist is let through and audited as "would deny" (never the
    # upstream's host; the address guard, rules and DLP still apply); the CA may then certify every name.
    learn: bool = False
    # Ask mode (gate/ask.py): a target outside the allowlist is held until the host answers on the control
    # socket, for at most ``ask_timeout`` seconds, ``ask_limit`` targets at once; the CA then certifies every
    # name as in learn mode, so an approved host's requests are inspected (rules, DLP).
    ask: bool = False
    ask_timeout: float = 60.0
    ask_limit: int = 16
    # A unix socket inside the gate's own file system through which the host changes the allowlist while it
    # runs (gate/control.py); None: the policy is fixed at start.
    control_socket: Path | None = None
    # Credentials for other hosts (gate/routes.py): injected on inspected requests to their bound hosts only.
    routes: tuple[CredentialRoute, ...] = ()
    # The HTTP proxy every connection out goes through (gate/upstream_proxy.py); None: dialled directly.
    upstream_proxy: UpstreamProxy | None = None
    # Remote MCP servers (policy/mcp.py): every request to one's origin is read as JSON-RPC (gate/mcp.py).
    mcp_servers: tuple[McpServerRules, ...] = ()

    @property
    def held_secrets(self) -> tuple[bytes, ...]:
        """What no request may carry out and no response may carry back: the Anthropic credential, each
        route's secret, and each route's sentinel (the bottle's stand-in, valid nowhere)."""
        values = [self.credential.secret] + [v for r in self.routes for v in (r.secret, r.spec.sentinel)]
        return tuple(dict.fromkeys(v.encode() for v in values))

    @property
    def injected_secrets(self) -> tuple[str, ...]:
        """The real values the gate sends upstream (the API credential, the routes' values, the upstream proxy's
        credentials): the audit redacts them, responses must not carry them."""
        proxy = self.upstream_proxy.sent() if self.upstream_proxy is not None else ()
        return (self.credential.secret, *(value for route in self.routes for value in route.sent()), *proxy)

    @functools.cached_property
    def reflected_forms(self) -> SecretForms:
        """Every form in which a server may send back a value of ``injected_secrets``, prepared once."""
        return SecretForms([form for secret in self.injected_secrets for form in reflected_forms(secret.encode())])

    @functools.cached_property
    def dlp_matcher(self) -> DlpMatcher:
        """``dlp`` and ``held_secrets``, prepared once for every request the gate scans."""
        return self.dlp.matcher(self.held_secrets)

    @property
    def guard(self) -> AddressGuard:
        return AddressGuard(self.allow_private)

    def ssl_context(self) -> ssl.SSLContext:
        """Toward upstreams: system trust plus the extra CA files (corporate TLS inspection), offering HTTP/1.1
        by ALPN, the one protocol the gate speaks. Made once and shared by every upstream connection: loading
        the system trust store takes tens of milliseconds, and the gate's start waits for it."""
        return self._ssl_context

    @functools.cached_property
    def _ssl_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context()
        context.set_alpn_protocols(["http/1.1"])
        for path in self.extra_ca_files:
            try:
                context.load_verify_locations(cafile=str(path))
            except (OSError, ssl.SSLError) as exc:
                raise ConfigError(f"--extra-ca {path}: cannot load CA certificates ({exc})") from None
        return context


def parse_listen(text: str, flag: str) -> Endpoint:
    """``HOST:PORT`` or ``[V6]:PORT``; port 0 picks a free port. Wildcard addresses are refused: the gate
    must listen only where its clients are."""
    try:
        host, port = split_host_port(text.strip())
        if port is None:
            raise InvalidHost("a port is required")
        name, ip = normalize_host(host)
        number = 0 if port == "0" else parse_port(port, "listen")
    except InvalidHost as exc:
        raise ConfigError(f"{flag} {text!r}: {exc}; write HOST:PORT such as 127.0.0.1:8080") from None
    if ip is not None and (ip.is_unspecified or getattr(ip, "ipv4_mapped", None) == ipaddress.IPv4Address(0)):
        raise ConfigError(
            f"{flag} {text!r}: refusing to listen on every interface; give the one address clients use "
            "(the gate would otherwise be an open proxy for anything that can reach this machine)"
        )
    return Endpoint(name, number)


def parse_upstream(text: str) -> Upstream:
    parts = urlsplit(text.strip())
    if parts.scheme not in ("https", "http") or not parts.hostname:
        raise ConfigError(f"--upstream {text!r}: expected an http(s) URL such as {DEFAULT_UPSTREAM}")
    if parts.username or parts.password or parts.query or parts.fragment:
        raise ConfigError(f"--upstream {text!r}: credentials, query and fragment are not allowed in the URL")
    try:
        name, _ = normalize_host(parts.hostname)
        port = parts.port if parts.port is not None else (443 if parts.scheme == "https" else 80)
    except (InvalidHost, ValueError) as exc:
        raise ConfigError(f"--upstream {text!r}: {exc}") from None
    base_path = parts.path.rstrip("/")
    if port == 0:
        raise ConfigError(f"--upstream {text!r}: port 0 is not a port to connect to")
    if base_path and not ApiPolicy().canonical(base_path):
        raise ConfigError(f"--upstream {text!r}: the path must be plain, without spaces, dot segments or escapes")
    return Upstream(parts.scheme, name, port, base_path)


def parse_api_paths(texts: tuple[str, ...] | list[str]) -> ApiPolicy:
    """``--allow-api-path`` entries (``parse_extra_api_paths``), added to the defaults."""
    return ApiPolicy(CLAUDE_CODE_API_PATHS | parse_extra_api_paths(texts))


def parse_extra_api_paths(texts: tuple[str, ...] | list[str]) -> frozenset[tuple[str, str]]:
    """``--allow-api-path`` entries as (method, path) pairs: ``/path`` (GET and POST) or ``METHOD /path``."""
    allowed: set[tuple[str, str]] = set()
    for text in texts:
        words = text.split()
        if not words:
            raise ConfigError(f"--allow-api-path {text!r}: expected /path or 'METHOD /path'")
        methods, path = (("GET", "POST"), words[0]) if len(words) == 1 else ((words[0].upper(),), words[-1])
        if len(words) > 2 or not path.startswith("/") or "?" in path:
            raise ConfigError(f"--allow-api-path {text!r}: expected /path or 'METHOD /path', no query")
        allowed.update((m, path) for m in methods)
    return frozenset(allowed)


def parse_server_tools(texts: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """``--allow-server-tool`` entries: server-tool families (``web_fetch``) the API route lets through."""
    try:
        return tuple(parse_server_tool(t) for t in texts)
    except InvalidServerTool as exc:
        raise ConfigError(f"--allow-server-tool {exc}") from None


def parse_networks(texts: tuple[str, ...] | list[str]) -> tuple[IPNetwork, ...]:
    try:
        return tuple(parse_network(t) for t in texts)
    except ValueError as exc:
        raise ConfigError(f"--allow-private: {exc}") from None


def parse_allowlist(texts: tuple[str, ...] | list[str], flag: str = "--allow") -> Allowlist:
    """``flag``'s patterns, each once. ``--allow``'s are then composed with the hosts of ``--egress-rule``,
    ``--no-inspect`` and ``--credential-route`` by ``gate.options.compose_allowlist``."""
    try:
        patterns = Allowlist.parse(texts).patterns
    except InvalidHost as exc:
        raise ConfigError(f"{flag}: {exc}") from None
    return Allowlist(tuple(dict.fromkeys(patterns)))


def parse_egress_rules(rules: tuple[str, ...] | list[str], no_inspect: tuple[str, ...] | list[str]) -> RequestPolicy:
    """``--egress-rule 'HOST allow|deny METHOD PATH'`` and ``--no-inspect HOST``: the request policy. Each
    host named joins the allowlist (``gate.options.compose_allowlist``)."""
    try:
        return policy_from_flags(rules, no_inspect)
    except InvalidRule as exc:
        raise ConfigError(str(exc)) from None


def parse_dlp(rules: tuple[str, ...] | list[str], off: tuple[str, ...] | list[str]) -> DlpPolicy:
    """``--dlp-rule 'NAME REGEX'`` (an extra rule) and ``--dlp-off NAME`` (a built-in rule turned off)."""
    try:
        return dlp_from_flags(rules, off)
    except InvalidDlpRule as exc:
        raise ConfigError(str(exc)) from None


def loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def parse_routes(texts: tuple[str, ...] | list[str], request_policy: RequestPolicy) -> tuple[RouteSpec, ...]:
    """``--credential-route`` entries. A bound host must be inspected: not under ``--no-inspect``."""
    try:
        routes = tuple(parse_route_flag(text) for text in texts)
        check_routes(routes)
    except InvalidRoute as exc:
        raise ConfigError(str(exc)) from None
    for route in routes:
        for host, port in route.hosts:
            if not request_policy.inspects(Target(host, port, normalize_host(host)[1])):
                raise ConfigError(f"--credential-route {route.name}: {host}:{port} is under --no-inspect, but a host "
                                  "bound to a credential must be inspected (the gate replaces the client's "
                                  "credentials there); drop one of the two")
    return routes


def read_secrets(token_file: str, routes: tuple[RouteSpec, ...], to_end: bool = True, proxy_password: bool = False
                 ) -> tuple[Credential, tuple[CredentialRoute, ...], str]:
    """The Anthropic token from ``--token-file`` and, for routes, their values, and with ``proxy_password``
    the upstream proxy's password (else ""): standard input holds the token's line, then one line per route in
    the order of ``--credential-route``, then the password. ``to_end``: standard input holds nothing else and
    is read to its end; else exactly those lines are read and the stream left open (``--exit-with-stdin``)."""
    if not routes and not proxy_password and (to_end or token_file != "-"):
        return read_token_file(token_file), (), ""
    if token_file != "-":
        raise ConfigError("--credential-route and --upstream-proxy with a user need --token-file -: their secrets "
                          "follow the token on standard input, one line each")
    wanted = 1 + len(routes) + proxy_password
    if to_end:
        lines = sys.stdin.read().splitlines()
    else:
        lines = [line.rstrip("\r\n") for line in (sys.stdin.readline() for _ in range(wanted)) if line]
    if len(lines) != wanted:
        raise ConfigError(f"standard input holds {len(lines)} lines; expected the token, then one value per "
                          f"--credential-route, then the upstream proxy's password if it has a user ({wanted} lines)")
    credential = Credential.parse(lines[0], "the token on standard input")
    try:
        values = [check_secret(line, f"the value of credential route {route.name} on standard input")
                  for route, line in zip(routes, lines[1:], strict=False)]
    except InvalidRoute as exc:
        raise ConfigError(str(exc)) from None
    password = lines[-1] if proxy_password else ""
    held = tuple(CredentialRoute(route, value) for route, value in zip(routes, values, strict=True))
    return credential, held, password


def parse_mcp_servers(texts: tuple[str, ...] | list[str], request_policy: RequestPolicy,
                      allow_tcp: Allowlist) -> tuple[McpServerRules, ...]:
    """``--mcp-server`` entries. The gate must read a server's requests: its origin is inspected, not raw TCP."""
    try:
        servers = tuple(parse_mcp_flag(text) for text in texts)
        check_servers(servers)
    except InvalidMcpServer as exc:
        raise ConfigError(str(exc)) from None
    for server in servers:
        target = Target(server.host, server.port, normalize_host(server.host)[1])
        if not request_policy.inspects(target) or allow_tcp.match(target) is not None:
            raise ConfigError(f"--mcp-server {server.name}: {server.host}:{server.port} is under --no-inspect or "
                              "--allow-tcp, but the gate must read an MCP server's requests to judge its tools")
    return servers
