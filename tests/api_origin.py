"""An API upstream a test steers request by request, and a kept-alive client of the API listener, for gate
tests of what a client and the upstream see of one client connection's exchanges (tests/gate/test_api_warm.py).
Every read is bounded."""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import dataclass, field
from typing import Any

from tests.conftest import RunningGate
from tests.helpers import messages_request, parse_head

SMALL = {"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]}
FIRST_EVENTS, LAST_EVENTS = 3, 3  # an ``sse`` answer's events before and after its release
# A large whole response: numbered lines, so a lost, repeated or reordered piece shows.
BIG = b"".join(b"%08d\n" % n for n in range(33_334))  # 300,006 bytes
INTERIM = b"HTTP/1.1 103 Early Hints\r\nlink: </style.css>; rel=preload\r\n\r\n"
HOLD_LIMIT = 5.0  # the longest the origin waits for a test's release before it goes on anyway


def header_fields(head: bytes) -> dict[str, str]:
    return parse_head(b"HTTP/1.1 000 x\r\n" + head.split(b"\r\n", 1)[1])[1]


async def read_chunk(reader: asyncio.StreamReader) -> bytes:
    """The next chunk of a chunked body; b"" at its end (the trailer read too)."""
    size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
    if size == 0:
        await reader.readuntil(b"\r\n")
        return b""
    data = await reader.readexactly(size + 2)
    return data[:-2]


async def read_body(reader: asyncio.StreamReader, headers: dict[str, str]) -> bytes:
    """A message's body by its framing: chunked, a length, or (a response with neither) up to the close."""
    if headers.get("transfer-encoding") == "chunked":
        chunks = []
        while chunk := await read_chunk(reader):
            chunks.append(chunk)
        return b"".join(chunks)
    if "content-length" in headers:
        return await reader.readexactly(int(headers["content-length"]))
    return await reader.read()


@dataclass
class Seen:
    """A whole request as the origin received it, and which of its connections (numbered from 1) it came on."""

    connection: int
    head: bytes
    body: bytes

    @property
    def script(self) -> str:
        return header_fields(self.head).get("x-origin", "ok")


@dataclass
class Origin:
    """The API upstream: it records each whole request, and any connection that ended in the middle of one
    (``half``); it answers as the request's ``x-origin`` says:

    - ``ok`` (or none): 200, a small JSON body naming the request's ``x-seq``; ``big``: 200, ``BIG``.
    - ``close``: 200 with ``Connection: close``, then closes; ``then-close``: ``ok``, then closes it idle. ``hangup``: closes without an answer.
    - ``interim``: ``INTERIM`` (a 103) before its ``ok``; ``split``: ``ok`` in two writes, apart, its body cut.
    - ``echo``: 200 with the request's head as its body; ``echo-header``: ``ok`` with its Authorization
      value in ``x-echo`` (a reflecting endpoint); ``echo-name``: ``ok`` with a header named after that
      value's token in hex.
    - ``slow``: answers ``ok`` after the request's ``x-delay`` seconds.
    - ``silent``: never answers. ``hold``: answers ``ok`` once ``release`` is set (or ``HOLD_LIMIT`` passed).
    - ``sse``: a chunked event stream, ``FIRST_EVENTS`` events, then once released the ``LAST_EVENTS``
      others; ``sent_last`` says whether those went.
    """

    host: str = "127.0.0.1"
    port: int = 0
    connections: int = 0
    requests: list[Seen] = field(default_factory=list)
    half: list[bytes] = field(default_factory=list)
    release: asyncio.Event = field(default_factory=asyncio.Event)
    sent_last: bool = False

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        number = self.connections
        with contextlib.suppress(ConnectionError):
            try:
                while True:
                    begun = b""
                    try:
                        head = begun = await reader.readuntil(b"\r\n\r\n")
                        body = await read_body(reader, header_fields(head))
                    except (asyncio.IncompleteReadError, ConnectionError) as cut:
                        partial = cut.partial if isinstance(cut, asyncio.IncompleteReadError) else b""
                        if begun or partial:
                            self.half.append(begun + partial)
                        return
                    seen = Seen(number, head, body)
                    self.requests.append(seen)
                    if not await self.answer(seen, reader, writer):
                        return
            finally:
                writer.close()

    async def answer(self, seen: Seen, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        """Answer ``seen``; False when the connection ends here."""
        script = seen.script
        if script == "hangup":
            return False
        if script == "silent":
            await reader.read()
            return False
        if script == "hold":
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.release.wait(), HOLD_LIMIT)
        if script == "slow":
            await asyncio.sleep(min(float(header_fields(seen.head)["x-delay"]), HOLD_LIMIT))
        if writer.is_closing():  # the gate closed the connection meanwhile (its client gone)
            return False
        if script == "sse":
            await self.stream(writer)
            return True
        body = BIG if script == "big" else json.dumps(
            {"type": "message", "seq": header_fields(seen.head).get("x-seq", ""), "content": []}).encode()
        if script == "echo":
            body = seen.head
        authorization = header_fields(seen.head).get("authorization", "").encode()
        extra = {"close": b"connection: close\r\n", "echo-header": b"x-echo: %b\r\n" % authorization,
                 "echo-name": b"x-%b: 1\r\n" % authorization.split(b" ")[-1].hex().encode()}.get(script, b"")
        whole = (b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n" + extra
                 + b"content-length: %d\r\n\r\n" % len(body) + body)
        if script == "interim":
            writer.write(INTERIM)
        if script == "split":  # the head and half the body now, the rest once that has gone
            middle = len(whole) - len(body) // 2
            writer.write(whole[:middle])
            await writer.drain()
            await asyncio.sleep(0.05)
            whole = whole[middle:]
        writer.write(whole)
        await writer.drain()
        if script == "then-close":  # once the connection is idle again, as a server ends a kept-alive one
            await asyncio.sleep(0.05)
            return False
        return script != "close"

    async def stream(self, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        for n in range(FIRST_EVENTS):
            writer.write(chunked(event(n)))
        await writer.drain()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.release.wait(), HOLD_LIMIT)
        self.sent_last = True
        writer.write(b"".join(chunked(event(n)) for n in range(FIRST_EVENTS, FIRST_EVENTS + LAST_EVENTS)))
        writer.write(b"0\r\n\r\n")
        await writer.drain()


def event(n: int) -> bytes:
    return b"event: content_block_delta\ndata: {\"n\": %d}\n\n" % n


def chunked(data: bytes) -> bytes:
    return b"%x\r\n%b\r\n" % (len(data), data)


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes


class Client:
    """A kept-alive client connection to the API listener; every read is bounded."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def to(cls, gate: RunningGate) -> Client:
        return cls(*await asyncio.open_connection(gate.api.host, gate.api.port))

    def send(self, data: bytes) -> None:
        self.writer.write(data)

    async def head(self, timeout: float = 5.0) -> tuple[int, dict[str, str]]:
        async with asyncio.timeout(timeout):
            return parse_head(await self.reader.readuntil(b"\r\n\r\n"))

    async def response(self, timeout: float = 5.0) -> Answer:
        async with asyncio.timeout(timeout):
            status, headers = await self.head(timeout)
            return Answer(status, headers, await read_body(self.reader, headers))

    async def ask(self, payload: dict[str, Any] | None = None, extra: str = "") -> Answer:
        self.send(messages_request(payload or SMALL, extra, keep_alive=True))
        return await self.response()

    async def closed_by_gate(self, timeout: float = 3.0) -> bool:
        """True once the gate closes (or resets) the connection, False if it sends anything more first."""
        try:
            async with asyncio.timeout(timeout):
                return await self.reader.read(1) == b""
        except ConnectionResetError:
            return True

    def close(self) -> None:
        self.writer.close()
