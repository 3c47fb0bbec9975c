"""The API listener on loopback, against the stub Messages API: every promise of the route, and the attacks."""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
import time
from pathlib import Path

import pytest
import trustme

from claude_bottle.gate.settings import Endpoint
from claude_bottle.stub import StubUpstream
from tests.conftest import GateFactory
from tests.helpers import (
    eventually,
    exchange,
    make_token,
    messages_request,
    parse_head,
    raw_server,
    read_all,
    read_head,
)

pytestmark = pytest.mark.asyncio

STREAM = {"model": "claude-test", "stream": True, "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]}


async def test_oauth_token_injected_as_bearer_and_every_client_credential_stripped(
    make_gate: GateFactory, stub: StubUpstream
) -> None:
    client_credentials = (
        "Authorization: Bearer sk-ant-oat01-client-placeholder\r\n"
        "authorization: Basic YWRtaW46YWRtaW4=\r\n"
        "X-Api-Key: sk-ant-api03-attacker-own-key\r\n"
        "x-API-KEY: second\r\n"
        "Proxy-Authorization: Basic Zm9vOmJhcg==\r\n"
        "Cookie: session=stolen\r\n"
        "COOKIE: more=1\r\n"
    )
    async with make_gate() as gate:
        response = await exchange(gate.api, messages_request({"model": "m"}, client_credentials), timeout=2)
    assert parse_head(response)[0] == 200
    (seen,) = stub.requests
    assert seen.header("authorization") == [f"Bearer {gate.token}"]
    for name in ("x-api-key", "proxy-authorization", "cookie"):
        assert seen.header(name) == [], name
    assert b"attacker" not in b"".join(v for _, v in seen.headers)


async def test_client_credential_headers_are_stripped_whatever_their_spelling(
    make_gate: GateFactory, stub: StubUpstream
) -> None:
    """A server that reads '_' as '-' (CGI-style stacks) would take ``X_Api_Key`` for x-api-key: the agent's own
    key must not reach the API under any spelling, whether or not DLP knows its format."""
    spellings = ["X_Api_Key", "x-API_key", "Proxy_Authorization", "AUTHORIZATION", "Private_Token", "X_AUTH_TOKEN",
                 "api_key", "cOOKIE"]
    values = ["attacker-own-key-0123456789", "sk-ant-api03-attacker-own-key"]
    sent = "".join(f"{name}: {values[i % 2]}\r\n" for i, name in enumerate(spellings))
    async with make_gate() as gate:
        response = await exchange(gate.api, messages_request({"model": "m"}, sent), timeout=2)
    assert parse_head(response)[0] == 200
    (seen,) = stub.requests
    assert b"attacker" not in b"".join(n + b": " + v for n, v in seen.headers)
    assert seen.header("authorization") == [f"Bearer {gate.token}"]


async def test_api_key_injected_as_x_api_key(make_gate: GateFactory, stub: StubUpstream) -> None:
    key = make_token("api")
    async with make_gate(token=key) as gate:
        await exchange(gate.api, messages_request({"model": "m"}, "x-api-key: sk-ant-api03-placeholder\r\n"), 2)
    (seen,) = stub.requests
    assert seen.header("x-api-key") == [key]
    assert seen.header("authorization") == []


async def test_end_to_end_headers_pass_untouched_and_hop_by_hop_removed(
    make_gate: GateFactory, stub: StubUpstream
) -> None:
    end_to_end = {
        "anthropic-version": "2023-06-01",
        "anthropic-beta": "claude-code-20250219,oauth-2025-04-20,interleaved-thinking-2025-05-14",
        "X-Claude-Code-Session-Id": "7d3c5a8e-0f4e-4a51-9d5b-2b8f6f7c1e90",
        "User-Agent": "claude-cli/2.1.126 (external, cli)",
        "x-stainless-retry-count": "0",
        "anthropic-dangerous-direct-browser-access": "true",
    }
    hop = "Connection: keep-alive, X-Hop-Secret\r\nX-Hop-Secret: 1\r\nKeep-Alive: timeout=5\r\nTE: trailers\r\n" \
          "Upgrade: h2c\r\nProxy-Connection: keep-alive\r\n"
    extra = "".join(f"{k}: {v}\r\n" for k, v in end_to_end.items()) + hop
    async with make_gate() as gate:
        await exchange(gate.api, messages_request({"model": "m"}, extra, host="evil.example", keep_alive=True), 1)
    (seen,) = stub.requests
    for name, value in end_to_end.items():
        assert seen.header(name) == [value], name
    assert seen.header("host") == [f"127.0.0.1:{stub.port}"]
    for name in ("connection", "x-hop-secret", "keep-alive", "te", "upgrade", "proxy-connection"):
        assert seen.header(name) == [], name


async def test_sse_events_reach_the_client_as_the_upstream_sends_them(make_gate: GateFactory) -> None:
    """Buffering would deliver the events together at the end; each must arrive close to when it was sent."""
    events, interval = 6, 0.3
    payload = {**STREAM, "stub": {"events": events, "interval": interval}}
    async with make_gate() as gate:
        reader, writer = await asyncio.open_connection(gate.api.host, gate.api.port)
        writer.write(messages_request(payload))
        status, headers = await read_head(reader)
        assert status == 200 and headers["content-type"] == "text/event-stream"
        delays = []
        async with asyncio.timeout(10):
            while len(delays) < events:
                line = await reader.readline()
                if line.startswith(b": sent_ns="):
                    delays.append((time.time_ns() - int(line.split(b"=")[1])) / 1e9)
        writer.close()
    assert max(delays) < interval / 2, f"events were held back: delays {delays}"


async def test_request_body_streams_to_the_upstream_before_the_client_finishes(make_gate: GateFactory) -> None:
    """On a path the body policy does not read (one added with --allow-api-path). DLP holds back only its
    tail (about 11 KB): the start of a larger first part goes upstream while the client is still sending."""
    first_chunk_seen = asyncio.Event()
    part = 64 * 1024

    async def upstream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        await reader.readuntil(b"x" * 1024)
        first_chunk_seen.set()
        await reader.readuntil(b"\r\n0\r\n\r\n")  # the rest, once the client sends it
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
        await writer.drain()
        writer.close()

    async with raw_server(upstream, "127.0.0.1") as origin, \
            make_gate(upstream=f"http://{origin}", api_paths=("POST /v1/upload",)) as gate:
        reader, writer = await asyncio.open_connection(gate.api.host, gate.api.port)
        writer.write(b"POST /v1/upload HTTP/1.1\r\nHost: g\r\nTransfer-Encoding: chunked\r\n\r\n"
                     + f"{part:x}\r\n".encode() + b"x" * part + b"\r\n")
        await writer.drain()
        await asyncio.wait_for(first_chunk_seen.wait(), 3)  # the rest of the body is not even sent yet
        writer.write(b"0\r\n\r\n")
        status, _ = await read_head(reader)
        writer.close()
    assert status == 200


async def test_upstream_connections_are_reused(make_gate: GateFactory, stub: StubUpstream) -> None:
    async with make_gate() as gate:
        for _ in range(5):
            assert parse_head(await exchange(gate.api, messages_request({"model": "m"}), 1))[0] == 200
    assert len(stub.requests) == 5
    assert len({r.peer for r in stub.requests}) == 1, "each request opened a new upstream connection"


@pytest.mark.parametrize("method", ["TRACE", "CONNECT"])
async def test_trace_and_connect_refused(make_gate: GateFactory, stub: StubUpstream, method: str) -> None:
    target = "api.anthropic.com:443" if method == "CONNECT" else "/v1/messages"
    async with make_gate() as gate:
        response = await exchange(gate.api, f"{method} {target} HTTP/1.1\r\nHost: g\r\nConnection: close\r\n\r\n".encode(), 2)
    status, headers = parse_head(response)
    assert status == 405 and method in headers["x-deny-reason"]
    assert stub.requests == []


async def test_paths_claude_code_does_not_use_are_refused(make_gate: GateFactory, stub: StubUpstream) -> None:
    async with make_gate() as gate:
        response = await exchange(gate.api, b"GET /v1/organizations/me HTTP/1.1\r\nHost: g\r\nConnection: close\r\n\r\n", 2)
        status, headers = parse_head(response)
        assert status == 403 and "--allow-api-path" in headers["x-deny-reason"]
        assert gate.records()[-1]["decision"] == "deny"
    assert stub.requests == []
    async with make_gate(api_paths=("GET /v1/organizations/me",)) as gate:
        response = await exchange(gate.api, b"GET /v1/organizations/me HTTP/1.1\r\nHost: g\r\nConnection: close\r\n\r\n", 2)
    assert parse_head(response)[0] == 404  # forwarded: the stub itself has no such route
    assert [r.target for r in stub.requests] == ["/v1/organizations/me"]


@pytest.mark.parametrize("target", ["/v1/messages/../admin", "/v1/%2e%2e/admin", "/v1//messages",
                                    "http://evil.example/v1/messages", "/v1/messages%2Fcount_tokens"])
async def test_non_canonical_paths_refused(make_gate: GateFactory, stub: StubUpstream, target: str) -> None:
    async with make_gate() as gate:
        response = await exchange(gate.api, f"POST {target} HTTP/1.1\r\nHost: g\r\nConnection: close\r\n\r\n".encode(), 2)
    assert parse_head(response)[0] == 400
    assert stub.requests == []


@pytest.mark.parametrize("mode", ["echo", "echo-header", "echo-name", "echo-split"])
async def test_reflected_credential_is_never_delivered(make_gate: GateFactory, stub: StubUpstream, mode: str) -> None:
    async with make_gate() as gate:
        response = await exchange(gate.api, messages_request({"model": "m", "stub": {"mode": mode}}), 3)
        record = gate.records()[-1]
    assert stub.requests, "the request reached the upstream"
    assert gate.token.encode() not in response and gate.token.encode().hex().encode() not in response
    assert gate.token[:12].encode() not in response, "a prefix of the credential leaked"
    assert "credential" in record["reason"] and record["decision"] == "error"


async def test_encoded_response_refused_because_it_cannot_be_scanned(make_gate: GateFactory, stub: StubUpstream) -> None:
    async with make_gate() as gate:
        response = await exchange(gate.api, messages_request({"model": "m", "stub": {"mode": "gzip"}}), 2)
    status, headers = parse_head(response)
    assert status == 502 and "encoded" in headers["x-deny-reason"]
    assert stub.requests[0].header("accept-encoding") == ["identity"]


@pytest.mark.parametrize("spelling", [b"CONTENT-ENCODING: GZIP", b"Content-Encoding:  Gzip \t", b"content-encoding: br"])
async def test_an_encoded_response_is_refused_however_the_header_is_spelled(make_gate: GateFactory,
                                                                           spelling: bytes) -> None:
    async def upstream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        await reader.readuntil(b"}]}")
        writer.write(b"HTTP/1.1 200 OK\r\n" + spelling + b"\r\ncontent-length: 4\r\n\r\n\x1f\x8b\x08\x00")
        await writer.drain()

    async with raw_server(upstream, "127.0.0.1") as origin, make_gate(upstream=f"http://{origin}") as gate:
        response = await exchange(gate.api, messages_request({"model": "m", "messages": [{"role": "user", "content": []}]}), 2)
    status, headers = parse_head(response)
    assert status == 502 and "encoded" in headers["x-deny-reason"]
    assert b"\x1f\x8b" not in response


async def test_upstream_refusing_connections_gives_502_and_the_gate_stays_up(make_gate: GateFactory) -> None:
    async with raw_server(lambda r, w: w.close(), "127.0.0.1") as closed:
        pass  # the port is free again: nothing listens there now
    async with make_gate(upstream=f"http://{closed}") as gate:
        for _ in range(2):
            status, headers = parse_head(await exchange(gate.api, messages_request({"model": "m"}), 3))
            assert status == 502 and "connect" in headers["x-deny-reason"]


async def test_silent_upstream_gives_504(make_gate: GateFactory) -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await asyncio.sleep(10)

    async with raw_server(silent, "127.0.0.1") as origin, make_gate(upstream=f"http://{origin}", idle_timeout=0.5) as gate:
        status, headers = parse_head(await exchange(gate.api, messages_request({"model": "m"}), 5))
    assert status == 504 and "responding" in headers["x-deny-reason"]


async def test_garbage_from_upstream_gives_502(make_gate: GateFactory) -> None:
    async def garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"\x00\x01 not http at all\r\n\r\n")
        await writer.drain()
        writer.close()

    async with raw_server(garbage, "127.0.0.1") as origin, make_gate(upstream=f"http://{origin}") as gate:
        status, _ = parse_head(await exchange(gate.api, messages_request({"model": "m"}), 3))
    assert status == 502


@pytest.mark.parametrize("when", ["with its answer", "once idle"])
async def test_a_response_the_upstream_sends_unasked_answers_no_later_request(make_gate: GateFactory,
                                                                                when: str) -> None:
    """An upstream that sends a second response after its answer to the first request (in the same write, or
    later while the connection waits in the pool) would have the next request answered with it, and every
    one after that with the answer to the one before: that connection is never used again."""
    unasked = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 7\r\n\r\nunasked"
    answered = 0

    async def origin(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal answered
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            while True:
                _, headers = parse_head(b"HTTP/1.1 000 x\r\n" + (await reader.readuntil(b"\r\n\r\n")).split(b"\r\n", 1)[1])
                await reader.readexactly(int(headers["content-length"]))
                answered += 1
                body = b'{"n": %d}' % answered
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%b"
                             % (len(body), body) + (unasked if answered == 1 and when == "with its answer" else b""))
                await writer.drain()
                if answered == 1 and when == "once idle":
                    await asyncio.sleep(0.1)
                    writer.write(unasked)

    async with raw_server(origin, "127.0.0.1") as upstream, make_gate(upstream=f"http://{upstream}") as gate:
        reader, writer = await asyncio.open_connection(gate.api.host, gate.api.port)
        try:
            bodies = []
            for _ in range(3):
                writer.write(messages_request({"model": "m"}, keep_alive=True))
                _, headers = await read_head(reader)
                bodies.append(await reader.readexactly(int(headers["content-length"])))
                await asyncio.sleep(0.3)
        finally:
            writer.close()
    assert bodies == [b'{"n": 1}', b'{"n": 2}', b'{"n": 3}']


async def test_upstream_vanishing_mid_stream_cuts_the_client_and_the_gate_keeps_serving(
    make_gate: GateFactory,
) -> None:
    payload = {**STREAM, "stub": {"events": 6, "mode": "vanish"}}
    async with make_gate() as gate:
        response = await exchange(gate.api, messages_request(payload), 3)
        assert parse_head(response)[0] == 200
        assert not response.endswith(b"0\r\n\r\n"), "a cut stream must not look complete"
        assert b"message_stop" not in response
        assert parse_head(await exchange(gate.api, messages_request({"model": "m"}), 2))[0] == 200
        assert gate.records()[0]["decision"] == "error"


async def test_client_vanishing_mid_stream_is_audited_and_cleaned_up(make_gate: GateFactory) -> None:
    payload = {**STREAM, "stub": {"events": 20, "interval": 0.1}}
    async with make_gate() as gate:
        tasks_before = len(asyncio.all_tasks())
        reader, writer = await asyncio.open_connection(gate.api.host, gate.api.port)
        writer.write(messages_request(payload))
        await read_head(reader)
        writer.transport.abort()
        await eventually(lambda: gate.records() and len(asyncio.all_tasks()) <= tasks_before,
                         what="the connection to end, its task with it")
        (record,) = gate.records()
    assert record["decision"] == "error" and "went away" in record["reason"]


async def test_keep_alive_serves_several_requests_on_one_client_connection(make_gate: GateFactory) -> None:
    async with make_gate() as gate:
        reader, writer = await asyncio.open_connection(gate.api.host, gate.api.port)
        for _ in range(3):
            writer.write(messages_request({"model": "m"}, keep_alive=True))
            status, headers = await read_head(reader)
            await reader.readexactly(int(headers["content-length"]))
            assert status == 200
        writer.close()
        assert len(gate.records()) == 3


async def test_audit_has_one_complete_line_per_request(make_gate: GateFactory) -> None:
    async with make_gate() as gate:
        await exchange(gate.api, messages_request({**STREAM, "stub": {"events": 3}}), 2)
        await exchange(gate.api, b"GET /nope?key=sk-ant-secret HTTP/1.1\r\nHost: g\r\nConnection: close\r\n\r\n", 2)
        allowed, denied = gate.records()
    for record in (allowed, denied):
        assert set(record) == {"version", "seq", "time", "listener", "client", "method", "target", "path", "decision",
                               "reason", "status", "bytes_up", "bytes_down", "duration_ms"}
        assert record["listener"] == "api"
    assert allowed["decision"] == "allow" and allowed["status"] == 200 and allowed["bytes_down"] > 300
    assert allowed["bytes_up"] == len(json.dumps({**STREAM, "stub": {"events": 3}}))
    assert denied["path"] == "/nope", "the query string is never audited"
    assert (allowed["seq"], denied["seq"]) == (1, 2)


async def whole_response(endpoint: Endpoint, request: bytes) -> bytes:
    """Send ``request`` (``Connection: close``) and read until the gate ends the response by closing. The
    bound only catches a hang: a response cut short by the reader's own clock is not the gate's doing."""
    reader, writer = await asyncio.open_connection(endpoint.host, endpoint.port)
    try:
        writer.write(request)
        await writer.drain()
        async with asyncio.timeout(60):
            return await reader.read()
    finally:
        writer.close()


async def test_streams_in_flight_survive_many_parallel_clients(make_gate: GateFactory) -> None:
    """Forty streams at once each get their whole response. Each client waits for its response's end, not a
    fixed time: on a loaded two-core machine the forty took over 3 s of the 5 s a timed read allowed."""
    payload = {**STREAM, "stub": {"events": 5, "interval": 0.02}}
    async with make_gate() as gate:
        responses = await asyncio.gather(*(whole_response(gate.api, messages_request(payload)) for _ in range(40)))
    assert all(parse_head(r)[0] == 200 and b"message_stop" in r for r in responses)


async def test_response_read_after_body_is_complete(make_gate: GateFactory) -> None:
    """A chunked client body is re-framed for the upstream and arrives whole."""
    async with make_gate() as gate:
        reader, writer = await asyncio.open_connection(gate.api.host, gate.api.port)
        body = json.dumps({"model": "m"}).encode()
        writer.write(b"POST /v1/messages HTTP/1.1\r\nHost: g\r\nTransfer-Encoding: chunked\r\n\r\n"
                     + f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n")
        status, _ = await read_head(reader)
        writer.close()
        await read_all(reader, 0.1)
    assert status == 200


@pytest.mark.parametrize("trusted", [True, False])
async def test_https_upstream_is_verified_against_system_and_extra_cas(
    make_gate: GateFactory, tmp_path: Path, trusted: bool
) -> None:
    """An upstream behind a private CA (corporate TLS inspection) works once --extra-ca names that CA."""
    ca = trustme.CA()
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("localhost").configure_cert(server_context)
    ca_file = tmp_path / "corporate-ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    async with StubUpstream("localhost", tls=server_context) as tls_stub, make_gate(
        upstream=tls_stub.url, extra_ca=(str(ca_file),) if trusted else ()
    ) as gate:
        status, headers = parse_head(await exchange(gate.api, messages_request({"model": "m"}), 3))
    if trusted:
        assert status == 200 and tls_stub.requests[0].header("authorization") == [f"Bearer {gate.token}"]
    else:
        assert status == 502 and "TLS" in headers["x-deny-reason"]
        assert tls_stub.requests == []
