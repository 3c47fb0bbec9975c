"""HTTP/1.1 as an asyncio protocol, parsed by llhttp (httptools) as bytes arrive; used for both sides of every
exchange (and the stub upstream).

llhttp in its strict mode (httptools' default) refuses what request smuggling relies on: bare-LF line
endings, obsolete line folding, both ``Content-Length`` and ``Transfer-Encoding``, repeated lengths, a
chunked coding that is not last, bad characters in names, values and targets, malformed chunk framing.
The gate adds what llhttp leaves to its caller: a bound on the head (431), HTTP versions other than 1.0 and
1.1 (505), any transfer coding but ``chunked`` (501), a ``Connection`` header naming a header the message
needs end to end, a missing ``Host`` on HTTP/1.1, and a protocol upgrade with a body. Writing is the
gate's own: it frames every message it sends (its length, chunked, or until the close for an HTTP/1.0
peer), refuses to send a header that would break the head's lines, and holds a body to its length.

A connection does not know whose side it is on, so its errors name no side: a peer that breaks the protocol
raises ``ProtocolError`` (with the status a server would answer, 400, 413, 431, 501 or 505), one that closes
or resets raises ``PeerGone``, one that goes silent ``TimeoutError``. The forward path says whose fault each
one was (gate/failures.py), once, where it steps on that side.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import json
import re
import socket
import ssl
import struct
from collections import deque
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any, cast

import httptools

Headers = list[tuple[bytes, bytes]]

# RFC 9110 7.6.1 plus the proxy-era names clients still send.
HOP_BY_HOP = frozenset({
    b"connection", b"keep-alive", b"proxy-connection", b"te", b"trailer", b"transfer-encoding",
    b"upgrade", b"proxy-authenticate", b"proxy-authorization",
})
MAX_HEADER_BYTES = 32 * 1024
READ_SIZE = 64 * 1024

# Framing tricks used for request smuggling. llhttp refuses them; these name the reason in its place.
_BARE_LF = re.compile(rb"(?<!\r)\n")
_OBS_FOLD = re.compile(rb"\r\n[ \t]")

# Headers a request cannot do without at the next hop: a Connection header that names one (so that a hop
# would drop it) makes the message's framing or target ambiguous.
_NEEDED = frozenset({b"content-length", b"transfer-encoding", b"host"})
# The headers the parser looks at itself, as they arrive.
_FRAMING = frozenset({b"connection", b"content-length", b"transfer-encoding", b"expect", b"host"})

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


class LocalProtocolError(Exception):
    """The gate itself tried to send what the exchange does not allow: a message in the wrong state, a body
    longer or shorter than its declared length, a header that would break the head's lines."""


# ------------------------------------------------------------------------------------------------ events


@dataclass(slots=True)
class Request:
    """A request head. ``headers``: names in lower case, values without surrounding whitespace, in the order
    received. ``content_length`` is None when the request declared none; ``keep_alive`` is False for
    HTTP/1.0 and ``Connection: close``; ``expects_continue`` for ``Expect: 100-continue`` on HTTP/1.1."""

    method: bytes
    target: bytes
    headers: Headers
    http_version: bytes = b"1.1"
    content_length: int | None = None
    chunked: bool = False
    keep_alive: bool = True
    expects_continue: bool = False


@dataclass(slots=True)
class Response:
    """A final response head (status 200 and up). ``reason``: empty means the standard phrase."""

    status_code: int
    headers: Headers = field(default_factory=list)
    reason: bytes = b""
    http_version: bytes = b"1.1"


@dataclass(slots=True)
class InformationalResponse:
    """A 1xx response head (never 101: the gate switches no protocol)."""

    status_code: int
    headers: Headers = field(default_factory=list)
    reason: bytes = b""


@dataclass(slots=True)
class Data:
    data: bytes


class EndOfMessage:
    """The current message's body is complete."""

    __slots__ = ()


class ConnectionClosed:
    """The peer closed its side between messages (or, in a body, before the end: see ``body``)."""

    __slots__ = ()


Event = Request | Response | InformationalResponse | Data | EndOfMessage | ConnectionClosed
END_OF_MESSAGE = EndOfMessage()
CONNECTION_CLOSED = ConnectionClosed()


class State(enum.Enum):
    """Where one side of a connection is in the current exchange (h11's names)."""

    IDLE = "idle"  # nothing of this cycle's message yet
    SEND_RESPONSE = "send response"  # (our side, as a server) a request arrived; no response head sent yet
    SEND_BODY = "send body"  # the head went; the body is under way
    DONE = "done"  # the message is complete
    MUST_CLOSE = "must close"  # complete, and the connection ends after it (no keep-alive)
    SWITCHED = "switched"  # a CONNECT was answered 2xx: what follows is not HTTP
    CLOSED = "closed"  # (their side) the peer closed
    ERROR = "error"  # (their side) the peer broke the protocol


class _Broken:
    """In the event queue where the peer broke the protocol: events parsed before it are still delivered."""

    __slots__ = ("error",)

    def __init__(self, error: ProtocolError) -> None:
        self.error = error


class _NoReuse:
    """In the event queue after a response head whose connection ends with it (not delivered)."""

    __slots__ = ()


_NO_REUSE = _NoReuse()


class _Incoming:
    """The receiving half: bytes in, events out, through llhttp's callbacks.

    llhttp parses eagerly (a pipelined request is parsed with the one before it), so events wait in
    ``events`` until the connection consumes them, and a protocol error waits there behind the events that
    came before it. The checks llhttp leaves to its caller run as each head completes."""

    def __init__(self, client: bool, max_header_bytes: int) -> None:
        self.client = client
        self.max_header_bytes = max_header_bytes
        self.events: deque[Event | _Broken | _NoReuse] = deque()
        self.trailing = b""  # bytes after a CONNECT head, kept until it is answered
        self.switching = False  # a CONNECT head was parsed: what follows is not parsed until it is refused
        self.head_request = False  # (client) the request in flight is HEAD: its response has no body
        self.broken = False  # the peer broke the protocol: nothing more is parsed
        self._ignoring = False  # the rest of what arrives is not read (after a response to HEAD)
        self._parser = self._new_parser()
        self._url = b""
        self._headers: Headers = []
        self._framing: Headers = []  # the headers of _FRAMING, as they arrive
        self._in_head = False  # a message began and its head is not complete
        self._in_body = False  # a head completed and its message did not
        self._until_eof = False  # (client) the response body runs until the connection closes
        self._informational = False  # (client) the message being parsed is a 1xx response
        self._head_bytes = 0  # bytes of an incomplete head seen in earlier reads
        self._chunk_length = 0  # the read being parsed
        self._completed = False  # a message completed in the read being parsed

    def _new_parser(self) -> httptools.HttpRequestParser | httptools.HttpResponseParser:
        return httptools.HttpResponseParser(self) if self.client else httptools.HttpRequestParser(self)

    # -- feeding

    def receive(self, data: bytes) -> None:
        """Parse ``data``; the events (or the error) it makes are queued."""
        if self.switching:
            self.trailing += data
            return
        if self.broken or self._ignoring:
            return
        earlier_head = self._in_head
        self._chunk_length, self._completed = len(data), False
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade as upgrade:
            self._upgraded(data[upgrade.args[0]:])
            return
        except httptools.HttpParserCallbackError as exc:
            cause = exc.__context__
            self._break(cause if isinstance(cause, ProtocolError) else ProtocolError(str(exc)))
            return
        except httptools.HttpParserError as exc:
            self._break(self._explain(exc, data))
            return
        if self._in_head:  # a head still incomplete after this read: bound what it may grow to
            self._head_bytes = self._head_bytes + len(data) if earlier_head or not self._completed else 0
            if self._head_bytes > self.max_header_bytes:
                self._break(ProtocolError(f"message head larger than {self.max_header_bytes} bytes", 431))

    def receive_eof(self) -> None:
        if self.broken:
            return
        if self._in_head and not self._ignoring:
            self._break(ProtocolError("the peer closed the connection in the middle of a message head"))
            return
        if self._in_body and self._until_eof:
            self._in_body = False
            self.events.append(END_OF_MESSAGE)
        self.events.append(CONNECTION_CLOSED)

    def resume(self) -> None:
        """A CONNECT was refused: what followed it is parsed as the next request."""
        rest, self.trailing, self.switching = self.trailing, b"", False
        self._parser = self._new_parser()
        if rest:
            self.receive(rest)

    def _break(self, error: ProtocolError) -> None:
        self.broken = True
        self.events.append(_Broken(error))

    def _upgraded(self, rest: bytes) -> None:
        """llhttp stopped after a CONNECT head, or a request that asks to switch protocols."""
        if self.client:
            self._break(ProtocolError("the server switched protocols (101), which the gate does not relay"))
        elif cast(httptools.HttpRequestParser, self._parser).get_method() == b"CONNECT":
            # What follows is the tunnel's first bytes, or if the CONNECT is refused, the next request.
            self.switching, self.trailing = True, rest
        else:
            # The gate switches no protocol (Upgrade is hop-by-hop): an ordinary request; go on after it.
            self._parser = self._new_parser()
            if rest:
                self.receive(rest)

    def _explain(self, exc: httptools.HttpParserError, data: bytes) -> ProtocolError:
        """llhttp's error, in the gate's words where they say more (and with the status a server answers)."""
        reason = str(exc)
        if "HTTP version" in reason:
            return ProtocolError(f"HTTP/{self._parser.get_http_version()} is not supported", 505)
        if "Transfer-Encoding" in reason and "Content-Length" in reason:
            return ProtocolError("both Content-Length and Transfer-Encoding")
        if "Transfer-Encoding" in reason:
            return ProtocolError(f"Transfer-Encoding other than chunked is not supported ({reason})", 501)
        if "Duplicate Content-Length" in reason:
            return ProtocolError("repeated Content-Length header")
        framing = framing_problem(data)
        if framing is not None and ("CR" in reason or "LF" in reason or "whitespace" in reason):
            return ProtocolError(framing)
        return ProtocolError(reason)

    # -- llhttp's callbacks

    def on_message_begin(self) -> None:
        self._in_head = True
        self._url = b""
        self._headers, self._framing = [], []  # (a chunked body's trailers, which the gate drops, went here)

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        item = (name, value.rstrip(b" \t"))
        self._headers.append(item)
        if name in _FRAMING:
            self._framing.append(item)

    def on_headers_complete(self) -> None:
        parser = self._parser
        headers, framing = self._headers, self._framing
        self._in_head = False
        if self._head_bytes + self._chunk_length > self.max_header_bytes:  # else it cannot be too large
            size = len(self._url) + sum(len(n) + len(v) + 4 for n, v in headers) + 16
            if size > self.max_header_bytes:
                raise ProtocolError(f"message head larger than {self.max_header_bytes} bytes", 431)
        self._head_bytes = 0
        version = parser.get_http_version()
        if version != "1.1" and version != "1.0":
            raise ProtocolError(f"HTTP/{version} is not supported", 505)
        keep_alive, chunked, length, expect, host = version == "1.1", False, None, False, False
        for name, value in framing:
            if name == b"connection":
                tokens = {token.strip().lower() for token in value.split(b",")}
                needed = sorted(tokens & _NEEDED)
                if needed:
                    raise ProtocolError(f"the Connection header names {needed[0].decode()}, which the message "
                                        "needs end to end")
                if b"close" in tokens:
                    keep_alive = False
            elif name == b"transfer-encoding":
                if chunked or value.lower() != b"chunked":
                    raise ProtocolError("Transfer-Encoding other than chunked is not supported", 501)
                chunked = True
            elif name == b"content-length":
                length = int(value)  # llhttp has checked it is one number, given once
            elif name == b"expect":
                expect = value.lower() == b"100-continue"
            else:
                host = True
        if chunked and length is not None:  # llhttp refuses it too
            raise ProtocolError("both Content-Length and Transfer-Encoding")
        self._in_body = True
        if self.client:
            self._response_head(cast(httptools.HttpResponseParser, parser), headers, version, keep_alive, chunked,
                                length)
            return
        if version == "1.1" and not host:
            raise ProtocolError("a request without a Host header")
        method = cast(httptools.HttpRequestParser, parser).get_method()
        if (chunked or length) and method != b"CONNECT" and parser.should_upgrade():
            # llhttp would leave such a body unread: to one reader a body, to another the next request.
            raise ProtocolError("a request asking for a protocol upgrade must not carry a body")
        self.events.append(Request(method, self._url, headers, version.encode(), length, chunked, keep_alive,
                                   expect and version == "1.1"))

    def _response_head(self, parser: httptools.HttpResponseParser, headers: Headers, version: str,
                       keep_alive: bool, chunked: bool, length: int | None) -> None:
        status = parser.get_status_code()
        if status < 200:
            if status == 101:
                return  # llhttp stops after this head: _upgraded refuses it
            self._informational = True
            self.events.append(InformationalResponse(status, headers))
            return
        self.events.append(Response(status, headers, b"", version.encode()))
        if self.head_request:
            # No body, whatever the head says. llhttp cannot be told so, and would read the next response as
            # this one's body: nothing more is read, and the connection is not reused (a HEAD is rare: the
            # API's preconnect, a proxied probe).
            self._in_body, self._ignoring = False, True
            self.events += (_NO_REUSE, END_OF_MESSAGE)
            return
        if not chunked and length is None and status not in (204, 304):
            self._until_eof = True  # framed by the connection's end: never reused
        if not keep_alive or self._until_eof:
            self.events.append(_NO_REUSE)

    def on_body(self, body: bytes) -> None:
        if not self._ignoring:
            self.events.append(Data(body))

    def on_message_complete(self) -> None:
        self._completed = True
        if self._informational:
            self._informational = False
            return
        self._in_body = False
        if not self._ignoring:
            self.events.append(END_OF_MESSAGE)



# ------------------------------------------------------------------------------------------------ headers


def end_to_end(headers: Iterable[tuple[bytes, bytes]]) -> Headers:
    """Drop hop-by-hop headers, including every name the Connection header lists."""
    headers = list(headers)
    listed = {
        token.strip().lower()
        for name, value in headers if name.lower() == b"connection"
        for token in value.split(b",")
    }
    drop = HOP_BY_HOP | listed if listed else HOP_BY_HOP
    return [(n, v) for n, v in headers if n.lower() not in drop]


def connection_problem(headers: Iterable[tuple[bytes, bytes]]) -> str | None:
    """Why a head's Connection header makes it unusable, or None."""
    listed = {token.strip().lower() for value in header_values(headers, b"connection") for token in value.split(b",")}
    needed = sorted(listed & _NEEDED)
    if needed:
        return f"the Connection header names {needed[0].decode()}, which the message needs end to end"
    return None


def header_values(headers: Iterable[tuple[bytes, bytes]], name: bytes) -> list[bytes]:
    return [v for n, v in headers if n.lower() == name]


def _head(start: bytes, headers: Headers) -> bytes:
    """A message head; ``LocalProtocolError`` for a header that would break its lines."""
    data = b"".join([start, *[n + b": " + v + b"\r\n" for n, v in headers], b"\r\n"])
    lines = len(headers) + 2
    if data.count(b"\n") != lines or data.count(b"\r") != lines:
        raise LocalProtocolError("a header or the start line holds a line break")
    return data


class _Framing(enum.Enum):
    LENGTH = "length"
    CHUNKED = "chunked"
    UNTIL_CLOSE = "until close"  # an HTTP/1.0 peer: no framing header, the connection ends the body


# ------------------------------------------------------------------------------------------------ connection

# Bytes received and parsed but not yet taken by the connection's reader, above which the connection stops
# reading from its socket until they are taken (a client pipelining faster than the gate forwards).
READ_HIGH_WATER = 256 * 1024


class HttpConnection(asyncio.Protocol):
    """One HTTP/1.1 connection, as a server (the default) or, with ``client``, as a client: read messages and
    body chunks, send messages. It is the transport's protocol: what arrives is parsed as it arrives, and a
    reader waiting in ``next_event`` is woken only when an event is ready.

    Writes are coalesced: the head and body pieces of a message still being sent wait in ``_pending`` and go
    out in one write when the message ends, or at the latest when the event loop next waits (a callback
    scheduled with the first piece), so a streamed body is never held back. Anything else goes at once.

    After a CONNECT is answered 2xx, what the client sends is no longer HTTP: ``trailing_data`` holds what came
    before the answer, and ``tunnel_reader`` what comes after, for the tunnel's first-flight check and relay."""

    def __init__(self, *, client: bool = False, max_header_bytes: int = MAX_HEADER_BYTES) -> None:
        self.client = client
        self.transport: asyncio.Transport = None  # type: ignore[assignment]  # set by connection_made
        self._loop: asyncio.AbstractEventLoop = None  # type: ignore[assignment]  # likewise
        self.peer = "unknown"
        self._incoming = _Incoming(client, max_header_bytes)
        self.our_state = State.IDLE
        self.their_state = State.IDLE
        self.json_errors = False  # refusals as Anthropic API error bodies (the API listener) instead of text
        self.they_are_waiting_for_100_continue = False
        self._pending: list[bytes] = []  # bytes of the message being sent, not yet written
        self._framing = _Framing.LENGTH
        self._remaining = 0  # body bytes still owed under a Content-Length
        self._keep_alive = True
        self._request_method = b""  # (server) the request being answered
        self._their_version = b""  # (server) its HTTP version; empty before one arrived
        self._waiter: asyncio.Future[None] | None = None  # the reader, waiting for an event
        self._deadline: float | None = None  # when that wait times out
        self._timer: asyncio.TimerHandle | None = None
        self._unread = 0  # bytes received since the event queue was last empty
        self._reading_paused = False
        self._writing_paused = False  # the transport's buffer is over its high-water mark
        self._drain_waiters: list[asyncio.Future[None]] = []
        self._lost = False
        self._eof = False  # the peer closed its side
        self._closed: asyncio.Future[None] | None = None
        self._tunnel: asyncio.StreamReader | None = None

    # -- the transport's protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self._loop = asyncio.get_running_loop()
        self._closed = self._loop.create_future()
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else "unknown"

    def data_received(self, data: bytes) -> None:
        if self._tunnel is not None:
            self._tunnel.feed_data(data)
            return
        self._incoming.receive(data)
        self._unread += len(data)
        if self._unread > READ_HIGH_WATER and not self._reading_paused:
            self._reading_paused = True
            self.transport.pause_reading()
        self._wake()

    def eof_received(self) -> bool:
        self._eof = True
        if self._tunnel is not None:
            self._tunnel.feed_eof()
        else:
            self._incoming.receive_eof()
            self._wake()
        # Keep the transport open for the answer (a half-closed client still reads); TLS cannot half-close.
        return self.transport.get_extra_info("sslcontext") is None

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = self._eof = True
        if self._tunnel is not None:
            self._tunnel.feed_eof()
        else:
            self._incoming.receive_eof()
            self._wake()
        for waiter in self._drain_waiters:
            if not waiter.done():
                waiter.set_exception(PeerGone(str(exc) if exc else "connection lost"))
        self._drain_waiters.clear()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._closed is not None and not self._closed.done():
            self._closed.set_result(None)

    def pause_writing(self) -> None:
        self._writing_paused = True

    def resume_writing(self) -> None:
        self._writing_paused = False
        for waiter in self._drain_waiters:
            if not waiter.done():
                waiter.set_result(None)
        self._drain_waiters.clear()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done() and self._incoming.events:
            waiter.set_result(None)

    # -- receiving

    def receive_data(self, data: bytes) -> None:
        """Parse ``data`` as if it had arrived (b"" for the peer's end); ``next_event`` delivers what it holds."""
        if data:
            self._incoming.receive(data)
        else:
            self._incoming.receive_eof()

    async def _wait(self, deadline: float | None) -> None:
        """Until an event is queued; TimeoutError at ``deadline`` (the loop's clock). One timer serves every
        wait: it is armed once and, when it fires before the current deadline, armed again for it."""
        loop = self._loop
        if self._reading_paused:
            self._reading_paused = False
            self.transport.resume_reading()
        self._waiter = waiter = loop.create_future()
        self._deadline = deadline
        if deadline is not None and (self._timer is None or deadline < self._timer.when()):
            if self._timer is not None:
                self._timer.cancel()
            self._timer = loop.call_at(deadline, self._expire)
        try:
            await waiter
        finally:
            self._waiter = self._deadline = None

    def _expire(self) -> None:
        self._timer = None
        waiter, deadline = self._waiter, self._deadline
        if waiter is None or deadline is None or waiter.done():
            return
        loop = self._loop
        if loop.time() >= deadline:
            waiter.set_exception(TimeoutError())
        else:
            self._timer = loop.call_at(deadline, self._expire)

    async def next_event(self, timeout: float | None = None, deadline: float | None = None) -> Event:
        """The next event, waiting for it if none has arrived: ``timeout`` bounds each wait, ``deadline`` (the
        loop's clock) all of them."""
        events = self._incoming.events
        while True:
            while not events:
                until = deadline
                if timeout is not None:
                    until = self._loop.time() + timeout
                    until = until if deadline is None else min(deadline, until)
                await self._wait(until)
            event = self._take()
            if event is not None:
                return event

    def _take(self) -> Event | None:
        """The first queued event, with the connection's state moved past it; None for a marker that is not
        delivered."""
        events = self._incoming.events
        event = events.popleft()
        if not events:
            self._unread = 0
        if isinstance(event, Data):
            self.they_are_waiting_for_100_continue = False
        elif event is END_OF_MESSAGE:
            self.their_state = State.DONE if self._keep_alive else State.MUST_CLOSE
        elif isinstance(event, Request):
            self.their_state, self.our_state = State.SEND_BODY, State.SEND_RESPONSE
            self._request_method, self._their_version = event.method, event.http_version
            self._keep_alive = event.keep_alive
            self.they_are_waiting_for_100_continue = event.expects_continue
        elif isinstance(event, Response):
            self.their_state = State.SEND_BODY
        elif event is _NO_REUSE:
            self._keep_alive = False
            return None
        elif isinstance(event, _Broken):
            events.appendleft(event)  # every later call raises it too
            self.their_state = State.ERROR
            raise event.error
        elif event is CONNECTION_CLOSED:
            self.their_state = State.CLOSED
            events.appendleft(event)
        return event  # type: ignore[return-value]

    @property
    def head_started(self) -> bool:
        """Some bytes of the next request head have arrived."""
        return self._incoming._in_head

    @property
    def trailing_data(self) -> bytes:
        """The bytes that came after a CONNECT head, before it was answered: the tunnel's, once answered 2xx."""
        return self._incoming.trailing

    @property
    def tunnel_reader(self) -> asyncio.StreamReader:
        """After a CONNECT was answered 2xx: the bytes that arrive from then on (see ``trailing_data``)."""
        if self._tunnel is None:
            raise LocalProtocolError("no tunnel: the connection has not switched")
        return self._tunnel

    @property
    def usable(self) -> bool:
        """Neither side has closed the connection (a kept-alive one may be used again)."""
        return not self._eof and not self.transport.is_closing()

    async def read_request(self, timeout: float | None) -> Request | None:
        """The next request head, or None when the client closed cleanly between requests. ``timeout``
        bounds the whole head, however its bytes trickle in."""
        deadline = None if timeout is None else self._loop.time() + timeout
        event = await self.next_event(deadline=deadline)
        if isinstance(event, ConnectionClosed):
            return None
        if not isinstance(event, Request):
            raise ProtocolError(f"unexpected {type(event).__name__} before a request")
        return event

    def arrived_body(self) -> bytes | None:
        """The current message's whole body if all of it has arrived (taken, as ``body`` would deliver it),
        else None, with nothing taken. A small message usually arrives in one read: then no wait, no stream."""
        events = self._incoming.events
        chunks = []
        for event in events:
            if event is END_OF_MESSAGE:
                break
            if type(event) is not Data:
                return None
            chunks.append(event.data)
        else:
            return None
        for _ in range(len(chunks) + 1):
            self._take()
        return b"".join(chunks)

    async def body(self, timeout: float | None) -> AsyncIterator[bytes]:
        """The current message's body chunks as they arrive."""
        while True:
            event = await self.next_event(timeout)
            if isinstance(event, Data):
                yield event.data
            elif event is END_OF_MESSAGE:
                return
            elif event is CONNECTION_CLOSED:
                raise PeerGone("connection closed in the middle of a body")
            else:
                raise ProtocolError(f"unexpected {type(event).__name__} in a body")

    # -- sending

    async def send(self, event: Request | Response | InformationalResponse | Data | EndOfMessage) -> None:
        """Frame ``event`` and send it (see the class's note on coalescing). Header names in lower case."""
        if isinstance(event, Data):
            if data := self._framed(event.data):
                self._keep(data)
            await self._drain()  # backpressure: the transport holds what went before
        elif isinstance(event, EndOfMessage):
            self._end()
            await self._flush()
        elif isinstance(event, Request):
            self._keep(self._request_head(event))
        elif isinstance(event, Response):
            head = self._response_head(event)
            if self.our_state is State.SWITCHED:  # what follows is not HTTP: the answer goes now
                self._pending.append(head)
                self._tunnel = asyncio.StreamReader(limit=READ_HIGH_WATER)
                self._tunnel.set_transport(self.transport)
                if self._eof:
                    self._tunnel.feed_eof()
                if self._reading_paused:
                    self._reading_paused = False
                    self.transport.resume_reading()
                await self._flush()
            else:
                self._keep(head)
        else:
            self._pending.append(self._informational_head(event))
            await self._flush()

    async def send_whole(self, head: Request | Response, body: bytes) -> None:
        """A message whose body is all here: ``head``, ``body`` and its end, in one write."""
        data = self._request_head(head) if isinstance(head, Request) else self._response_head(head)
        if self.our_state is State.SWITCHED:
            raise LocalProtocolError("a tunnel's answer has no body to send")
        self._pending.append(data)
        if data := self._framed(body):
            self._pending.append(data)
        self._end()
        await self._flush()

    def _framed(self, data: bytes) -> bytes:
        """Body ``data`` as it goes on the wire, held to the message's framing."""
        if self.our_state is not State.SEND_BODY:
            raise LocalProtocolError("body data outside a message")
        if self._framing is _Framing.LENGTH:
            self._remaining -= len(data)
            if self._remaining < 0:
                raise LocalProtocolError("more body than its Content-Length")
        return b"%x\r\n%b\r\n" % (len(data), data) if data and self._framing is _Framing.CHUNKED else data

    def _end(self) -> None:
        """The message's end: what its framing needs (the last chunk), then the state after it."""
        if self.our_state is not State.SEND_BODY:
            raise LocalProtocolError("end of a message that was not started")
        if self._framing is _Framing.CHUNKED:
            self._pending.append(b"0\r\n\r\n")
        elif self._framing is _Framing.LENGTH and self._remaining:
            raise LocalProtocolError("less body than its Content-Length")
        self.our_state = State.DONE if self._keep_alive else State.MUST_CLOSE

    def _keep(self, data: bytes) -> None:
        """Hold ``data`` back with the rest of the message, to go out by the time the event loop next waits."""
        if not self._pending:
            self._loop.call_soon(self.write_pending)
        self._pending.append(data)

    def _request_head(self, request: Request) -> bytes:
        if not self.client or self.our_state is not State.IDLE:
            raise LocalProtocolError("a request on a server connection, or before the last exchange ended")
        self._framing, self._remaining = _Framing.LENGTH, 0
        for name, value in request.headers:
            name = name.lower()
            if name == b"content-length":
                self._remaining = int(value)
            elif name == b"transfer-encoding":
                self._framing = _Framing.CHUNKED
            elif name == b"connection" and b"close" in value.lower():
                self._keep_alive = False
        self._incoming.head_request = request.method == b"HEAD"
        self.our_state = State.SEND_BODY
        return _head(request.method + b" " + request.target + b" HTTP/1.1\r\n", request.headers)

    def _response_head(self, response: Response) -> bytes:
        if self.client or self.our_state not in (State.IDLE, State.SEND_RESPONSE):
            raise LocalProtocolError("a response on a client connection, or a second one for a request")
        status, method, headers = response.status_code, self._request_method, response.headers
        length: int | None = None
        chunked = close = False
        for name, value in headers:
            name = name.lower()
            if name == b"content-length":
                if length is not None and int(value) != length:
                    raise LocalProtocolError("conflicting Content-Length headers")
                length = int(value)
            elif name == b"transfer-encoding":
                chunked = True
            elif name == b"connection" and b"close" in value.lower():
                close = True
        if status in (204, 304) or (method == b"CONNECT" and 200 <= status < 300):
            self._framing, self._remaining = _Framing.LENGTH, 0
        elif chunked or length is None:
            # A body of unknown length: chunked for an HTTP/1.1 peer; for an HTTP/1.0 one (or no valid
            # request at all), no framing header and the connection's end closes the body.
            headers = [(n, v) for n, v in headers if n.lower() not in (b"content-length", b"transfer-encoding")]
            if self._their_version == b"1.1":
                headers.append((b"transfer-encoding", b"chunked"))
                self._framing = _Framing.CHUNKED
            else:
                self._framing = _Framing.UNTIL_CLOSE
                if method != b"HEAD":
                    self._keep_alive = False
        else:
            self._framing, self._remaining = _Framing.LENGTH, length
        if method == b"HEAD":
            self._framing, self._remaining = _Framing.LENGTH, 0
        if close:
            self._keep_alive = False
        elif not self._keep_alive:
            headers = [*headers, (b"connection", b"close")]
        reason = response.reason or _phrase(status)
        self.our_state = State.SWITCHED if method == b"CONNECT" and 200 <= status < 300 else State.SEND_BODY
        return _head(b"HTTP/1.1 %d %s\r\n" % (status, reason), headers)

    def _informational_head(self, response: InformationalResponse) -> bytes:
        if self.client or self.our_state is not State.SEND_RESPONSE or not 100 <= response.status_code < 200:
            raise LocalProtocolError("an interim response outside a request, or with a final status")
        self.they_are_waiting_for_100_continue = False
        return _head(b"HTTP/1.1 %d %s\r\n" % (response.status_code, response.reason or _phrase(response.status_code)),
                     response.headers)

    async def _flush(self) -> None:
        self.write_pending()
        await self._drain()

    async def _drain(self) -> None:
        """Wait while the transport holds more than its high-water mark; PeerGone once the peer is gone."""
        if self._lost:
            raise PeerGone("connection lost")
        if self._writing_paused:
            waiter = self._loop.create_future()
            self._drain_waiters.append(waiter)
            await waiter

    def write_pending(self) -> None:
        """Hand what ``send`` has kept back to the transport, in one write."""
        if self._pending:
            data = b"".join(self._pending)
            self._pending.clear()
            if not self.transport.is_closing():
                self.transport.write(data)

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
        await self.send_whole(Response(status, head, phrase.encode()), body)

    async def refuse(self, status: int, reason: str, timeout: float, message: str | None = None,
                     max_body: int = 1 << 20) -> None:
        """Answer a refused request (``message``: the body's text, default ``reason``). A small body is read
        first so the connection stays usable; past ``max_body``, or when the body stops coming for ``timeout``,
        the connection is closed after the answer."""
        if self.their_state is State.SEND_BODY:
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
        if not self.transport.is_closing():
            self.transport.write(head + body)
        await self.close()

    async def fail(self, status: int, reason: str, message: str | None = None) -> None:
        """Report a failure: as a response if none has started, else by resetting the connection."""
        if self.our_state in (State.IDLE, State.SEND_RESPONSE):
            await self.send_simple(status, reason, [(b"connection", b"close")], message)
        else:
            self.abort()

    def can_reuse(self) -> bool:
        """Both sides finished the exchange and keep-alive holds: ready for the next one."""
        if self.our_state is State.DONE and self.their_state is State.DONE:
            self.our_state = self.their_state = State.IDLE
            self._request_method = b""
            self._incoming.head_request = False
            if self._incoming.switching:  # a refused CONNECT: what followed it is the next request
                self._incoming.resume()
            return True
        return False

    async def close(self) -> None:
        """Close once what was written has gone, and wait for the transport to let go."""
        self.write_pending()
        self.transport.close()
        if self._closed is not None:
            await asyncio.shield(self._closed)

    def abort(self) -> None:
        """Reset the connection (RST, what was not sent yet discarded): a client sees a broken response, never
        a truncated one that looks whole; an upstream sees a request that never completes."""
        self.write_pending()  # what was sent before the reset, as if written at once
        sock = self.transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.transport.abort()


async def serve_http(handle: Callable[[HttpConnection], Coroutine[Any, Any, None]], host: str, port: int,
                     tls: ssl.SSLContext | None = None, max_header_bytes: int = MAX_HEADER_BYTES) -> asyncio.Server:
    """A server whose every connection is an ``HttpConnection`` served by ``handle``, in a task of its own
    that the connection holds (as ``asyncio.start_server`` does for streams)."""
    return await asyncio.get_running_loop().create_server(
        lambda: _Served(handle, max_header_bytes), host, port, ssl=tls)


class _Served(HttpConnection):
    """A server's connection: ``handle`` starts on it as soon as the connection is made."""

    def __init__(self, handle: Callable[[HttpConnection], Coroutine[Any, Any, None]], max_header_bytes: int
                 ) -> None:
        super().__init__(max_header_bytes=max_header_bytes)
        self._handle = handle
        self.task: asyncio.Task[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self.task = asyncio.get_running_loop().create_task(self._handle(self))


async def open_http(host: str, port: int, tls: ssl.SSLContext | None = None, server_name: str | None = None
                    ) -> HttpConnection:
    """A client ``HttpConnection`` to ``host``:``port`` (with TLS for ``server_name`` if ``tls`` is given)."""
    conn = HttpConnection(client=True)  # made here: with TLS, uvloop may hand back its own protocol instead
    await asyncio.get_running_loop().create_connection(lambda: conn, host, port, ssl=tls, server_hostname=server_name)
    return conn


_PHRASES = {status.value: status.phrase.encode() for status in HTTPStatus}


def _phrase(status: int) -> bytes:
    """The standard reason phrase for ``status`` (empty for a status without one)."""
    return _PHRASES.get(status, b"")
