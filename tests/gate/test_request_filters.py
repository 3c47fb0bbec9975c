"""The filters of the requests the gate reads: [[egress]] method and path rules, then DLP, in terminated
tunnels and on plain HTTP through the proxy, and DLP on the API route. Each attack checks that nothing of
a refused request reaches the upstream: no request at all, or one cut off (reset) before it completes."""

from __future__ import annotations

import asyncio
import base64
import ipaddress
import json
import secrets
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest

from claude_bottle.gate.resolver import StaticResolver
from claude_bottle.stub import StubUpstream
from tests.conftest import GateFactory, RunningGate
from tests.gate import test_inspection
from tests.gate.test_inspection import (
    HOST,
    LOOPBACK,
    StandInCA,
    Upstream,
    get,
    response,
    tls_via,
)
from tests.helpers import eventually, exchange, messages_request, parse_head, raw_server, read_all

pytestmark = pytest.mark.asyncio
upstream = test_inspection.upstream  # the HTTPS server fixture

PLAIN_HOST = "plain.example.test"
GITHUB_TOKEN = "ghp_" + "aB3dE6gH9jK2mN5pQ8sT1vW4yZ7bC0eF3hJ6"  # the format, not a real token


def tunnel_gate(make_gate: GateFactory, upstream: Upstream, ca: StandInCA | None, **options: object):  # type: ignore[no-untyped-def]
    resolver = StaticResolver({HOST: [ipaddress.ip_address("127.0.0.2")]})
    return make_gate(allow=(upstream.target,), allow_private=LOOPBACK, resolver=resolver, ca=ca,
                     extra_ca=(str(upstream.ca_file),), **options)


async def in_tunnel(gate: RunningGate, upstream: Upstream, ca: StandInCA, *requests: bytes
                    ) -> list[tuple[int, dict[str, str], bytes]]:
    """Send each request in one terminated tunnel and read its response."""
    reader, writer = await tls_via(gate, upstream.target, ca.client_context())
    answers = []
    for request in requests:
        writer.write(request)
        answers.append(await response(reader))
    writer.close()
    return answers


def post(path: str, host: str, body: bytes, extra: str = "") -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n{extra}\r\n").encode() + body


def inner(gate: RunningGate) -> list[dict[str, object]]:
    return [r for r in gate.records() if r["method"] != "CONNECT"]


# --- method and path rules ---------------------------------------------------------------------------------


async def test_a_rule_allowing_get_refuses_post_in_a_terminated_tunnel(make_gate: GateFactory,
                                                                       upstream: Upstream) -> None:
    ca = StandInCA()
    rules = (f"{upstream.target} allow GET /v1/**",)
    async with tunnel_gate(make_gate, upstream, ca, egress_rules=rules) as gate:
        got, posted = await in_tunnel(gate, upstream, ca, get("/v1/models", upstream.target),
                                      messages_request({"model": "m"}, host=upstream.target, keep_alive=True))
        records = inner(gate)
    assert got[0] == 200
    assert posted[0] == 403 and 'matches no allow rule' in posted[1]["x-deny-reason"]
    assert [(r.method, r.target) for r in upstream.stub.requests] == [("GET", "/v1/models")]
    assert [(r["method"], r["decision"], r.get("rule")) for r in records] == [
        ("GET", "allow", f"[[egress]] {upstream.target} allow GET /v1/**"),
        ("POST", "deny", f"[[egress]] {upstream.target} allow list")]


async def test_a_deny_rule_beats_an_allow_rule(make_gate: GateFactory, upstream: Upstream) -> None:
    ca = StandInCA()
    rules = (f"{upstream.target} allow * /**", f"{upstream.target} deny POST /v1/messages")
    async with tunnel_gate(make_gate, upstream, ca, egress_rules=rules) as gate:
        got, posted = await in_tunnel(gate, upstream, ca, get("/v1/models", upstream.target),
                                      messages_request({"model": "m"}, host=upstream.target, keep_alive=True))
        records = inner(gate)
    assert got[0] == 200
    assert posted[0] == 403
    assert posted[1]["x-deny-reason"] == (f'POST refused by [[egress]] {upstream.target} rule '
                                          '"deny POST /v1/messages"')
    assert [r.method for r in upstream.stub.requests] == ["GET"]
    assert records[1]["rule"] == f"[[egress]] {upstream.target} deny POST /v1/messages"
    assert records[1]["reason"] == posted[1]["x-deny-reason"]


@pytest.fixture
async def plain() -> AsyncIterator[StubUpstream]:
    """A plain-HTTP server for PLAIN_HOST."""
    async with StubUpstream("127.0.0.2") as server:
        yield server


def plain_gate(make_gate: GateFactory, port: int, **options: object):  # type: ignore[no-untyped-def]
    resolver = StaticResolver({PLAIN_HOST: [ipaddress.ip_address("127.0.0.2")]})
    return make_gate(allow=(f"{PLAIN_HOST}:{port}",), allow_private=LOOPBACK, resolver=resolver, **options)


def absolute(method: str, port: int, path: str, body: bytes = b"", extra: str = "") -> bytes:
    host = f"{PLAIN_HOST}:{port}"
    return (f"{method} http://{host}{path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n"
            f"Content-Length: {len(body)}\r\n{extra}\r\n").encode() + body


async def test_a_rule_allowing_get_refuses_post_on_plain_http(make_gate: GateFactory, plain: StubUpstream) -> None:
    rules = (f"{PLAIN_HOST}:{plain.port} allow GET /v1/**",)
    async with plain_gate(make_gate, plain.port, egress_rules=rules) as gate:
        got = parse_head(await exchange(gate.proxy, absolute("GET", plain.port, "/v1/models")))
        posted = parse_head(await exchange(gate.proxy, absolute("POST", plain.port, "/v1/messages", b"{}")))
        records = gate.records()
    assert got[0] == 200
    assert posted[0] == 403 and "matches no allow rule" in posted[1]["x-deny-reason"]
    assert [r.method for r in plain.requests] == ["GET"]
    assert [(r["decision"], r["rule"]) for r in records] == [
        ("allow", f"[[egress]] {PLAIN_HOST}:{plain.port} allow GET /v1/**"),
        ("deny", f"[[egress]] {PLAIN_HOST}:{plain.port} allow list")]


async def test_an_inspect_false_host_stays_opaque(make_gate: GateFactory, upstream: Upstream) -> None:
    """A client pinning the real certificate works there: the gate mints no leaf and sees no request."""
    ca = StandInCA()
    pinning = ssl.create_default_context()
    upstream.ca.configure_trust(pinning)
    async with tunnel_gate(make_gate, upstream, ca, no_inspect=(upstream.target,)) as gate:
        reader, writer = await tls_via(gate, upstream.target, pinning)
        writer.write(get(f"/v1/models?key={GITHUB_TOKEN}", upstream.target, "Connection: close\r\n"))
        status, _, _ = await response(reader)
        writer.close()
        await eventually(gate.records, what="the tunnel's line")
        records = gate.records()
    assert status == 200 and ca.hosts == []
    assert [r["method"] for r in records] == ["CONNECT"], "an opaque tunnel: no request is seen or audited"
    assert "TLS terminated" not in records[0]["reason"]
    assert len(upstream.stub.requests) == 1


# --- DLP ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Canary:
    name: str
    value: str  # "" for the gate's own credential, filled in once the gate runs
    rule: str

    def __str__(self) -> str:
        return self.name

    def of(self, gate: RunningGate) -> str:
        return self.value or gate.token


CANARIES = [Canary("held credential", "", "held-secret"), Canary("github token", GITHUB_TOKEN, "github-token")]


def carrying(where: str, secret: str, target: str) -> bytes:
    """A request to ``target`` (host:port) carrying ``secret`` in ``where``."""
    if where == "url":
        return get(f"/v1/models?q={secret}", target)
    if where == "header":
        return get("/v1/models", target, f"X-Note: token={secret}\r\n")
    if where == "json body":
        return post("/v1/messages", target, json.dumps({"model": "m", "note": secret}).encode())
    if where == "base64 body":
        return post("/v1/messages", target, json.dumps({"blob": base64.b64encode(secret.encode()).decode()}).encode())
    raise ValueError(where)


@pytest.mark.parametrize(("canary", "where"), [
    *((c, where) for c in CANARIES for where in ("url", "header", "json body")),
    (CANARIES[0], "base64 body"),  # formats are matched as written; held secrets in their encodings too
], ids=str)
async def test_dlp_refuses_a_canary_in_a_terminated_tunnel(make_gate: GateFactory, upstream: Upstream,
                                                           canary: Canary, where: str) -> None:
    ca = StandInCA()
    async with tunnel_gate(make_gate, upstream, ca) as gate:
        secret = canary.of(gate)
        refused, after = await in_tunnel(gate, upstream, ca, carrying(where, secret, upstream.target),
                                         get("/v1/models", upstream.target))
        records = inner(gate)
        audit = gate.audit_stream.getvalue()
    status, headers, _ = refused
    assert status == 403 and headers["x-deny-reason"].endswith(f"DLP rule {canary.rule}")
    assert secret not in headers["x-deny-reason"] and secret not in audit
    assert [r.target for r in upstream.stub.requests] == ["/v1/models"], "only the clean request went up"
    assert after[0] == 200, "the tunnel goes on after a refusal"
    assert (records[0]["decision"], records[0]["rule"]) == ("deny", f"[dlp] {canary.rule}")


@dataclass
class Recorder:
    """A raw upstream that keeps every byte it received and how each connection ended."""

    received: list[bytes] = field(default_factory=list)
    ended: list[str] = field(default_factory=list)

    async def __call__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        data = bytearray()
        self.received.append(b"")
        try:
            while chunk := await reader.read(65536):
                data += chunk
                self.received[-1] = bytes(data)
            self.ended.append("eof")
        except ConnectionError:
            self.ended.append("reset")
        writer.close()


async def test_dlp_cuts_off_a_chunked_upload_whose_canary_is_split_across_chunks(make_gate: GateFactory) -> None:
    """Plain HTTP: the body's start goes upstream as it streams, the canary's first half is held back, and
    when the second half shows it, the upstream connection is reset: the request never completes there."""
    recorder = Recorder()
    padding = b"p" * (64 * 1024)
    async with raw_server(recorder) as origin:
        resolver = StaticResolver({PLAIN_HOST: [ipaddress.ip_address(origin.host)]})
        async with make_gate(allow=(f"{PLAIN_HOST}:{origin.port}",), allow_private=LOOPBACK,
                             resolver=resolver) as gate:
            secret = gate.token.encode()
            first, second = padding + secret[:20], secret[20:] + b"\n"
            reader, writer = await asyncio.open_connection(gate.proxy.host, gate.proxy.port)
            writer.write(f"POST http://{PLAIN_HOST}:{origin.port}/upload HTTP/1.1\r\n"
                         f"Host: {PLAIN_HOST}:{origin.port}\r\nTransfer-Encoding: chunked\r\n\r\n".encode()
                         + f"{len(first):x}\r\n".encode() + first + b"\r\n")
            await writer.drain()
            await eventually(lambda: recorder.received and b"p" * 1024 in recorder.received[-1],
                             what="the body's start upstream")
            writer.write(f"{len(second):x}\r\n".encode() + second + b"\r\n0\r\n\r\n")
            await writer.drain()
            status, headers = parse_head(await read_all(reader, 3))
            writer.close()
            await eventually(lambda: recorder.ended, what="the upstream connection's end")
            record = gate.records()[-1]
    (received,) = recorder.received
    assert status == 403 and headers["x-deny-reason"].endswith("DLP rule held-secret")
    assert secret[:20] not in received, "not even the first half of the canary went upstream"
    assert not received.endswith(b"0\r\n\r\n"), "the request never completed upstream"
    assert recorder.ended == ["reset"]
    assert (record["decision"], record["rule"], record["status"]) == ("deny", "[dlp] held-secret", 403)


@pytest.mark.parametrize("canary", CANARIES, ids=lambda c: c.name)
async def test_dlp_refuses_a_canary_on_plain_http(make_gate: GateFactory, plain: StubUpstream,
                                                  canary: Canary) -> None:
    async with plain_gate(make_gate, plain.port) as gate:
        secret = canary.of(gate)
        body = json.dumps({"note": secret}).encode()
        status, headers = parse_head(await exchange(gate.proxy, absolute("POST", plain.port, "/v1/messages", body)))
    assert status == 403 and headers["x-deny-reason"].endswith(f"DLP rule {canary.rule}")
    assert plain.requests == []


async def test_dlp_refuses_a_canary_in_a_chunked_upload_in_a_tunnel(make_gate: GateFactory,
                                                                    upstream: Upstream) -> None:
    ca = StandInCA()
    async with tunnel_gate(make_gate, upstream, ca) as gate:
        reader, writer = await tls_via(gate, upstream.target, ca.client_context())
        first, second = b"x" * 40000 + b" " + GITHUB_TOKEN[:10].encode(), GITHUB_TOKEN[10:].encode()
        writer.write(f"POST /v1/messages HTTP/1.1\r\nHost: {upstream.target}\r\nTransfer-Encoding: chunked\r\n\r\n"
                     .encode() + f"{len(first):x}\r\n".encode() + first + b"\r\n")
        await writer.drain()
        await asyncio.sleep(0.2)
        writer.write(f"{len(second):x}\r\n".encode() + second + b"\r\n0\r\n\r\n")
        status, headers, _ = await response(reader)
        writer.close()
    assert status == 403 and headers["x-deny-reason"].endswith("DLP rule github-token"), headers
    assert upstream.stub.requests == []


async def test_dlp_on_the_api_route_refuses_a_canary_but_not_the_placeholder(make_gate: GateFactory,
                                                                             stub: StubUpstream) -> None:
    """The client's own credential (the bottle's sk-ant- placeholder) is stripped before the scan, and the
    real one added after it; a credential in the body is refused."""
    async with make_gate() as gate:
        placeholder = f"Authorization: Bearer sk-ant-oat01-{secrets.token_urlsafe(60)}\r\n"
        ordinary = parse_head(await exchange(gate.api, messages_request({"model": "m"}, placeholder)))
        leaked = await exchange(gate.api, messages_request(
            {"model": "m", "messages": [{"role": "user", "content": f"here: {GITHUB_TOKEN}"}]}, placeholder))
        reflected = await exchange(gate.api, messages_request({"model": "m", "note": gate.token}))
        records = gate.records()
    assert ordinary[0] == 200
    status, _ = parse_head(leaked)
    assert status == 403 and b"DLP rule github-token" in leaked and b"permission_error" in leaked
    assert parse_head(reflected)[0] == 403 and b"DLP rule held-secret" in reflected
    assert len(stub.requests) == 1
    assert [r.get("rule") for r in records] == [None, "[dlp] github-token", "[dlp] held-secret"]


async def test_a_dlp_rule_turned_off_lets_its_format_through(make_gate: GateFactory, upstream: Upstream) -> None:
    ca = StandInCA()
    async with tunnel_gate(make_gate, upstream, ca, dlp_off=("github-token",)) as gate:
        (answer,) = await in_tunnel(gate, upstream, ca, carrying("header", GITHUB_TOKEN, upstream.target))
    assert answer[0] == 200 and upstream.stub.requests[0].header("x-note") == [f"token={GITHUB_TOKEN}"]

