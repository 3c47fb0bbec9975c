"""The API listener's express path (gate/express.py): a whole request on a warm pool is served from the socket
callbacks, and every exchange it cannot end there goes back to the request loop with the same outcome."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import struct
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from claude_bottle.gate.express import ExpressExchange
from claude_bottle.stub import StubUpstream
from tests.conftest import GateFactory, RunningGate
from tests.helpers import eventually, messages_request, raw_server

pytestmark = pytest.mark.asyncio

SMALL = {"model": "claude-test", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]}
ANSWER = b'{"type": "message", "content": []}'
FIELDS = ("decision", "reason", "status", "path", "bytes_up", "bytes_down", "side")


@pytest.fixture
def taken(monkeypatch: pytest.MonkeyPatch) -> list[ExpressExchange]:
    """Every exchange the express path takes, in order."""
    exchanges: list[ExpressExchange] = []
    send = ExpressExchange.send

    def counted(self: ExpressExchange, *args: Any) -> None:
        exchanges.append(self)
        send(self, *args)

    monkeypatch.setattr(ExpressExchange, "send", counted)
    return exchanges


class Client:
    """One kept-alive client connection to the gate's API listener."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    async def ask(self, payload: dict[str, Any] = SMALL, extra: str = "") -> tuple[int, bytes]:
        self.writer.write(messages_request(payload, extra, keep_alive=True))
        return await self.answer()

    async def answer(self) -> tuple[int, bytes]:
        """One response: its status and body (by its length, or its chunks)."""
        async with asyncio.timeout(5):
            head = (await self.reader.readuntil(b"\r\n\r\n")).decode("latin-1").lower()
            status = int(head.split()[1])
            if "transfer-encoding: chunked" in head:
                body = b""
                while size := int((await self.reader.readuntil(b"\r\n")).strip(), 16):
                    body += (await self.reader.readexactly(size + 2))[:-2]
                await self.reader.readuntil(b"\r\n")
                return status, body
            length = int(head.split("content-length:")[1].split("\r\n")[0])
            return status, await self.reader.readexactly(length)

    async def closed(self, timeout: float) -> bool:
        """The gate closed the connection within ``timeout``."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                return await self.reader.read(1) == b""
        return False


@contextlib.asynccontextmanager
async def client(gate: RunningGate) -> AsyncIterator[Client]:
    reader, writer = await asyncio.open_connection(gate.api.host, gate.api.port)
    try:
        yield Client(reader, writer)
    finally:
        writer.close()


def lines(gate: RunningGate) -> list[dict[str, Any]]:
    return [{name: record.get(name) for name in FIELDS} for record in gate.records()]


async def test_warm_requests_take_the_express_path_with_the_same_outcome(
        make_gate: GateFactory, stub: StubUpstream, taken: list[ExpressExchange]) -> None:
    async with make_gate() as gate, client(gate) as api:
        answers = [await api.ask() for _ in range(12)]
    assert len(taken) == 11, "the first request warms the pool; every later one is served from the callbacks"
    assert {status for status, _ in answers} == {200} and len({len(body) for _, body in answers}) == 1
    first, *rest = lines(gate)
    assert rest == [first] * 11, "the same audit line, field for field"
    assert all(seen.header("authorization") == [f"Bearer {gate.token}"] for seen in stub.requests)


async def test_a_streamed_answer_is_relayed_by_the_request_loop(
        make_gate: GateFactory, taken: list[ExpressExchange]) -> None:
    streamed = {**SMALL, "stream": True, "stub": {"events": 3, "interval": 0.05}}
    async with make_gate() as gate, client(gate) as api:
        await api.ask()
        status, body = await api.ask(streamed)
        assert (await api.ask())[0] == 200  # the connection goes on
    assert len(taken) == 2 and status == 200
    assert body.count(b"event: content_block_delta") == 3 and body.rstrip().endswith(b'"message_stop"}')
    assert lines(gate)[1]["bytes_down"] == len(body)


@pytest.mark.parametrize("mode", ["echo", "echo-name"])
async def test_a_reflected_credential_is_refused_as_on_the_coroutine_path(
        make_gate: GateFactory, taken: list[ExpressExchange], mode: str) -> None:
    async with make_gate() as gate, client(gate) as api:
        await api.ask()
        status, body = await api.ask({**SMALL, "stub": {"mode": mode}})
    assert len(taken) == 1 and status == 502
    assert gate.token.encode() not in body and gate.token.encode().hex().encode() not in body
    assert lines(gate)[1]["side"] == "upstream" and "credential" in lines(gate)[1]["reason"]


@contextlib.asynccontextmanager
async def upstream(behave: Callable[[int], Any]) -> AsyncIterator[str]:
    """A kept-alive upstream that answers its Nth request as ``behave(N)`` says: the usual answer (b""), bytes
    to send instead (cut short: then it closes), a number of seconds to wait before the usual answer, or None
    to stay silent."""
    count = 0

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal count
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            while head := await reader.readuntil(b"\r\n\r\n"):
                length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
                await reader.readexactly(length)
                count += 1
                what = behave(count)
                if what is None:
                    await reader.read()  # silent until the gate gives up
                    return
                if isinstance(what, float):
                    await asyncio.sleep(what)
                    what = None
                writer.write(what or b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                             % (len(ANSWER), ANSWER))
                if what and not what.endswith(b"\r\n\r\n"):  # a message cut short: then the connection's end
                    break
        writer.close()

    async with raw_server(serve) as endpoint:
        yield f"http://{endpoint.host}:{endpoint.port}"


async def test_upstream_silence_past_the_idle_timeout_is_the_upstream_s_504(
        make_gate: GateFactory, taken: list[ExpressExchange]) -> None:
    async with upstream(lambda n: b"" if n == 1 else None) as url, \
            make_gate(upstream=url, idle_timeout=0.5) as gate, client(gate) as api:
        await api.ask()
        loop = asyncio.get_running_loop()
        started = loop.time()
        status, _ = await api.ask()
        waited = loop.time() - started
    assert len(taken) == 1 and status == 504 and 0.4 < waited < 3
    assert lines(gate)[1]["side"] == "upstream"


async def test_an_upstream_gone_without_an_answer_is_the_upstream_s_502(
        make_gate: GateFactory, taken: list[ExpressExchange]) -> None:
    async with upstream(lambda n: b"" if n != 2 else b"HTTP/1.1 200 OK\r\ncontent-le") as url, \
            make_gate(upstream=url) as gate:
        async with client(gate) as api:
            await api.ask()
            status, _ = await api.ask()
            assert await api.closed(2)
        async with client(gate) as api:
            again, _ = await api.ask()  # on a fresh upstream connection
    assert len(taken) == 1 and status == 502 and again == 200  # no idle upstream for the third: the loop
    assert lines(gate)[1]["side"] == "upstream"


@pytest.mark.parametrize("reset", [True, False], ids=["reset", "closed"])
async def test_a_client_gone_before_the_answer_gets_one_line_and_the_gate_goes_on(
        make_gate: GateFactory, taken: list[ExpressExchange], reset: bool) -> None:
    async with upstream(lambda n: b"" if n != 2 else 0.3) as url, make_gate(upstream=url) as gate:
        async with client(gate) as api:
            await api.ask()
            api.writer.write(messages_request(SMALL, keep_alive=True))
            await api.writer.drain()
            await eventually(lambda: len(taken) == 1, what="the express path took the request")
            if reset:
                api.writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                                                 struct.pack("ii", 1, 0))
            else:
                api.writer.write_eof()
        await eventually(lambda: len(gate.records()) == 2, what="the line of the request in flight")
        async with client(gate) as api:
            assert (await api.ask())[0] == 200
    line = {"decision": "error", "side": "client", "status": 0}  # a close (FIN) too, as from nginx (499)
    assert {name: lines(gate)[1][name] for name in line} == line


async def test_a_client_that_asks_to_close_is_answered_then_closed(
        make_gate: GateFactory, taken: list[ExpressExchange]) -> None:
    async with make_gate() as gate, client(gate) as api:
        await api.ask()
        status, _ = await api.ask(extra="Connection: close\r\n")
        assert await api.closed(2)
    assert len(taken) == 1 and status == 200 and [line["status"] for line in lines(gate)] == [200, 200]


async def test_express_exchanges_keep_the_client_from_being_idle(
        make_gate: GateFactory, taken: list[ExpressExchange]) -> None:
    async with make_gate(header_timeout=1.0) as gate, client(gate) as api:
        for _ in range(5):  # 2.5 s in all, never 1 s without a request
            assert (await api.ask())[0] == 200
            await asyncio.sleep(0.5)
        assert await api.closed(3), "idle past the header timeout: closed"
    assert len(taken) == 4 and len(gate.records()) == 5


async def test_a_request_pipelined_behind_one_in_flight_is_served_after_it(
        make_gate: GateFactory, stub: StubUpstream, taken: list[ExpressExchange]) -> None:
    first = {**SMALL, "messages": [{"role": "user", "content": "first"}]}
    second = {**SMALL, "messages": [{"role": "user", "content": "second"}]}
    async with make_gate() as gate, client(gate) as api:
        await api.ask()
        api.writer.write(messages_request(first, keep_alive=True))
        await api.writer.drain()
        await eventually(lambda: len(taken) == 1, what="the first in flight")
        api.writer.write(messages_request(second, keep_alive=True))
        answers = [await api.answer(), await api.answer()]
    assert [status for status, _ in answers] == [200, 200]
    assert [json.loads(seen.body)["messages"][0]["content"] for seen in stub.requests[1:]] == ["first", "second"]
    assert len(gate.records()) == 3


async def test_a_stopping_gate_writes_the_line_of_an_exchange_in_flight(
        make_gate: GateFactory, taken: list[ExpressExchange]) -> None:
    async with upstream(lambda n: b"" if n == 1 else None) as url:
        async with make_gate(upstream=url, drain_seconds=0.3) as gate, client(gate) as api:
            await api.ask()
            api.writer.write(messages_request(SMALL, keep_alive=True))
            await api.writer.drain()
            await eventually(lambda: len(taken) == 1, what="the request in flight")
        assert len(gate.records()) == 2
