"""HTTP/1.1 on an asyncio stream, parsed by h11; used for both sides of every exchange (and the stub upstream).

A connection does not know whose side it is on, so its errors name no side: a peer that breaks the protocol
raises ``ProtocolError`` (with the status a server would answer, 400, 413, 431 or 505), one that closes or
resets raises ``PeerGone``, one that goes silent ``TimeoutError``. The forward path says whose fault each
one was (gate/failures.py), once, where it steps on that side.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import socket
import struct
from collections.abc import AsyncIterator, Iterable
from http import HTTPStatus

import h11

Headers = list[tuple[bytes, bytes]]

# RFC 9110 7.6.1 plus the proxy-era names clients still send.
HOP_BY_HOP = frozenset({
    b"connection", b"keep-alive", b"proxy-connection", b"te", b"trailer", b"transfer-encoding",
    b"upgrade", b"proxy-authenticate", b"proxy-authorization",
})
MAX_HEADER_BYTES = 32 * 1024
READ_SIZE = 64 * 1024


# Framing tricks used for request smuggling. h11 would tolerate them (and the gate re-frames every message
# anyway), but a client that sends them is refused outright.
_BARE_LF = re.compile(rb"(?<!\r)\n")
_OBS_FOLD = re.compile(rb"\r\n[ \t]")


# Headers a request cannot do without at the next hop: a Connection header that names one (so that a hop
# would drop it) makes the message's framing or target ambiguous.
_NEEDED = frozenset({b"content-length", b"transfer-encoding", b"host"})

# The Anthropic API's error types, for refusals on the API listener (Claude Code shows their message).
ANTHROPIC_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                         404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error"}


def framing_problem(head: bytes) -> str | None:
    """Why a raw message head is refused, or None. ``head`` ends at the blank line."""
    if _BARE_LF.search(head):
        return "bare LF line ending in the message head"
    if _OBS_FOLD.search(head):
        return "obsolete line folding in a header"
    return None


MAX_PHRASE = 200  # a refusal's reason as the status phrase, cut to this many characters


def _header_text(text: str) -> str:
    """``text`` as a header value: printable ASCII only."""
    return "".join(c if " " <= c <= "~" else "?" for c in text).strip()


class ProtocolError(Exception):
    """The peer broke HTTP/1.1 (or the gate's stricter rules); ``status`` is what a server answers."""

    def __init__(self, reason: str, status: int = 400) -> None:
        super().__init__(reason)
        self.status = status


class PeerGone(Exception):
    """The peer closed or reset the connection."""


def end_to_end(headers: Iterable[tuple[bytes, bytes]]) -> Headers:
    """Drop hop-by-hop headers, including every name the Connection header lists."""
    headers = list(headers)
    listed = {
        token.strip().lower()
        for name, value in headers if name.lower() == b"connection"
        for token in value.split(b",")
    }
    return [(n, v) for n, v in headers if n.lower() not in HOP_BY_HOP and n.lower() not in listed]


def connection_problem(headers: Iterable[tuple[bytes, bytes]]) -> str | None:
    """Why a head's Connection header makes it unusable, or None."""
    listed = {token.strip().lower() for value in header_values(headers, b"connection") for token in value.split(b",")}
    needed = sorted(listed & _NEEDED)
    if needed:
        return f"the Connection header names {needed[0].decode()}, which the message needs end to end"
    return None


def header_values(headers: Iterable[tuple[bytes, bytes]], name: bytes) -> list[bytes]:
    return [v for n, v in headers if n.lower() == name]


class HttpConnection:
    """One server-side HTTP/1.1 connection: read requests and body chunks, send responses.

    Writes are coalesced: the head and body pieces of a message still being sent wait in ``_pending`` and go
    out in one write when the message ends, or at the latest when the event loop next waits (a callback
    scheduled with the first piece), so a streamed body is never held back. Anything else goes at once."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        client: bool = False,
        max_header_bytes: int = MAX_HEADER_BYTES,
    ) -> None:
        self.reader = reader
        self.writer = writer
        self.h11 = h11.Connection(h11.CLIENT if client else h11.SERVER, max_incomplete_event_size=max_header_bytes)
        self._max_header_bytes = max_header_bytes
        self._head = b""  # raw bytes of a request head still being received, for framing_problem()
        self.json_errors = False  # refusals as Anthropic API error bodies (the API listener) instead of text
        self._pending: list[bytes] = []  # bytes of the message being sent, not yet written
        peer = writer.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else "unknown"

    async def next_event(self, timeout: float | None = None) -> h11.Event | type[h11.PAUSED] | type[h11.NEED_DATA]:
        """The next h11 event, reading from the socket as needed; ``timeout`` bounds each read."""
        while True:
            try:
                event = self.h11.next_event()
            except h11.RemoteProtocolError as exc:
                raise ProtocolError(str(exc), exc.error_status_hint) from None
            if isinstance(event, h11.Request | h11.Response):
                self._check_head(event)
            if event is not h11.NEED_DATA:
                return event
            try:
                async with asyncio.timeout(timeout):
                    data = await self.reader.read(READ_SIZE)
            except TimeoutError:
                raise  # an OSError too, but the caller must tell a silent peer from a vanished one
            except OSError as exc:
                raise PeerGone(str(exc) or type(exc).__name__) from None
            if self.h11.their_state in (h11.IDLE, h11.SEND_RESPONSE) and data:
                self._head = (self._head + data)[: self._max_header_bytes + 4]
            self.h11.receive_data(data)

    def _check_head(self, event: h11.Request | h11.Response) -> None:
        """Refuse what h11 tolerates but a smuggler relies on. Checks the head of the first message read
        from a fresh buffer; pipelined heads are not seen raw, which is safe because the gate re-frames."""
        head, self._head = self._head, b""
        end = re.search(rb"\r?\n\r?\n", head)
        head = head[: end.end()] if end else head
        if len(head) > self._max_header_bytes:  # h11 only limits heads that arrive in pieces
            raise ProtocolError(f"message head larger than {self._max_header_bytes} bytes", 431)
        if event.http_version not in (b"1.0", b"1.1"):
            raise ProtocolError(f"HTTP/{event.http_version.decode()} is not supported", 505)
        problem = framing_problem(head) or connection_problem(event.headers)
        if problem is None and header_values(event.headers, b"transfer-encoding") and header_values(
            event.headers, b"content-length"
        ):
            problem = "both Content-Length and Transfer-Encoding"
        if problem:
            raise ProtocolError(problem)

    @property
    def head_started(self) -> bool:
        """Some bytes of the next request head have arrived."""
        return bool(self._head)

    async def read_request(self, timeout: float | None) -> h11.Request | None:
        """The next request head, or None when the client closed cleanly between requests. ``timeout``
        bounds the whole head, however its bytes trickle in."""
        async with asyncio.timeout(timeout):
            event = await self.next_event()
        if isinstance(event, h11.ConnectionClosed):
            return None
        if not isinstance(event, h11.Request):
            raise ProtocolError(f"unexpected {type(event).__name__} before a request")
        return event

    async def body(self, timeout: float | None) -> AsyncIterator[bytes]:
        """The current message's body chunks as they arrive."""
        while True:
            event = await self.next_event(timeout)
            if isinstance(event, h11.Data):
                yield bytes(event.data)
            elif isinstance(event, h11.EndOfMessage):
                return
            elif isinstance(event, h11.ConnectionClosed):
                raise PeerGone("connection closed in the middle of a body")
            else:
                raise ProtocolError(f"unexpected {type(event).__name__} in a body")

    async def send(self, event: h11.Event) -> None:
        if isinstance(event, h11.Response | h11.InformationalResponse) and not event.reason:
            with contextlib.suppress(ValueError):
                event = type(event)(status_code=event.status_code, headers=event.headers,
                                    reason=HTTPStatus(event.status_code).phrase.encode())
        data = self.h11.send(event)
        if not data:
            if self.h11.our_state is not h11.SEND_BODY:
                self.write_pending()
            return
        self._pending.append(data)
        if self.h11.our_state is not h11.SEND_BODY:
            self.write_pending()  # the message is complete, or what follows is not HTTP (CONNECT's 200)
        elif len(self._pending) == 1:
            asyncio.get_running_loop().call_soon(self.write_pending)
        try:
            await self.writer.drain()
        except (ConnectionError, OSError) as exc:
            raise PeerGone(str(exc)) from None

    def write_pending(self) -> None:
        """Hand what ``send`` has kept back to the transport, in one write."""
        if self._pending:
            data = b"".join(self._pending)
            self._pending.clear()
            if not self.writer.is_closing():
                self.writer.write(data)

    async def send_simple(self, status: int, reason: str, headers: Headers | None = None,
                          message: str | None = None) -> None:
        """A complete small response, e.g. a refusal: ``message`` (default: ``reason``) as a line of text, or
        as an Anthropic API error body when ``json_errors`` is set. ``reason`` also goes in X-Deny-Reason and,
        unless ``json_errors``, is the status phrase (what a client shows of a refused CONNECT)."""
        message = reason if message is None else message
        phrase = _header_text(reason)[:MAX_PHRASE]
        if self.json_errors:
            kind = ANTHROPIC_ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
            body = json.dumps({"type": "error", "error": {"type": kind, "message": message}}).encode()
            content_type = b"application/json"
            phrase = ""
        else:
            body, content_type = (message + "\n").encode(), b"text/plain; charset=utf-8"
        head = [
            (b"content-type", content_type),
            (b"content-length", str(len(body)).encode()),
            (b"x-deny-reason", _header_text(reason).encode()),
            *(headers or []),
        ]
        await self.send(h11.Response(status_code=status, headers=head, reason=phrase.encode()))
        await self.send(h11.Data(data=body))
        await self.send(h11.EndOfMessage())

    async def refuse(self, status: int, reason: str, timeout: float, message: str | None = None,
                     max_body: int = 1 << 20) -> None:
        """Answer a refused request (``message``: the body's text, default ``reason``). A small body is read
        first so the connection stays usable; past ``max_body``, or when the body stops coming for ``timeout``,
        the connection is closed after the answer."""
        if self.h11.their_state is h11.SEND_BODY:
            seen, complete = 0, False
            try:
                async for chunk in self.body(timeout):
                    seen += len(chunk)
                    if seen > max_body:
                        break
                else:
                    complete = True
            except TimeoutError:
                pass  # a body that stops coming: answer anyway, and close
            if not complete:
                await self.send_simple(status, reason, [(b"connection", b"close")], message)
                return
        await self.send_simple(status, reason, message=message)

    async def refuse_unread(self, status: int, reason: str) -> None:
        """Answer without a request to answer (a connection over the limit, a head too slow), then close."""
        body = (reason + "\n").encode()
        head = (f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\ncontent-type: text/plain; charset=utf-8\r\n"
                f"content-length: {len(body)}\r\nx-deny-reason: {_header_text(reason)}\r\n"
                "connection: close\r\n\r\n").encode()
        self.write_pending()
        self.writer.write(head + body)
        with contextlib.suppress(ConnectionError, OSError):
            await self.writer.drain()
        await self.close()

    async def fail(self, status: int, reason: str, message: str | None = None) -> None:
        """Report a failure: as a response if none has started, else by resetting the connection."""
        if self.h11.our_state in (h11.IDLE, h11.SEND_RESPONSE):
            await self.send_simple(status, reason, [(b"connection", b"close")], message)
        else:
            self.abort()

    def can_reuse(self) -> bool:
        """Both sides finished the exchange and keep-alive holds: ready for the next request."""
        if self.h11.our_state is h11.DONE and self.h11.their_state is h11.DONE:
            self.h11.start_next_cycle()
            return True
        return False

    async def close(self) -> None:
        self.write_pending()
        self.writer.close()
        with contextlib.suppress(ConnectionError, OSError):
            await self.writer.wait_closed()

    def abort(self) -> None:
        """Reset the connection (RST, what was not sent yet discarded): a client sees a broken response, never
        a truncated one that looks whole; an upstream sees a request that never completes."""
        self.write_pending()  # what was sent before the reset, as if written at once
        sock = self.writer.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.writer.transport.abort()
