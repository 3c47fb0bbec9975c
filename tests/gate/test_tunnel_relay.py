"""gate/tunnel.py's relay on both event loops it may run on (asyncio's and uvloop's): every byte arrives, in
order, unchanged, however far one side falls behind; a half-close passes on."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
import uvloop

from claude_bottle.gate.tunnel import Traffic, relay

LOOPS: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
    "asyncio": asyncio.new_event_loop, "uvloop": uvloop.new_event_loop}
Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


def run_on(loop: str, main: Callable[[], Awaitable[Any]]) -> Any:
    with asyncio.Runner(loop_factory=LOOPS[loop]) as runner:
        return runner.run(asyncio.wait_for(main(), 60))


@contextlib.asynccontextmanager
async def relayed(server: Handler, traffic: Traffic) -> AsyncIterator[tuple[asyncio.StreamReader,
                                                                            asyncio.StreamWriter]]:
    """A client connection whose bytes ``relay`` carries to and from ``server``, as a tunnel does."""
    ended: asyncio.Future[BaseException | None] = asyncio.get_running_loop().create_future()
    origin = await asyncio.start_server(server, "127.0.0.1", 0)

    async def front(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*origin.sockets[0].getsockname()[:2])
        try:
            await relay((reader, writer.transport), (up_reader, up_writer.transport), traffic, 30)
            ended.set_result(None)
        except BaseException as exc:
            ended.set_result(exc)
            raise

    gate = await asyncio.start_server(front, "127.0.0.1", 0)
    reader, writer = await asyncio.open_connection(*gate.sockets[0].getsockname()[:2])
    try:
        yield reader, writer
    finally:
        writer.close()
        for server_ in (gate, origin):
            server_.close()
        failure = await ended
        assert failure is None, f"the relay failed: {failure!r}"


async def slow_read(reader: asyncio.StreamReader, size: int) -> bytes:
    """Read ``size`` bytes in small pieces with pauses, so the other side's queue fills and drains."""
    got = bytearray()
    while len(got) < size:
        piece = await reader.read(min(65536, size - len(got)))
        assert piece, f"EOF after {len(got)} of {size} bytes"
        got += piece
        if len(got) % (1 << 20) < 65536:
            await asyncio.sleep(0.005)
    return bytes(got)


async def write_in_pieces(writer: asyncio.StreamWriter, data: bytes, piece: int = 1 << 20) -> None:
    for start in range(0, len(data), piece):
        writer.write(data[start : start + piece])
        await writer.drain()


@pytest.mark.parametrize("loop", LOOPS)
def test_bytes_pass_both_ways_and_a_half_close_passes_on(loop: str) -> None:
    async def server(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        received = await reader.read()  # until the client's half-close reaches it
        writer.write(b"got " + received)
        await writer.drain()
        writer.close()

    async def main() -> None:
        traffic = Traffic()
        async with relayed(server, traffic) as (reader, writer):
            writer.write(b"hello")
            await writer.drain()
            writer.write_eof()
            assert await reader.read() == b"got hello"
        assert (traffic.up, traffic.down) == (5, 9)

    run_on(loop, main)


@pytest.mark.parametrize("loop", LOOPS)
def test_large_transfers_both_ways_to_slow_readers_arrive_intact(loop: str) -> None:
    """Both directions at once, each reader slower than its writer: the relay's queues fill, its reads pause
    and resume, and its writes are partial. A receive buffer reused while a transport still holds a view of
    it would change bytes already relayed."""
    size = 24 << 20
    up, down = os.urandom(size), os.urandom(size)

    async def server(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sending = asyncio.ensure_future(write_in_pieces(writer, down))
        received = await slow_read(reader, size)
        await sending
        writer.write(hashlib.sha256(received).digest())
        await writer.drain()
        writer.close()

    async def main() -> None:
        traffic = Traffic()
        async with relayed(server, traffic) as (reader, writer):
            sending = asyncio.ensure_future(write_in_pieces(writer, up))
            received = await slow_read(reader, size)
            await sending
            assert hashlib.sha256(received).digest() == hashlib.sha256(down).digest(), "bytes changed downward"
            assert await reader.readexactly(32) == hashlib.sha256(up).digest(), "bytes changed upward"
        assert traffic.up == size and traffic.down == size + 32

    run_on(loop, main)
