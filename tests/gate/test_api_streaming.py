"""A large Messages body streams upstream as it arrives, its end held back until the whole body is judged,
attacked on loopback with a recording upstream: a refused body never reaches the upstream whole (nor its JSON's
closing byte), that connection is closed and never reused; an allowed one arrives byte for byte."""

from __future__ import annotations

import asyncio
import json
import re
from dataclasses import dataclass, field

import pytest

from tests.conftest import GateFactory, RunningGate
from tests.helpers import eventually, raw_server, read_all, read_head

pytestmark = pytest.mark.asyncio

HELD_BACK = 64 * 1024  # gate/api.py's: at least this much of a streamed body's end waits for the verdict
FILLER = "x" * 300_000  # a conversation long enough to stream: several times what is held back
OK = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"


def messages_body(**extra: object) -> bytes:
    return json.dumps({"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": FILLER}],
                       **extra}).encode()


def request_end(data: bytes | bytearray) -> int | None:
    """Where the first request in ``data`` ends, or None while it is not complete."""
    head_end = data.find(b"\r\n\r\n")
    if head_end < 0:
        return None
    head, at = bytes(data[:head_end]).lower(), head_end + 4
    if b"transfer-encoding: chunked" in head:
        while (line_end := data.find(b"\r\n", at)) >= 0:
            size = int(data[at:line_end], 16)
            at = line_end + 2 + size + 2
            if at > len(data):
                return None
            if size == 0:
                return at
        return None
    length = re.search(rb"content-length: *(\d+)", head)
    end = at + (int(length.group(1)) if length else 0)
    return end if len(data) >= end else None


def body_received(data: bytes | bytearray) -> bytes:
    """The body bytes of the (first, maybe incomplete) request in ``data``, its chunk framing undone."""
    head_end = data.find(b"\r\n\r\n")
    if head_end < 0:
        return b""
    rest = bytes(data[head_end + 4 :])
    if b"transfer-encoding: chunked" not in bytes(data[:head_end]).lower():
        return rest
    body, at = b"", 0
    while (line_end := rest.find(b"\r\n", at)) >= 0:
        size = int(rest[at:line_end], 16)
        body += rest[line_end + 2 : line_end + 2 + size]
        at = line_end + 2 + size + 2
    return body


@dataclass
class Recording:
    """An upstream that records what each connection received and how it ended; it answers each complete
    request with 200 (or, ``early``, as soon as a head arrives) and keeps the connection open."""

    early: bool = False
    connections: int = 0
    received: list[bytearray] = field(default_factory=list)  # what arrived, request by request
    requests: list[bytes] = field(default_factory=list)  # the complete ones
    ended: list[str] = field(default_factory=list)

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                got = bytearray()
                self.received.append(got)
                answered = False
                while (end := request_end(got)) is None:
                    if not (data := await reader.read(65536)):
                        self.ended.append("closed")
                        return
                    got += data
                    if self.early and not answered and b"\r\n\r\n" in got:
                        writer.write(OK)
                        answered = True
                self.requests.append(bytes(got[:end]))
                if not answered:
                    writer.write(OK)
                await writer.drain()
        except ConnectionError:
            self.ended.append("reset")
        finally:
            writer.close()


def framed(body: bytes, chunked: bool) -> tuple[bytes, list[bytes]]:
    """The request head and its body in pieces as the client sends them."""
    framing = "Transfer-Encoding: chunked" if chunked else f"Content-Length: {len(body)}"
    head = f"POST /v1/messages HTTP/1.1\r\nHost: gate\r\nContent-Type: application/json\r\nConnection: close\r\n{framing}\r\n\r\n"
    pieces = [body[at : at + 50_000] for at in range(0, len(body), 50_000)]
    if chunked:
        pieces = [f"{len(p):x}\r\n".encode() + p + b"\r\n" for p in pieces] + [b"0\r\n\r\n"]
    return head.encode(), pieces


async def send(gate: RunningGate, body: bytes, chunked: bool) -> bytes:
    reader, writer = await asyncio.open_connection(gate.api.host, gate.api.port)
    head, pieces = framed(body, chunked)
    writer.write(head)
    for piece in pieces:
        writer.write(piece)
        await writer.drain()
        await asyncio.sleep(0.005)  # the gate sees pieces, not one block
    response = await read_all(reader, 3)
    writer.close()
    return response


def last_non_whitespace(body: bytes) -> int:
    return len(body.rstrip(b" \t\r\n")) - 1


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
@pytest.mark.parametrize("refused", ["mcp_servers at the very end", "a held secret at the end",
                                     "whitespace padding after a refused JSON"])
async def test_a_refused_body_never_reaches_the_upstream_whole(make_gate: GateFactory, refused: str,
                                                                chunked: bool) -> None:
    upstream = Recording()
    async with raw_server(upstream.serve, "127.0.0.1") as origin, make_gate(upstream=f"http://{origin}") as gate:
        mcp = [{"type": "url", "url": "https://collector.example/sse", "name": "c"}]
        body = {"mcp_servers at the very end": messages_body(mcp_servers=mcp),
                "a held secret at the end": messages_body(metadata={"user_id": gate.token}),
                "whitespace padding after a refused JSON": messages_body(mcp_servers=mcp) + b" \r\n\t" * 50_000,
                }[refused]
        response = await send(gate, body, chunked)
        await eventually(lambda: upstream.ended, what="the refused request's upstream connection to end")
        allowed = await send(gate, messages_body(), chunked)  # on a new connection: the refused one is gone

    assert response.startswith(b"HTTP/1.1 403 ")
    first = upstream.received[0]
    assert request_end(first) is None, "the upstream received the refused request whole"
    arrived = body_received(first)
    assert body.startswith(arrived)
    assert len(arrived) <= min(last_non_whitespace(body), len(body) - HELD_BACK)
    assert upstream.ended[0] in ("closed", "reset")
    assert allowed.startswith(b"HTTP/1.1 200 ")
    assert upstream.connections == 2 and len(upstream.requests) == 1
    assert body_received(upstream.requests[0]) == messages_body()
    records = gate.records()
    assert records[0]["decision"] == "deny" and records[0]["status"] == 403
    assert records[1]["decision"] == "allow"


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
async def test_an_allowed_body_streams_upstream_and_arrives_byte_for_byte(make_gate: GateFactory,
                                                                          chunked: bool) -> None:
    upstream = Recording()
    body = messages_body() + b"\n" * 70_000  # trailing whitespace: held back with the closing brace
    async with raw_server(upstream.serve, "127.0.0.1") as origin, make_gate(upstream=f"http://{origin}") as gate:
        reader, writer = await asyncio.open_connection(gate.api.host, gate.api.port)
        head, pieces = framed(body, chunked)
        writer.write(head + b"".join(pieces[:-2]))  # all but the end: the gate cannot have judged it yet
        await writer.drain()
        await eventually(lambda: len(body_received(upstream.received[0])) if upstream.received else 0,
                         what="the body's first bytes upstream before its end was sent")
        await asyncio.sleep(0.2)
        streamed = len(body_received(upstream.received[0]))
        writer.write(b"".join(pieces[-2:]))
        status, _ = await read_head(reader)
        writer.close()
        await eventually(lambda: gate.records(), what="the audit line")

    assert status == 200
    assert 0 < streamed <= last_non_whitespace(body) and streamed < len(body) - HELD_BACK
    (request,) = upstream.requests
    assert body_received(request) == body
    assert (b"transfer-encoding: chunked" in request.lower()) == chunked  # framed as the client framed it
    (record,) = gate.records()
    assert record["decision"] == "allow" and record["bytes_up"] == len(body)
    assert record["reason"].endswith("no provider-side fetch or code execution asked")


async def test_an_upstream_that_answers_early_is_not_relayed_before_the_verdict(make_gate: GateFactory) -> None:
    upstream = Recording(early=True)
    mcp = [{"type": "url", "url": "https://collector.example/sse", "name": "c"}]
    async with raw_server(upstream.serve, "127.0.0.1") as origin, make_gate(upstream=f"http://{origin}") as gate:
        response = await send(gate, messages_body(mcp_servers=mcp), chunked=False)
    assert response.startswith(b"HTTP/1.1 403 ") and b"mcp_servers is refused" in response
    assert b"\r\n\r\nok" not in response
    assert request_end(upstream.received[0]) is None
