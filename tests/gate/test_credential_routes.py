"""Credential routes on a real gate: on a bound host the client's credentials are replaced by the route's own;
the sentinel and the value go nowhere else; a response never carries the value back; a bound host is never
reached unseen."""

from __future__ import annotations

import asyncio
import base64
import ipaddress
import json
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import trustme

from claude_bottle.errors import ConfigError
from claude_bottle.gate import settings as gc
from claude_bottle.gate.resolver import StaticResolver
from claude_bottle.gate.routes import CredentialRoute, RouteSpec, Scheme, new_sentinel, parse_route_flag
from claude_bottle.stub import StubUpstream
from tests.conftest import GateFactory, RunningGate
from tests.gate.test_inspection import StandInCA, response
from tests.gate.test_upstream_proxy import FakeProxy
from tests.helpers import connect_via, eventually, messages_request, read_all, read_head

pytestmark = pytest.mark.asyncio

BOUND, OTHER = "git.example.test", "other.example.test"
SECRET = "ghp_" + "R" * 36  # a GitHub-shaped value, as the github preset holds
ATTACKER = "attacker-own-token-0123456789abcdef"


@dataclass
class Hosts:
    stub: StubUpstream
    ca_file: Path

    def target(self, host: str) -> str:
        return f"{host}:{self.stub.port}"


@pytest.fixture
async def hosts(tmp_path: Path) -> AsyncIterator[Hosts]:
    """One HTTPS server answering as both BOUND and OTHER, behind a private CA the gate trusts."""
    ca = trustme.CA()
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert(BOUND, OTHER).configure_cert(context)
    ca_file = tmp_path / "upstream-ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    async with StubUpstream("127.0.0.2", tls=context) as stub:
        yield Hosts(stub, ca_file)


def route_to(hosts: Hosts, scheme: Scheme = Scheme.BASIC) -> CredentialRoute:
    username = "x-access-token" if scheme is Scheme.BASIC else ""
    return CredentialRoute(RouteSpec("github", ((BOUND, hosts.stub.port),), scheme, username, new_sentinel("github")),
                           SECRET)


def gate_with(make_gate: GateFactory, hosts: Hosts, route: CredentialRoute, ca: StandInCA | None, **kwargs: object):
    resolver = StaticResolver({name: [ipaddress.ip_address("127.0.0.2")] for name in (BOUND, OTHER)})
    return make_gate(allow=(hosts.target(OTHER),), allow_private=("127.0.0.0/8",), resolver=resolver, ca=ca,
                     extra_ca=(str(hosts.ca_file),), routes=(route,), **kwargs)


async def send(gate: RunningGate, ca: StandInCA, target: str, request: bytes) -> tuple[int, dict[str, str], bytes]:
    status, _, reader, writer = await connect_via(gate.proxy, target)
    assert status == 200
    await writer.start_tls(ca.client_context(), server_hostname=target.split(":")[0])
    writer.write(request)
    try:
        return await response(reader)
    finally:
        writer.close()


def post(host: str, extra: str = "", path: str = "/v1/messages", payload: dict[str, object] | None = None) -> bytes:
    return messages_request(payload or {"model": "m"}, extra_headers=extra, host=host).replace(
        b"POST /v1/messages ", f"POST {path} ".encode(), 1)


async def test_the_route_replaces_every_credential_the_client_sends_on_a_bound_host(
        make_gate: GateFactory, hosts: Hosts) -> None:
    ca, route = StandInCA(), route_to(hosts)
    async with gate_with(make_gate, hosts, route, ca) as gate:
        attacker = base64.b64encode(f"me:{ATTACKER}".encode()).decode()
        status, _, _ = await send(gate, ca, hosts.target(BOUND), post(
            hosts.target(BOUND), f"Authorization: Basic {attacker}\r\nAuthorization: Bearer {ATTACKER}\r\n"
                                 f"Cookie: session={ATTACKER}\r\nPrivate-Token: {ATTACKER}\r\n"))
        plain, _, _ = await send(gate, ca, hosts.target(BOUND), post(hosts.target(BOUND)))
        await eventually(lambda: len(hosts.stub.requests) == 2, what="both requests upstream")
    assert status == 200 and plain == 200
    for request in hosts.stub.requests:
        seen = [(n.decode().lower(), v.decode()) for n, v in request.headers]
        assert ATTACKER not in json.dumps(seen), "a credential of the client's own reached the bound host"
        assert [v for n, v in seen if n == "authorization"] == [
            "Basic " + base64.b64encode(f"x-access-token:{SECRET}".encode()).decode()]
    assert any("credential route github" in r["reason"] for r in gate.records() if r["method"] == "POST")


@pytest.mark.parametrize("scheme, header", [(Scheme.BEARER, f"Bearer {SECRET}"), (Scheme.TOKEN, f"token {SECRET}")])
async def test_each_scheme_sends_its_header(make_gate: GateFactory, hosts: Hosts, scheme: Scheme, header: str) -> None:
    ca = StandInCA()
    async with gate_with(make_gate, hosts, route_to(hosts, scheme), ca) as gate:
        status, _, _ = await send(gate, ca, hosts.target(BOUND), post(hosts.target(BOUND)))
    assert status == 200 and hosts.stub.requests[-1].header("authorization") == [header]


async def test_the_sentinel_and_the_value_go_nowhere_else(make_gate: GateFactory, hosts: Hosts) -> None:
    ca, route = StandInCA(), route_to(hosts)
    sentinel = route.spec.sentinel
    async with gate_with(make_gate, hosts, route, ca) as gate:
        attempts = {
            "sentinel as the other host's credential": post(hosts.target(OTHER), f"Authorization: Bearer {sentinel}\r\n"),
            "sentinel in the other host's body": post(hosts.target(OTHER), payload={"model": sentinel}),
            "value in the other host's URL": post(hosts.target(OTHER), path=f"/v1/messages?t={SECRET}"),
            "sentinel in the bound host's body": post(hosts.target(BOUND), payload={"x": sentinel}),
            "value base64 in the bound host's body": post(
                hosts.target(BOUND), payload={"x": base64.b64encode(SECRET.encode()).decode()}),
        }
        results = {what: await send(gate, ca, hosts.target(OTHER if "other" in what else BOUND), request)
                   for what, request in attempts.items()}
    assert {what: status for what, (status, _, _) in results.items()} == dict.fromkeys(attempts, 403)
    assert hosts.stub.requests == [], "nothing of a refused request reached an upstream"
    refusals = [r for r in gate.records() if r["method"] == "POST"]
    assert len(refusals) == len(attempts) and all(r["rule"] == "[dlp] held-secret" for r in refusals), refusals


async def test_a_response_never_carries_the_value_back(make_gate: GateFactory, hosts: Hosts) -> None:
    """The stub echoes the request's headers, in its body or in response headers: the route's Authorization
    (its Basic pair) and the secret must never reach the client, in any byte it receives."""
    ca, route = StandInCA(), route_to(hosts)
    pair = base64.b64encode(f"x-access-token:{SECRET}".encode())
    async with gate_with(make_gate, hosts, route, ca) as gate:
        for mode in ("echo", "echo-header"):
            status, _, reader, writer = await connect_via(gate.proxy, hosts.target(BOUND))
            assert status == 200
            await writer.start_tls(ca.client_context(), server_hostname=BOUND)
            writer.write(post(hosts.target(BOUND), payload={"model": "m", "stub": {"mode": mode}}))
            received = await read_all(reader)
            writer.close()
            assert received.startswith(b"HTTP/1.1 "), received
            assert SECRET.encode() not in received and pair not in received, mode
            assert b"HTTP/1.1 502" in received or b'"headers"' not in received, "cut off before the echo"
        await eventually(lambda: len(hosts.stub.requests) == 2, what="both requests upstream")
    assert all(r.header("authorization") == ["Basic " + pair.decode()] for r in hosts.stub.requests)


async def test_a_bound_host_is_never_reached_unseen(make_gate: GateFactory, hosts: Hosts) -> None:
    route = route_to(hosts)
    async with gate_with(make_gate, hosts, route, None) as gate:  # no CA: no tunnel is terminated
        status, headers, _, writer = await connect_via(gate.proxy, hosts.target(BOUND))
        writer.close()
        other, _, _, writer = await connect_via(gate.proxy, hosts.target(OTHER))
        writer.close()
    assert status == 403 and "credential route github" in headers["x-deny-reason"]
    assert other == 200, "an unbound host is still tunnelled opaquely by a gate without a CA"


async def test_plain_http_to_a_bound_host_is_refused(make_gate: GateFactory, hosts: Hosts) -> None:
    async with gate_with(make_gate, hosts, route_to(hosts), StandInCA()) as gate:
        reader, writer = await asyncio.open_connection(gate.proxy.host, gate.proxy.port)
        target = hosts.target(BOUND)
        writer.write(f"GET http://{target}/ HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
        status, headers = await read_head(reader)
        writer.close()
    assert status == 403 and "TLS only" in headers["x-deny-reason"]
    assert hosts.stub.requests == []


FORM, JSON = "Content-Type: application/x-www-form-urlencoded\r\n", "Content-Type: application/json\r\n"


@pytest.mark.parametrize(("line", "extra", "body"), [
    ("TRACE /", "", ""), ("POST /", "X-HTTP-Method-Override: trace\r\n", ""), ("POST /?_method=TRACE", "", ""),
    ("POST /", "X_Method_Override: TRACE\r\n", ""), ("POST /", FORM, "a=1&_method=trace"),
    ("POST /", JSON, '{"_method": "TRACE"}'),
    ("POST /", FORM, "x=" + "a" * 300_000 + "&_method=TRACE"),  # streamed: its end held until it is read
], ids=["trace", "header", "query", "header-spelling", "form", "json", "streamed-form"])
async def test_a_trace_to_a_bound_host_is_refused(make_gate: GateFactory, hosts: Hosts, line: str, extra: str,
                                                  body: str) -> None:
    """A TRACE's answer is the request as received: it would carry the route's header back. So is one that a
    lenient server reads as a TRACE."""
    ca, target = StandInCA(), hosts.target(BOUND)
    request = f"{line} HTTP/1.1\r\nHost: {target}\r\n{extra}Content-Length: {len(body)}\r\n\r\n{body}".encode()
    async with gate_with(make_gate, hosts, route_to(hosts), ca) as gate:
        status, headers, _ = await send(gate, ca, target, request)
    assert status == 405 and "RFC 9110" in headers["x-deny-reason"]
    assert hosts.stub.requests == []


@pytest.mark.filterwarnings("ignore")
def test_a_bound_host_cannot_be_opted_out_of_inspection() -> None:
    spec = parse_route_flag(f"github basic x-access-token {new_sentinel('github')} github.com")
    with pytest.raises(ConfigError, match=r"github\.com:443 is under --no-inspect"):
        gc.parse_routes([spec.flag()], gc.parse_egress_rules((), ("github.com",)))


@pytest.mark.parametrize(("scheme", "secret", "encoding"), [
    (Scheme.BASIC, SECRET, "url"), (Scheme.BASIC, SECRET, "base64"), (Scheme.BASIC, SECRET, "base64-nopad"),
    (Scheme.BEARER, SECRET.replace("R", "Rs/"), "url"), (Scheme.BEARER, SECRET, "base64-nopad"),
], ids=["basic-url", "basic-base64", "basic-base64-nopad", "bearer-url", "bearer-base64-nopad"])
async def test_a_response_never_carries_the_value_back_encoded(make_gate: GateFactory, hosts: Hosts, scheme: Scheme,
                                                               secret: str, encoding: str) -> None:
    """A bound host reflecting the credential URL-encoded or in base64 (padded or not) is refused as if it
    reflected the value itself."""
    ca = StandInCA()
    route = CredentialRoute(route_to(hosts, scheme).spec, secret)
    async with gate_with(make_gate, hosts, route, ca) as gate:
        status, _, body = await send(gate, ca, hosts.target(BOUND), post(
            hosts.target(BOUND), payload={"model": "m", "stub": {"mode": "echo-encoded", "encoding": encoding}}))
    sent = route.header()[1].split(b" ", 1)[1]
    assert status == 502, body
    assert b"echo" not in body and sent not in body and base64.b64encode(sent).rstrip(b"=") not in body


@pytest.mark.parametrize("scheme", [Scheme.BASIC, Scheme.BEARER])
async def test_a_response_never_names_a_header_after_the_value(make_gate: GateFactory, hosts: Hosts,
                                                               scheme: Scheme) -> None:
    """A header's name may hold the value in hex: names are scanned as values are."""
    ca, route = StandInCA(), route_to(hosts, scheme)
    async with gate_with(make_gate, hosts, route, ca) as gate:
        status, headers, body = await send(gate, ca, hosts.target(BOUND), post(
            hosts.target(BOUND), payload={"model": "m", "stub": {"mode": "echo-name"}}))
    sent = route.header()[1].split(b" ", 1)[1]
    assert hosts.stub.requests, "the request reached the bound host"
    assert status == 502, body
    assert sent.hex() not in json.dumps(headers) and sent.hex().encode() not in body


async def test_client_credential_headers_are_removed_whatever_their_spelling(make_gate: GateFactory,
                                                                            hosts: Hosts) -> None:
    ca, route = StandInCA(), route_to(hosts)
    spellings = ["Private_Token", "X_Auth_Token", "x_api_key", "AUTHORIZATION", "Job-Token", "X_GITLAB_TOKEN",
                 "cOOKIE"]
    async with gate_with(make_gate, hosts, route, ca) as gate:
        status, _, _ = await send(gate, ca, hosts.target(BOUND), post(
            hosts.target(BOUND), "".join(f"{name}: {ATTACKER}\r\n" for name in spellings)))
    assert status == 200
    (request,) = hosts.stub.requests
    assert ATTACKER not in json.dumps([[n.decode(), v.decode()] for n, v in request.headers])
    assert request.header("authorization") == ["Basic " + base64.b64encode(f"x-access-token:{SECRET}".encode()).decode()]


@pytest.mark.parametrize("query", ["access_token=X", "a=1&private_token=X", "Private-Token=X", "ACCESS%5FTOKEN=X",
                                   "page=2;token=X", "oauth_token", "api-key=X"])
async def test_a_credential_in_the_query_is_refused_on_a_bound_host(make_gate: GateFactory, hosts: Hosts,
                                                                   query: str) -> None:
    ca = StandInCA()
    async with gate_with(make_gate, hosts, route_to(hosts), ca) as gate:
        status, headers, _ = await send(gate, ca, hosts.target(BOUND), post(
            hosts.target(BOUND), path=f"/v1/messages?{query.replace('X', ATTACKER)}"))
        passed, _, _ = await send(gate, ca, hosts.target(BOUND), post(hosts.target(BOUND), path="/v1/messages?page=2"))
        elsewhere, _, _ = await send(gate, ca, hosts.target(OTHER), post(
            hosts.target(OTHER), path="/v1/messages?access_token=public"))
    assert status == 403 and "a credential in the query" in headers["x-deny-reason"]
    assert ATTACKER not in headers["x-deny-reason"]
    assert passed == 200 and elsewhere == 200, "other queries, and other hosts, are untouched"
    assert [r.target for r in hosts.stub.requests] == ["/v1/messages?page=2", "/v1/messages?access_token=public"]


async def test_through_an_upstream_proxy_the_route_and_dlp_hold_as_without_one(
        make_gate: GateFactory, hosts: Hosts) -> None:
    """The proxy carries the terminated exchange; the gate still adds the value, refuses the sentinel sent
    elsewhere, and never hands the proxy the value outside TLS."""
    ca, route = StandInCA(), route_to(hosts)
    async with FakeProxy({BOUND: "127.0.0.2", OTHER: "127.0.0.2"}) as proxy, \
            gate_with(make_gate, hosts, route, ca, upstream_proxy=proxy.setting()) as gate:
        status, _, _ = await send(gate, ca, hosts.target(BOUND), post(hosts.target(BOUND)))
        leak, _, _ = await send(gate, ca, hosts.target(OTHER),
                                post(hosts.target(OTHER), f"Authorization: Bearer {route.spec.sentinel}\r\n"))
        await eventually(lambda: len(gate.records()) >= 2, what="both audit lines")
    assert (status, leak) == (200, 403)
    assert f"CONNECT {hosts.target(BOUND)} HTTP/1.1" in proxy.log, "the bound host was not reached through the proxy"
    assert [r.header("authorization") for r in hosts.stub.requests] == [
        ["Basic " + base64.b64encode(f"x-access-token:{SECRET}".encode()).decode()]]
    assert SECRET not in "".join(proxy.log + proxy.authorizations)
    assert [r["rule"] for r in gate.records() if r["method"] == "POST" and r["decision"] == "deny"] == [
        "[dlp] held-secret"]


async def test_a_bound_host_is_never_reached_on_another_port(make_gate: GateFactory, hosts: Hosts) -> None:
    """A route binds its host on its ports only; the host's other ports are refused even where the allowlist
    names them (a preset's bare name allows 80; here the stub's own port), by CONNECT and in plain HTTP, so
    the client's own credential never reaches the host beside the route."""
    route = CredentialRoute(RouteSpec("github", ((BOUND, 443),), Scheme.BEARER, "", new_sentinel("github")), SECRET)
    resolver = StaticResolver({BOUND: [ipaddress.ip_address("127.0.0.2")]})
    target = hosts.target(BOUND)
    async with make_gate(allow=(BOUND, target), allow_private=("127.0.0.0/8",), resolver=resolver,
                         ca=StandInCA(), routes=(route,)) as gate:
        reader, writer = await asyncio.open_connection(gate.proxy.host, gate.proxy.port)
        writer.write(f"GET http://{target}/ HTTP/1.1\r\nHost: {target}\r\nAuthorization: Bearer {ATTACKER}\r\n\r\n"
                     .encode())
        plain, headers = await read_head(reader)
        writer.close()
        tunnel, _, _, writer = await connect_via(gate.proxy, target)
        writer.close()
    assert plain == tunnel == 403, (plain, tunnel)
    assert f"{BOUND} is bound to credential route github on port 443: it is reached there only, never on port " \
           f"{hosts.stub.port}" in headers["x-deny-reason"]
    assert hosts.stub.requests == []


@pytest.mark.parametrize("query", ["page=2#&access_token=X", "#&private_token=X", "a=1#x&token=X"])
async def test_a_fragment_in_a_tunnels_request_target_is_refused(make_gate: GateFactory, hosts: Hosts,
                                                                 query: str) -> None:
    """What follows a '#' is the query to a server that does not cut it there (Go's net/http reads a target so):
    a credential after it would pass the query's check, so a fragment is refused, as in plain HTTP."""
    ca = StandInCA()
    async with gate_with(make_gate, hosts, route_to(hosts), ca) as gate:
        status, headers, _ = await send(gate, ca, hosts.target(BOUND), post(
            hosts.target(BOUND), path=f"/v1/messages?{query.replace('X', ATTACKER)}"))
    assert status == 400 and "a fragment (#)" in headers["x-deny-reason"]
    assert hosts.stub.requests == []
