"""The gate's verdicts. Pure functions of their inputs; each Decision carries the reason that is audited
and, on refusal, returned to the client in ``X-Deny-Reason``."""

from __future__ import annotations

import re
from dataclasses import dataclass

from claude_bottle.policy.addresses import AddressGuard, IPAddress
from claude_bottle.policy.hosts import Allowlist, Target


@dataclass(frozen=True)
class Decision:
    allow: bool
    reason: str
    status: int = 403  # the HTTP status of a refusal


@dataclass(frozen=True)
class EgressPolicy:
    """What the proxy listener may reach.

    ``protected_hosts`` are names served by a credential route (the API upstream): never reachable through
    the proxy, on any port, even if allowlisted, or an agent could talk to the API with its own key.
    ``protected_endpoints`` are (address, port) pairs with the same status: the upstream's addresses, and the
    gate's own listeners.
    """

    allowlist: Allowlist
    guard: AddressGuard
    protected_hosts: frozenset[str] = frozenset()
    protected_endpoints: frozenset[tuple[IPAddress, int]] = frozenset()

    def decide_target(self, target: Target) -> Decision:
        if target.host in self.protected_hosts:
            return Decision(False, f"{target.host} is served by the gate's credential route; "
                                   "use ANTHROPIC_BASE_URL, not the proxy")
        pattern = self.allowlist.match(target)
        if pattern is None:
            return Decision(False, f"{target} is not in the allowlist")
        return Decision(True, f"{target} matches allow pattern {pattern}")

    def decide_address(self, address: IPAddress, port: int) -> Decision:
        if (address, port) in self.protected_endpoints:
            return Decision(False, f"{address}:{port} is the gate itself or its credential upstream")
        allowed, reason = self.guard.check(address)
        return Decision(allowed, reason)


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
