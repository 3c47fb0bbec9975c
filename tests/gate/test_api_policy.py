"""The API route's exfiltration channels, attacked on loopback: provider-side fetches in the request body, the
credential in the status line, and framing that used to break after the head had gone upstream."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from claude_bottle.stub import StubUpstream
from tests.conftest import GateFactory
from tests.helpers import exchange, messages_request, parse_head, raw_server, read_all, read_head

pytestmark = pytest.mark.asyncio

HI = {"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]}
MCP = {**HI, "mcp_servers": [{"type": "url", "url": "https://collector.example/sse", "name": "c",
                              "authorization_token": "bottle-data"}]}
WEB_FETCH = {**HI, "tools": [{"type": "web_fetch_20250910", "name": "web_fetch"}]}
CODE = {**HI, "tools": [{"type": "code_execution_20250825", "name": "code_execution"}]}


def body_of(response: bytes) -> Any:
    return json.loads(response.split(b"\r\n\r\n", 1)[1])


@pytest.mark.parametrize(("payload", "words"), [
    (MCP, "mcp_servers is refused"),
    (WEB_FETCH, "server tool web_fetch_20250910 is refused"),
    (CODE, "server tool code_execution_20250825 is refused"),
])
@pytest.mark.parametrize("path", ["/v1/messages", "/v1/messages/count_tokens?beta=true"])
async def test_provider_side_fetch_is_refused_before_the_upstream(
    make_gate: GateFactory, stub: StubUpstream, payload: dict[str, Any], words: str, path: str
) -> None:
    async with make_gate() as gate:
        request = messages_request(payload).replace(b"POST /v1/messages ", f"POST {path} ".encode(), 1)
        response = await exchange(gate.api, request, 2)
    status, headers = parse_head(response)
    assert status == 403 and words in headers["x-deny-reason"]
    assert headers["content-type"] == "application/json"
    error = body_of(response)["error"]
    assert error["type"] == "permission_error"
    assert error["message"].startswith("Blocked by the user's claude-bottle policy, not by the network: "
                                       f"{headers['x-deny-reason']}.")
    assert stub.requests == []
    (record,) = gate.records()
    assert record["decision"] == "deny" and record["status"] == 403 and words in record["reason"]


async def test_an_opted_in_server_tool_passes_and_the_others_stay_refused(
    make_gate: GateFactory, stub: StubUpstream
) -> None:
    async with make_gate(server_tools=("web_fetch",)) as gate:
        allowed = await exchange(gate.api, messages_request(WEB_FETCH), 2)
        refused = await exchange(gate.api, messages_request(CODE), 2)
        mcp = await exchange(gate.api, messages_request(MCP), 2)
    assert parse_head(allowed)[0] == 200
    assert parse_head(refused)[0] == 403 and parse_head(mcp)[0] == 403
    assert [r.json()["tools"][0]["type"] for r in stub.requests] == ["web_fetch_20250910"]
    assert "server tools opted in: web_fetch" in gate.records()[0]["reason"]


async def test_an_ordinary_request_passes_with_both_reasons_audited(make_gate: GateFactory, stub: StubUpstream) -> None:
    async with make_gate() as gate:
        response = await exchange(gate.api, messages_request(HI), 2)
    assert parse_head(response)[0] == 200
    (seen,) = stub.requests
    assert seen.json() == HI
    (record,) = gate.records()
    assert record["reason"] == ("POST /v1/messages is an allowed API path; no provider-side fetch or code "
                                "execution asked")


async def test_nothing_of_a_small_streamed_body_goes_upstream_until_it_is_judged(make_gate: GateFactory) -> None:
    received: list[bytes] = []

    async def upstream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        received.append(await reader.readuntil(b"\r\n\r\n"))
        received.append(await reader.readuntil(b"\r\n0\r\n\r\n"))  # the body, chunked as the client sent it
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
        await writer.drain()
        writer.close()

    first, rest = json.dumps(HI).encode()[:20], json.dumps(HI).encode()[20:]
    async with raw_server(upstream, "127.0.0.1") as origin, make_gate(upstream=f"http://{origin}") as gate:
        reader, writer = await asyncio.open_connection(gate.api.host, gate.api.port)
        writer.write(b"POST /v1/messages HTTP/1.1\r\nHost: g\r\nTransfer-Encoding: chunked\r\n\r\n"
                     + f"{len(first):x}\r\n".encode() + first + b"\r\n")
        await writer.drain()
        await asyncio.sleep(0.3)
        assert received == [], "a part of the body went upstream before the verdict"
        writer.write(f"{len(rest):x}\r\n".encode() + rest + b"\r\n0\r\n\r\n")
        status, _ = await read_head(reader)
        writer.close()
    assert status == 200
    assert b"transfer-encoding: chunked" in received[0].lower()
    size, chunk, end = received[1].split(b"\r\n", 2)
    assert int(size, 16) == len(chunk) and end == b"0\r\n\r\n" and json.loads(chunk) == HI


async def test_a_body_over_the_limit_gets_413_without_being_read(make_gate: GateFactory, stub: StubUpstream) -> None:
    async with make_gate(max_body_bytes=1000) as gate:
        reader, writer = await asyncio.open_connection(gate.api.host, gate.api.port)
        writer.write(b"POST /v1/messages HTTP/1.1\r\nHost: g\r\nContent-Length: 1001\r\n\r\n")  # no body sent
        await writer.drain()
        declared = await read_all(reader, 2)
        writer.close()
        fits = await exchange(gate.api, messages_request(HI), 2)
    status, headers = parse_head(declared)
    assert status == 413 and headers["connection"] == "close"
    assert body_of(declared)["error"]["type"] == "request_too_large"
    assert parse_head(fits)[0] == 200 and len(stub.requests) == 1
    records = gate.records()
    assert records[0]["decision"] == "deny" and records[0]["status"] == 413
    assert "larger than 1000 bytes" in records[0]["reason"]


async def test_a_body_over_the_limit_in_chunks_gets_413(make_gate: GateFactory, stub: StubUpstream) -> None:
    piece = b"x" * 600
    chunk = f"{len(piece):x}\r\n".encode() + piece + b"\r\n"
    async with make_gate(max_body_bytes=1000) as gate:
        response = await exchange(gate.api, b"POST /v1/messages HTTP/1.1\r\nHost: g\r\nTransfer-Encoding: chunked"
                                            b"\r\n\r\n" + chunk * 3 + b"0\r\n\r\n", 2)
    assert parse_head(response)[0] == 413
    assert stub.requests == []
    assert gate.records()[0]["status"] == 413


async def test_a_request_without_a_body_goes_up_without_framing_headers(make_gate: GateFactory, stub: StubUpstream
                                                                         ) -> None:
    async with make_gate() as gate:
        response = await exchange(gate.api, b"GET /v1/models HTTP/1.1\r\nHost: g\r\n\r\n", 2)
    assert parse_head(response)[0] == 200
    (seen,) = stub.requests
    assert seen.header("content-length") == [] and seen.header("transfer-encoding") == []


@pytest.mark.parametrize("reflected", ["authorization", "x-api-key"])
async def test_the_upstream_reason_phrase_never_reaches_the_client(
    make_gate: GateFactory, stub: StubUpstream, reflected: str
) -> None:
    """The stub answers ``HTTP/1.1 200 Bearer sk-ant-…``: the real credential, in the status line."""
    token = None if reflected == "authorization" else "sk-ant-api03-" + "k" * 80
    async with make_gate(token=token) as gate:
        response = await exchange(gate.api, messages_request({**HI, "stub": {"mode": "echo-reason"}}), 2)
    status_line = response.split(b"\r\n", 1)[0]
    assert status_line == b"HTTP/1.1 200 OK"
    assert gate.token.encode() not in response
    (seen,) = stub.requests
    assert seen.header(reflected)  # the stub got the credential, so the attack was real


async def test_an_unknown_status_keeps_no_reason_phrase(make_gate: GateFactory) -> None:
    async def upstream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 599 leaked words\r\ncontent-length: 0\r\n\r\n")
        await writer.drain()
        writer.close()

    async with raw_server(upstream, "127.0.0.1") as origin, make_gate(upstream=f"http://{origin}") as gate:
        response = await exchange(gate.api, b"GET /v1/models HTTP/1.1\r\nHost: g\r\nConnection: close\r\n\r\n", 2)
    assert response.split(b"\r\n", 1)[0] == b"HTTP/1.1 599 "


FRAMING = [
    # (id, request, words in the reason)
    ("Connection names Content-Length",
     b"POST /v1/messages HTTP/1.1\r\nHost: g\r\nConnection: content-length\r\nContent-Length: 2\r\n\r\n{}",
     "names content-length"),
    ("Connection names Transfer-Encoding",
     b"POST /v1/messages HTTP/1.1\r\nHost: g\r\nConnection: keep-alive, Transfer-Encoding\r\n"
     b"Transfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n", "names transfer-encoding"),
    ("Connection names Host", b"GET /v1/models HTTP/1.1\r\nHost: g\r\nConnection: host\r\n\r\n", "names host"),
    ("Connection names Content-Length on a streamed path",
     b"GET /v1/models HTTP/1.1\r\nHost: g\r\nConnection: Content-Length\r\nContent-Length: 1\r\n\r\nx",
     "names content-length"),
    ("a Content-Length that is not a number",
     b"POST /v1/messages HTTP/1.1\r\nHost: g\r\nContent-Length: 2x\r\n\r\n{}", "malformed request"),
    ("two different Content-Lengths",
     b"POST /v1/messages HTTP/1.1\r\nHost: g\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}",
     "malformed request"),
    ("Content-Length and Transfer-Encoding",
     b"POST /v1/messages HTTP/1.1\r\nHost: g\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n{}",
     "both Content-Length and Transfer-Encoding"),
    ("no Host", b"GET /v1/models HTTP/1.1\r\n\r\n", "malformed request"),
    ("an absolute-form target", b"GET http://g/v1/models HTTP/1.1\r\nHost: g\r\n\r\n", "canonical"),
    ("an asterisk target", b"OPTIONS * HTTP/1.1\r\nHost: g\r\n\r\n", "canonical"),
    ("a fragment in the target", b"GET /v1/models#x HTTP/1.1\r\nHost: g\r\n\r\n", ""),
    ("a space in the target", b"GET /v1/mod els HTTP/1.1\r\nHost: g\r\n\r\n", "malformed request"),
    ("a body that is not JSON",
     b"POST /v1/messages HTTP/1.1\r\nHost: g\r\nContent-Length: 5\r\n\r\nhello", "not a plain JSON object"),
    ("a chunk size that is not hex",
     b"POST /v1/messages HTTP/1.1\r\nHost: g\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n",
     "chunk size"),
]


@pytest.mark.parametrize(("request_", "words"), [c[1:] for c in FRAMING], ids=[c[0] for c in FRAMING])
async def test_bad_framing_or_target_gets_400_before_anything_goes_upstream(
    make_gate: GateFactory, request_: bytes, words: str
) -> None:
    arrived: list[bytes] = []

    async def upstream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        arrived.append(await reader.read(65536))
        writer.close()

    async with raw_server(upstream, "127.0.0.1") as origin, make_gate(upstream=f"http://{origin}") as gate:
        response = await exchange(gate.api, request_, 2)
    status, headers = parse_head(response)
    assert status == 400, response[:200]
    assert arrived == [], "something went upstream"
    (record,) = gate.records()
    assert record["decision"] in ("deny", "error") and record["status"] == 400
    assert record["reason"] and words in record["reason"] and not record["reason"].startswith(";")
    assert words in headers["x-deny-reason"]
    assert body_of(response)["error"]["type"] == "invalid_request_error"


async def test_a_fault_of_the_gate_is_audited_with_a_reason_and_answered_500(
    make_gate: GateFactory, stub: StubUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with make_gate() as gate:
        def broken(*args: object) -> None:
            raise RuntimeError("policy exploded")

        monkeypatch.setattr(type(gate.gate.config.messages_policy), "decide", broken)
        response = await exchange(gate.api, messages_request(HI), 2)
    assert parse_head(response)[0] == 500
    assert stub.requests == []
    (record,) = gate.records()
    assert record["decision"] == "error" and record["status"] == 500
    assert "gate error: RuntimeError: policy exploded" in record["reason"]


async def test_a_client_that_stalls_in_a_messages_body_is_audited_with_a_reason(
    make_gate: GateFactory, stub: StubUpstream
) -> None:
    async with make_gate(idle_timeout=0.3) as gate:
        reader, writer = await asyncio.open_connection(gate.api.host, gate.api.port)
        writer.write(b"POST /v1/messages HTTP/1.1\r\nHost: g\r\nContent-Length: 100\r\n\r\n{\"model\"")
        await writer.drain()
        await read_all(reader, 2)
        writer.close()
    assert stub.requests == []
    (record,) = gate.records()
    assert record["reason"].endswith("then client idle too long") and record["status"] == 408
