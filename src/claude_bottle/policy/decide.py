"""The gate's verdicts. Pure functions of their inputs; each Decision carries the reason that is audited
and, on refusal, returned to the client in ``X-Deny-Reason``."""

from __future__ import annotations

import re
from dataclasses import dataclass

from claude_bottle.policy.addresses import AddressGuard, IPAddress
from claude_bottle.policy.hosts import DEFAULT_PORTS, Allowlist, InvalidHost, Target, normalize_host


@dataclass(frozen=True)
class RpcCall:
    """One JSON-RPC message the gate judged inside a request to an MCP server, audited on a line of its own:
    the server, the method ("(response)" for the client's answer to a server's request), the tool a
    ``tools/call`` names ("" otherwise), and its own verdict with the rule that decided ("" when none did)."""

    server: str
    method: str
    tool: str
    decision: str  # "allow" or "deny"
    reason: str
    rule: str = ""


@dataclass(frozen=True)
class Decision:
    allow: bool
    reason: str
    status: int = 403  # the HTTP status of a refusal
    rule: str = ""  # the configured rule that decided, for the audit's ``rule`` field; "" when none did
    learned: bool = False  # allowed only because the gate runs in learn mode: a strict gate would refuse it
    unlisted: bool = False  # the target is in no allowlist: refused for that, or let through by learn mode
    hint: str = ""  # on refusal: what the user can do to allow it ("run ... on the host"); "" when nothing simple
    calls: tuple[RpcCall, ...] = ()  # the JSON-RPC calls judged inside the request (MCP), each with its verdict


@dataclass(frozen=True)
class EgressPolicy:
    """What the proxy listener may reach.

    ``protected_hosts`` are names served by a credential route (the API upstream): never reachable through
    the proxy, on any port, even if allowlisted, or an agent could talk to the API with its own key.
    ``protected_endpoints`` are (address, port) pairs with the same status: the upstream's addresses, and the
    gate's own listeners. ``raw_tcp`` lists the targets a tunnel may carry any bytes to (``--allow-tcp``);
    they are reachable as if allowlisted. Every other tunnel must open with a TLS ClientHello naming its host.

    ``denied`` lists what the host refused while the gate runs (``claude-bottle deny``): refused before the
    allowlist is asked. ``learn``: a target in neither list is let through as a learned decision (recorded
    as "would deny"), never a protected host, and its addresses still face the address guard.
    """

    allowlist: Allowlist
    guard: AddressGuard
    protected_hosts: frozenset[str] = frozenset()
    protected_endpoints: frozenset[tuple[IPAddress, int]] = frozenset()
    raw_tcp: Allowlist = Allowlist()
    denied: Allowlist = Allowlist()
    learn: bool = False

    def decide_target(self, target: Target) -> Decision:
        if target.host in self.protected_hosts:
            return Decision(False, f"{target.host} is served by the gate's credential route; "
                                   "use ANTHROPIC_BASE_URL, not the proxy")
        denied = self.denied.match(target)
        if denied is not None:
            return Decision(False, f"{target} matches {denied}, denied by the user while the bottle runs",
                            hint=f"run `claude-bottle allow {denied}` on the host")
        pattern = self.allowlist.match(target)
        if pattern is not None:
            return Decision(True, f"{target} matches allow pattern {pattern}")
        raw = self.raw_tcp.match(target)
        if raw is not None:
            return Decision(True, f"{target} matches allow-tcp pattern {raw}")
        if self.learn:
            return Decision(True, f"learn mode: {target} is not in the allowlist (would deny)", learned=True,
                            unlisted=True)
        return Decision(False, f"{target} is not in the allowlist", unlisted=True,
                        hint=f"run `claude-bottle allow {allow_entry(target)}` on the host")

    def decide_tunnel(self, target: Target) -> Decision:
        """A CONNECT: the target as above; port 80 only where raw TCP is allowed (plain HTTP has its own way
        through the proxy, where the gate sees the Host header)."""
        decision = self.decide_target(target)
        if decision.allow and target.port == 80 and not self.raw_allowed(target):
            return Decision(False, "CONNECT to port 80 is refused: send plain HTTP to the proxy as an absolute "
                                   "URL (GET http://host/path)")
        return decision

    def raw_allowed(self, target: Target) -> bool:
        """True if a tunnel to ``target`` may carry bytes other than TLS (no first-flight check)."""
        return self.raw_tcp.match(target) is not None

    def decide_address(self, address: IPAddress, port: int) -> Decision:
        if (address, port) in self.protected_endpoints:
            return Decision(False, f"{address}:{port} is the gate itself or its credential upstream")
        allowed, reason = self.guard.check(address)
        return Decision(allowed, reason, hint="" if allowed else "list its network in allow_private in the agent file")


def allow_entry(target: Target) -> str:
    """The allowlist entry that allows exactly ``target``: its host, with the port unless a default one."""
    host = f"[{target.host}]" if target.ip is not None and target.ip.version == 6 else target.host
    return host if target.port in DEFAULT_PORTS else f"{host}:{target.port}"


def decide_server_name(target: Target, server_name: str | None) -> Decision:
    """A tunnel's TLS ClientHello must name the host the CONNECT named (compared as host names are: case,
    trailing dot and IDNA form aside); a CONNECT to an IP literal must carry no name. Otherwise a tunnel to
    an allowed host on a shared front (a CDN) could reach any other site behind that front."""
    if server_name is None:
        if target.ip is not None:
            return Decision(True, "TLS without a server name, to an IP address")
        return Decision(False, f"TLS ClientHello without a server name; the CONNECT named {target.host}")
    if target.ip is not None:
        return Decision(False, f"TLS server name {server_name} on a CONNECT to the IP address {target.host}")
    try:
        name, ip = normalize_host(server_name)
    except InvalidHost:
        return Decision(False, f"TLS server name {server_name!r} is not a valid host name")
    if ip is not None or name != target.host:
        return Decision(False, f"TLS server name {server_name} does not match the CONNECT host {target.host}")
    return Decision(True, f"TLS server name {name} matches the CONNECT host")


# The paths Claude Code 2.1.126 calls on ANTHROPIC_BASE_URL, measured with the real binary (docs/gate.md):
# a HEAD / reachability probe, the model list (API-key mode), messages and token counting.
CLAUDE_CODE_API_PATHS: frozenset[tuple[str, str]] = frozenset({
    ("HEAD", "/"),
    ("GET", "/v1/models"),
    ("POST", "/v1/messages"),
    ("POST", "/v1/messages/count_tokens"),
})

# Origin-form paths only, no dot segments, no encoded '/', '.', '\' or '%' that an upstream could decode
# into a different path than the one we decided on.
_CANONICAL_PATH = re.compile(r"/(?:[A-Za-z0-9\-._~!$&'()*+,;=:@]+/?)*")


@dataclass(frozen=True)
class ApiPolicy:
    """Which (method, path) pairs the API listener forwards. The query string does not take part."""

    allowed: frozenset[tuple[str, str]] = CLAUDE_CODE_API_PATHS

    @staticmethod
    def canonical(path: str) -> bool:
        return bool(_CANONICAL_PATH.fullmatch(path)) and not any(s in (".", "..") for s in path.split("/"))

    def decide(self, method: str, target: str) -> Decision:
        if method in ("TRACE", "CONNECT"):
            return Decision(False, f"{method} is not allowed on the API listener", 405)
        path = target.split("?", 1)[0]
        if not self.canonical(path):
            return Decision(False, "request path is not in canonical form", 400)
        if (method, path) in self.allowed:
            return Decision(True, f"{method} {path} is an allowed API path")
        if any(p == path for _, p in self.allowed):
            return Decision(False, f"method {method} is not allowed for {path}", 405)
        return Decision(False, f"{path} is not an allowed API path (add it with --allow-api-path)")
