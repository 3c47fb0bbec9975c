"""The gate's verdicts: egress targets and addresses, and API (method, path) pairs."""

from __future__ import annotations

import ipaddress

import pytest

from claude_bottle.policy.addresses import AddressGuard
from claude_bottle.policy.decide import CLAUDE_CODE_API_PATHS, ApiPolicy, Decision, EgressPolicy, decide_server_name
from claude_bottle.policy.hosts import Allowlist, parse_authority


def _policy(allow_private: tuple[str, ...] = ()) -> EgressPolicy:
    return EgressPolicy(
        allowlist=Allowlist.parse(["api.anthropic.com", "*.anthropic.com", "*.github.com", "10.1.2.3:8080"]),
        guard=AddressGuard(tuple(ipaddress.ip_network(n) for n in allow_private)),
        protected_hosts=frozenset({"api.anthropic.com"}),
        protected_endpoints=frozenset({
            (ipaddress.ip_address("160.79.104.10"), 443),
            (ipaddress.ip_address("127.0.0.1"), 8080),
            (ipaddress.ip_address("2607:6bc0::10"), 443),
        }),
    )


TARGET_CASES = [
    # (authority, allow, status, words in the reason)
    ("api.anthropic.com:443", False, 403, ["api.anthropic.com", "credential route", "ANTHROPIC_BASE_URL"]),
    ("API.Anthropic.com.:443", False, 403, ["credential route"]),
    ("api.anthropic.com:8443", False, 403, ["credential route"]),  # any port, even one no pattern allows
    ("api.anthropic.com:80", False, 403, ["credential route"]),
    ("console.anthropic.com:443", True, 403, ["console.anthropic.com:443", "matches allow pattern *.anthropic.com"]),
    ("a.b.github.com:80", True, 403, ["a.b.github.com:80", "matches allow pattern *.github.com"]),
    ("github.com:443", False, 403, ["github.com:443", "is not in the allowlist"]),
    ("evil.com:443", False, 403, ["evil.com:443", "is not in the allowlist"]),
    ("a.github.com:22", False, 403, ["a.github.com:22", "is not in the allowlist"]),
    ("10.1.2.3:8080", True, 403, ["10.1.2.3:8080", "matches allow pattern 10.1.2.3:8080"]),
    ("0x0a.1.2.3:8080", True, 403, ["10.1.2.3:8080", "matches allow pattern 10.1.2.3:8080"]),
    ("10.1.2.3:443", False, 403, ["10.1.2.3:443", "is not in the allowlist"]),
    ("[::1]:443", False, 403, ["[::1]:443", "is not in the allowlist"]),
]


@pytest.mark.parametrize(("authority", "allow", "status", "words"), TARGET_CASES, ids=[c[0] for c in TARGET_CASES])
def test_decide_target(authority: str, allow: bool, status: int, words: list[str]) -> None:
    decision = _policy().decide_target(parse_authority(authority))
    assert decision.allow is allow
    assert decision.status == status
    for word in words:
        assert word in decision.reason, (word, decision.reason)


def test_decide_target_exact_reasons() -> None:
    policy = _policy()
    assert policy.decide_target(parse_authority("a.github.com:443")) == Decision(
        True, "a.github.com:443 matches allow pattern *.github.com"
    )
    assert policy.decide_target(parse_authority("evil.com:443")) == Decision(
        False, "evil.com:443 is not in the allowlist", unlisted=True,
        hint="run `claude-bottle allow evil.com` on the host"
    )


ADDRESS_CASES = [
    # (address, port, allow_private, allow, words)
    ("160.79.104.10", 443, (), False, ["160.79.104.10:443", "the gate itself or its credential upstream"]),
    ("160.79.104.10", 80, (), True, ["globally routable"]),  # same address, other port: the guard decides
    ("2607:6bc0::10", 443, (), False, ["the gate itself or its credential upstream"]),
    ("127.0.0.1", 8080, ("127.0.0.0/8",), False, ["127.0.0.1:8080", "the gate itself"]),  # even if opted in
    ("127.0.0.1", 8081, ("127.0.0.0/8",), True, ["loopback", "allowed by --allow-private 127.0.0.0/8"]),
    ("127.0.0.1", 8081, (), False, ["loopback", "refused", "--allow-private"]),
    ("8.8.8.8", 443, (), True, ["8.8.8.8 is globally routable"]),
    ("10.1.2.3", 8080, (), False, ["private (RFC 1918)", "refused"]),
    ("10.1.2.3", 8080, ("10.0.0.0/8",), True, ["allowed by --allow-private 10.0.0.0/8"]),
    ("169.254.169.254", 80, (), False, ["cloud metadata service", "refused"]),
    ("::ffff:8.8.8.8", 443, (), False, ["IPv4-mapped IPv6", "refused"]),
]


@pytest.mark.parametrize(
    ("address", "port", "networks", "allow", "words"),
    ADDRESS_CASES,
    ids=[f"{c[0]}:{c[1]}-allow{','.join(c[2]) or 'none'}" for c in ADDRESS_CASES],
)
def test_decide_address(address: str, port: int, networks: tuple[str, ...], allow: bool, words: list[str]) -> None:
    policy = _policy(networks)
    ip = ipaddress.ip_address(address)
    decision = policy.decide_address(ip, port)
    assert decision.allow is allow
    assert decision.status == 403
    for word in words:
        assert word in decision.reason, (word, decision.reason)
    if (ip, port) not in policy.protected_endpoints:
        assert (decision.allow, decision.reason) == policy.guard.check(ip)  # passed through unchanged


def test_default_api_paths() -> None:
    assert frozenset({("HEAD", "/"), ("GET", "/v1/models"), ("POST", "/v1/messages"),
                      ("POST", "/v1/messages/count_tokens")}) == CLAUDE_CODE_API_PATHS
    assert ApiPolicy().allowed == CLAUDE_CODE_API_PATHS


API_CASES = [
    # (method, target, allow, status, words)
    ("POST", "/v1/messages", True, None, ["POST /v1/messages is an allowed API path"]),
    ("POST", "/v1/messages?beta=true", True, None, ["POST /v1/messages is an allowed API path"]),
    ("POST", "/v1/messages/count_tokens", True, None, ["POST /v1/messages/count_tokens"]),
    ("POST", "/v1/messages/count_tokens?beta=true", True, None, ["/v1/messages/count_tokens"]),
    ("POST", "/v1/messages?a=../../x&b=%2f", True, None, ["/v1/messages"]),  # the query does not take part
    ("TRACE", "/v1/messages", False, 405, ["TRACE is not allowed"]),
    ("CONNECT", "/v1/messages", False, 405, ["CONNECT is not allowed"]),
    ("CONNECT", "api.anthropic.com:443", False, 405, ["CONNECT is not allowed"]),
    ("GET", "/v1/messages", False, 405, ["method GET is not allowed for /v1/messages"]),
    ("PUT", "/v1/messages/count_tokens", False, 405, ["method PUT is not allowed"]),
    ("post", "/v1/messages", False, 405, ["method post"]),
    ("POST", "/v1/other", False, 403, ["/v1/other is not an allowed API path", "--allow-api-path"]),
    ("GET", "/v1/models?limit=1000", True, None, ["GET /v1/models is an allowed API path"]),
    ("HEAD", "/", True, None, ["HEAD / is an allowed API path"]),
    ("GET", "/v1/organizations", False, 403, ["/v1/organizations", "--allow-api-path"]),
    ("POST", "/v1/messages/", False, 403, ["--allow-api-path"]),
    ("POST", "/V1/messages", False, 403, ["--allow-api-path"]),
    ("POST", "/", False, 405, ["method POST is not allowed for /"]),
    ("POST", "/v1/messages;x", False, 403, ["--allow-api-path"]),
    ("POST", "/v1/messages/../x", False, 400, ["not in canonical form"]),
    ("POST", "/v1/messages/..", False, 400, ["not in canonical form"]),
    ("POST", "/v1/./messages", False, 400, ["not in canonical form"]),
    ("POST", "/v1/%2e%2e/x", False, 400, ["not in canonical form"]),
    ("POST", "/v1/%2E%2E/messages", False, 400, ["not in canonical form"]),
    ("POST", "/v1//messages", False, 400, ["not in canonical form"]),
    ("POST", "//evil.com/x", False, 400, ["not in canonical form"]),
    ("POST", "http://x/v1/messages", False, 400, ["not in canonical form"]),
    ("POST", "/v1/messages%2fx", False, 400, ["not in canonical form"]),
    ("POST", "/v1/messages%2Fcount_tokens", False, 400, ["not in canonical form"]),
    ("POST", "/v1\\messages", False, 400, ["not in canonical form"]),
    ("POST", "/v1/messages%00", False, 400, ["not in canonical form"]),
    ("POST", "/v1/messages#x", False, 400, ["not in canonical form"]),
    ("POST", "*", False, 400, ["not in canonical form"]),
    ("POST", "", False, 400, ["not in canonical form"]),
    ("POST", "v1/messages", False, 400, ["not in canonical form"]),
    ("GET", "/v1/../v1/messages", False, 400, ["not in canonical form"]),
]


@pytest.mark.parametrize(
    ("method", "target", "allow", "status", "words"), API_CASES, ids=[f"{c[0]} {c[1]!r}" for c in API_CASES]
)
def test_api_policy_decide(method: str, target: str, allow: bool, status: int | None, words: list[str]) -> None:
    decision = ApiPolicy().decide(method, target)
    assert decision.allow is allow
    if status is not None:
        assert decision.status == status
    for word in words:
        assert word in decision.reason, (word, decision.reason)


def test_api_policy_exact_reasons() -> None:
    policy = ApiPolicy()
    assert policy.decide("GET", "/v1/files") == Decision(
        False, "/v1/files is not an allowed API path (add it with --allow-api-path)", 403
    )
    assert policy.decide("POST", "/v1/%2e%2e/x") == Decision(False, "request path is not in canonical form", 400)


def test_api_policy_extra_path() -> None:
    policy = ApiPolicy(CLAUDE_CODE_API_PATHS | {("GET", "/v1/files")})
    assert policy.decide("GET", "/v1/files?limit=5").allow is True
    assert policy.decide("POST", "/v1/files").status == 405
    assert policy.decide("POST", "/v1/messages").allow is True


# The comment above _CANONICAL_PATH refuses dot *segments* ('.', '..') and encoded characters; a '.' inside a
# segment is an ordinary path character (RFC 3986 unreserved). A configured path containing one must be usable.
@pytest.mark.parametrize("path", ["/v1/files/report.txt", "/v1/models/claude-3.5", "/.well-known/x"])
def test_api_policy_allows_configured_path_with_dot_inside_segment(path: str) -> None:
    policy = ApiPolicy(frozenset({("GET", path)}))
    decision = policy.decide("GET", path)
    assert decision == Decision(True, f"GET {path} is an allowed API path")


def _raw_policy() -> EgressPolicy:
    return EgressPolicy(allowlist=Allowlist.parse(["example.com", "*.github.com"]), guard=AddressGuard(()),
                        protected_hosts=frozenset({"api.anthropic.com"}),
                        raw_tcp=Allowlist.parse(["git.example.org:22", "legacy.example.net:80", "api.anthropic.com:22"]))


@pytest.mark.parametrize(("authority", "allow", "raw", "words"), [
    ("example.com:443", True, False, "matches allow pattern example.com"),
    ("example.com:80", False, False, "CONNECT to port 80 is refused"),
    ("a.github.com:80", False, False, "absolute URL"),
    ("git.example.org:22", True, True, "matches allow-tcp pattern git.example.org:22"),
    ("git.example.org:443", False, False, "not in the allowlist"),  # raw TCP on one port only
    ("legacy.example.net:80", True, True, "matches allow-tcp pattern"),  # port 80 where raw TCP is allowed
    ("api.anthropic.com:22", False, True, "credential route"),  # protected even when listed for raw TCP
    ("other.example:22", False, False, "not in the allowlist"),
])
def test_tunnels_port_80_and_raw_tcp(authority: str, allow: bool, raw: bool, words: str) -> None:
    policy, target = _raw_policy(), parse_authority(authority)
    decision = policy.decide_tunnel(target)
    assert decision.allow is allow and words in decision.reason
    assert policy.raw_allowed(target) is raw


def test_plain_http_to_port_80_is_decided_on_the_allowlist_alone() -> None:
    assert _raw_policy().decide_target(parse_authority("example.com:80")).allow


@pytest.mark.parametrize(("authority", "server_name", "allow", "words"), [
    ("example.com:443", "example.com", True, "matches the CONNECT host"),
    ("example.com:443", "EXAMPLE.com.", True, "matches"),
    ("xn--bcher-kva.example:443", "xn--BCHER-kva.example", True, "matches"),
    ("bücher.example:443", "xn--bcher-kva.example", True, "matches"),
    ("example.com:443", "other.example", False, "TLS server name other.example does not match the CONNECT host "
                                                "example.com"),
    ("example.com:443", "example.com.other.example", False, "does not match"),
    ("a.example.com:443", "example.com", False, "does not match"),
    ("example.com:443", "127.0.0.1", False, "does not match"),
    ("example.com:443", "exa mple.com", False, "is not a valid host name"),
    ("example.com:443", "xn--zz.example", False, "is not a valid host name"),
    ("example.com:443", None, False, "without a server name; the CONNECT named example.com"),
    ("203.0.113.5:443", None, True, "to an IP address"),
    ("203.0.113.5:443", "203.0.113.5", False, "on a CONNECT to the IP address 203.0.113.5"),
    ("[2001:db8::1]:443", "example.com", False, "on a CONNECT to the IP address"),
])
def test_server_name_against_the_connect_host(authority: str, server_name: str | None, allow: bool,
                                              words: str) -> None:
    decision = decide_server_name(parse_authority(authority), server_name)
    assert decision.allow is allow and words in decision.reason
