"""A client gone while its request waits for the upstream's answer (docs/gate.md, "Whose fault"): the gate
stops waiting, closes that upstream connection at once, so the upstream stops working on a request nobody
will read, and audits the request as the client's going away. Checked through sockets and the audit."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import socket
import ssl
import struct
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import trustme

from claude_bottle.gate.resolver import StaticResolver
from tests.conftest import GateFactory, RunningGate
from tests.gate.test_inspection import StandInCA
from tests.helpers import connect_via, eventually, messages_request

pytestmark = pytest.mark.asyncio

LOOPBACK = ("127.0.0.0/8",)
HOST = "slow.example.test"
SMALL = {"model": "claude-test", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]}
ANSWER = b'{"type": "message", "content": []}'
BOUND = 2.0  # seconds the upstream may wait to see its connection closed


class SlowUpstream:
    """An upstream that answers its first request at once and holds every later one unanswered: ``held`` is
    set once such a request has arrived whole, ``closed`` once the gate closed (or reset) its connection."""

    def __init__(self) -> None:
        self.count = 0
        self.held = asyncio.Event()
        self.closed = asyncio.Event()

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            while True:  # until a request is held, or the connection's end (IncompleteReadError)
                head = await reader.readuntil(b"\r\n\r\n")
                await reader.readexactly(int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0]))
                self.count += 1
                if self.count > 1:
                    break
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                             % (len(ANSWER), ANSWER))
            self.held.set()
            with contextlib.suppress(ConnectionError):
                await reader.read()  # no answer: until the gate closes (or resets) the connection
            self.closed.set()
        writer.close()


@contextlib.asynccontextmanager
async def slow_upstream(tls: ssl.SSLContext | None = None) -> AsyncIterator[tuple[SlowUpstream, int]]:
    upstream = SlowUpstream()
    server = await asyncio.start_server(upstream.serve, "127.0.0.2", 0, ssl=tls)
    try:
        yield upstream, server.sockets[0].getsockname()[1]
    finally:
        server.close()


def reset(writer: asyncio.StreamWriter) -> None:
    """Close with a reset."""
    writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.close()


async def gone_while_held(gate: RunningGate, upstream: SlowUpstream, reader: asyncio.StreamReader,
                          writer: asyncio.StreamWriter, request: bytes, split: int | None = None,
                          close: Callable[[asyncio.StreamWriter], None] = reset) -> dict[str, Any]:
    """A first ``request`` answered (warming the gate's upstream connection, if it keeps them), then another
    held upstream and its client gone (``close``): the upstream's connection must close within ``BOUND``.
    ``split``: the second goes in two writes, its body's end a moment after the rest. Its audit line."""
    try:
        writer.write(request)
        async with asyncio.timeout(5):
            head = await reader.readuntil(b"\r\n\r\n")  # the first answer's head (its body is not read)
        assert head.startswith(b"HTTP/1.1 200 "), head
        if split is None:
            writer.write(request)
        else:
            writer.write(request[:split])
            await writer.drain()
            await asyncio.sleep(0.1)
            writer.write(request[split:])
        await writer.drain()
        async with asyncio.timeout(5):
            await upstream.held.wait()
    finally:
        close(writer)
    try:
        async with asyncio.timeout(BOUND):
            await upstream.closed.wait()
    except TimeoutError:
        raise AssertionError(f"the upstream's connection still open {BOUND:g}s after the client was gone") from None
    await eventually(lambda: len(posts(gate)) == 2, what="the held request's audit line")
    return posts(gate)[1]


def posts(gate: RunningGate) -> list[dict[str, Any]]:
    return [record for record in gate.records() if record["method"] == "POST"]


def went_away(record: dict[str, Any]) -> None:
    assert record["decision"] == "error" and record["side"] == "client" and record["status"] == 0, record
    assert record["reason"].endswith("; then client went away"), record["reason"]
    assert record["bytes_up"] > 0 and record["bytes_down"] == 0, record


def hang_up(writer: asyncio.StreamWriter) -> None:
    """Close with a FIN, as a client that exits or is killed does."""
    writer.close()


@pytest.mark.parametrize("close", [reset, hang_up])
@pytest.mark.parametrize("split", [None, -5], ids=["whole", "streamed"])
@pytest.mark.parametrize("express", [False, True], ids=["request-loop", "express"])
async def test_an_api_client_gone_before_the_answer_ends_its_upstream_request(
        make_gate: GateFactory, monkeypatch: pytest.MonkeyPatch, express: bool, split: int | None,
        close: Callable[[asyncio.StreamWriter], None]) -> None:
    if not express:  # every request on the request loop's path, the forward path's for a streamed body
        monkeypatch.setattr("claude_bottle.gate.api.ApiRoute.express", lambda *args: False)
    async with slow_upstream() as (upstream, port), \
            make_gate(upstream=f"http://127.0.0.2:{port}", idle_timeout=30) as gate:
        reader, writer = await asyncio.open_connection(gate.api.host, gate.api.port)
        record = await gone_while_held(gate, upstream, reader, writer, messages_request(SMALL, keep_alive=True), split,
                                       close)
        assert upstream.count == 2, "one upstream connection: the first request's, kept alive and reused"
    went_away(record)
    assert record["path"] == "/v1/messages"


@pytest.mark.parametrize("close", [reset, hang_up])
async def test_a_proxy_client_gone_before_the_answer_ends_its_upstream_request(
        make_gate: GateFactory, close: Callable[[asyncio.StreamWriter], None]) -> None:
    async with slow_upstream() as (upstream, port), \
            make_gate(allow=(f"127.0.0.2:{port}",), allow_private=LOOPBACK, idle_timeout=30) as gate:
        body = b'{"q": 1}'
        request = (f"POST http://127.0.0.2:{port}/ask HTTP/1.1\r\nHost: 127.0.0.2:{port}\r\n"
                   f"Content-Length: {len(body)}\r\n\r\n").encode() + body
        reader, writer = await asyncio.open_connection(gate.proxy.host, gate.proxy.port)
        record = await gone_while_held(gate, upstream, reader, writer, request, close=close)
    went_away(record)


async def test_a_tls_client_closing_before_the_answer_ends_its_upstream_request(
        make_gate: GateFactory, tmp_path: Path) -> None:
    """Inside a terminated tunnel a close is the client gone: TLS cannot half-close."""
    upstream_ca, stand_in = trustme.CA(), StandInCA()
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    upstream_ca.issue_cert(HOST).configure_cert(context)
    ca_file = tmp_path / "upstream-ca.pem"
    upstream_ca.cert_pem.write_to_path(str(ca_file))
    resolver = StaticResolver({HOST: [ipaddress.ip_address("127.0.0.2")]})
    async with slow_upstream(context) as (upstream, port), \
            make_gate(allow=(f"{HOST}:{port}",), allow_private=LOOPBACK, resolver=resolver, ca=stand_in,
                      extra_ca=(str(ca_file),), idle_timeout=30) as gate:
        status, _, reader, writer = await connect_via(gate.proxy, f"{HOST}:{port}")
        assert status == 200
        await writer.start_tls(stand_in.client_context(), server_hostname=HOST)
        record = await gone_while_held(gate, upstream, reader, writer, messages_request(SMALL, host=f"{HOST}:{port}",
                                                                                        keep_alive=True),
                                       close=hang_up)
        assert stand_in.hosts == [HOST], "the tunnel was terminated"
    went_away(record)
