"""Clients and servers for gate tests: raw sockets where the bytes matter, on loopback only."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import secrets
import tarfile
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from claude_bottle.gate.settings import Endpoint


def tar_archive(files: dict[str, bytes], uid: int = 0, gid: int = 0, mode: int = 0o600) -> bytes:
    """``files`` (path -> content) as a tar archive owned by ``uid``:``gid``, for ``put_archive`` into the
    servers the tests start in containers."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.uid, info.gid, info.mtime = len(data), mode, uid, gid, int(time.time())
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


class RecordingTransport:
    """What gate/connection.py's HttpConnection uses of its transport, recording each write."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.aborted = False

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))

    def is_closing(self) -> bool:
        return False

    def get_extra_info(self, name: str) -> None:
        return None

    def abort(self) -> None:
        self.aborted = True


def make_token(kind: str = "oat") -> str:
    return f"sk-ant-{kind}01-" + secrets.token_urlsafe(60)


async def exchange(endpoint: Endpoint, data: bytes, timeout: float = 5.0) -> bytes:
    """Send ``data`` and read until the server closes or ``timeout`` passes."""
    reader, writer = await asyncio.open_connection(endpoint.host, endpoint.port)
    try:
        writer.write(data)
        await writer.drain()
        return await read_all(reader, timeout)
    finally:
        writer.close()


async def read_all(reader: asyncio.StreamReader, timeout: float = 5.0) -> bytes:
    chunks = []
    with contextlib.suppress(TimeoutError, ConnectionError):
        async with asyncio.timeout(timeout):
            while chunk := await reader.read(65536):
                chunks.append(chunk)
    return b"".join(chunks)


async def read_head(reader: asyncio.StreamReader, timeout: float = 5.0) -> tuple[int, dict[str, str]]:
    async with asyncio.timeout(timeout):
        head = await reader.readuntil(b"\r\n\r\n")
    return parse_head(head)


def parse_head(data: bytes) -> tuple[int, dict[str, str]]:
    head = data.split(b"\r\n\r\n", 1)[0].decode("latin-1").split("\r\n")
    status = int(head[0].split()[1])
    headers = {}
    for line in head[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return status, headers


def messages_request(payload: dict[str, object], extra_headers: str = "", host: str = "gate",
                     keep_alive: bool = False) -> bytes:
    body = json.dumps(payload).encode()
    connection = "" if keep_alive else "Connection: close\r\n"
    return (
        f"POST /v1/messages HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n{connection}"
        f"Content-Length: {len(body)}\r\n{extra_headers}\r\n"
    ).encode() + body


async def connect_via(proxy: Endpoint, target: str) -> tuple[int, dict[str, str], asyncio.StreamReader,
                                                             asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection(proxy.host, proxy.port)
    writer.write(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
    await writer.drain()
    status, headers = await read_head(reader)
    return status, headers, reader, writer


@dataclass
class EchoServer:
    """A TCP echo server that records who connected."""

    host: str = "127.0.0.2"
    port: int = 0
    peers: list[str] = field(default_factory=list)
    _server: asyncio.Server | None = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.peers.append(str(writer.get_extra_info("peername")))
        with contextlib.suppress(ConnectionError):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        writer.close()

    async def __aenter__(self) -> EchoServer:
        self._server = await asyncio.start_server(self._serve, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(2):
                await self._server.wait_closed()


@contextlib.asynccontextmanager
async def raw_server(handler, host: str = "127.0.0.2") -> AsyncIterator[Endpoint]:  # type: ignore[no-untyped-def]
    """A one-off TCP server whose behaviour the test writes (silent, garbage, slow...)."""
    server = await asyncio.start_server(handler, host, 0)
    try:
        yield Endpoint(host, server.sockets[0].getsockname()[1])
    finally:
        server.close()


async def eventually(condition: Callable[[], object], timeout: float = 5.0, what: str = "condition") -> None:
    """Wait until ``condition()`` is true; the gate finishes its bookkeeping just after a connection ends."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)
