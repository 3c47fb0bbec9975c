"""HTTP/1.1 messages and their parsing, without I/O: bytes in, events out (as mitmproxy's http1 layer and h11
do). gate/receiving.py feeds it what arrives, and gate/sending.py sends what the gate frames; the stub upstream
uses the same.

The parser is llhttp (httptools). In its strict mode (httptools' default) it refuses what request smuggling
relies on: bare-LF line endings, obsolete line folding, both ``Content-Length`` and ``Transfer-Encoding``,
repeated lengths, a chunked coding that is not last, bad characters in names, values and targets, malformed
chunk framing. The gate adds what llhttp leaves to its caller: a bound on the head and on a chunked body's
trailer section, which it drops (431), HTTP versions other than 1.0 and 1.1 (505), any transfer coding but
``chunked`` (501), a ``Connection`` header naming a header the message needs end to end, a missing ``Host`` on
HTTP/1.1, and a protocol upgrade with a body. A peer that breaks any of it makes a ``ProtocolError`` (with the
status a server would answer, 400, 413, 431, 501 or 505).

Writing is the gate's own (gate/framing.py): it frames every message it sends, refuses to send a header that
would break the head's lines, and holds a body to its length.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Final, cast

import httptools

Headers = list[tuple[bytes, bytes]]

# RFC 9110 7.6.1 plus the proxy-era names clients still send.
HOP_BY_HOP = frozenset({
    b"connection", b"keep-alive", b"proxy-connection", b"te", b"trailer", b"transfer-encoding",
    b"upgrade", b"proxy-authenticate", b"proxy-authorization",
})
MAX_HEADER_BYTES = 32 * 1024

# Framing tricks used for request smuggling. llhttp refuses them; these name the reason in its place.
_BARE_LF = re.compile(rb"(?<!\r)\n")
_OBS_FOLD = re.compile(rb"\r\n[ \t]")

# Headers a request cannot do without at the next hop: a Connection header that names one (so that a hop
# would drop it) makes the message's framing or target ambiguous.
_NEEDED = frozenset({b"content-length", b"transfer-encoding", b"host"})
# The headers the parser looks at itself, as they arrive.
_FRAMING = frozenset({b"connection", b"content-length", b"transfer-encoding", b"expect", b"host"})
_VERSIONS = {"1.1": b"1.1", "1.0": b"1.0"}  # the versions a head may have, as its event holds them



def framing_problem(head: bytes) -> str | None:
    """Why a raw message head is refused, or None. ``head`` ends at the blank line."""
    if _BARE_LF.search(head):
        return "bare LF line ending in the message head"
    if _OBS_FOLD.search(head):
        return "obsolete line folding in a header"
    return None



class ProtocolError(Exception):
    """The peer broke HTTP/1.1 (or the gate's stricter rules); ``status`` is what a server answers."""

    def __init__(self, reason: str, status: int = 400) -> None:
        super().__init__(reason)
        self.status = status



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


class State:
    """Where one side of a connection is in the current exchange (h11's names). Plain constants, not an Enum:
    reading an Enum member is a descriptor call on Python 3.11 (about 60 ns), and every message reads several."""

    IDLE: Final = "idle"  # nothing of this cycle's message yet
    SEND_RESPONSE: Final = "send response"  # (our side, as a server) a request arrived; no response head sent yet
    SEND_BODY: Final = "send body"  # the head went; the body is under way
    DONE: Final = "done"  # the message is complete
    MUST_CLOSE: Final = "must close"  # complete, and the connection ends after it (no keep-alive)
    SWITCHED: Final = "switched"  # a CONNECT was answered 2xx: what follows is not HTTP
    CLOSED: Final = "closed"  # (their side) the peer closed
    ERROR: Final = "error"  # (their side) the peer broke the protocol




class Broken:
    """In the event queue where the peer broke the protocol: events parsed before it are still delivered."""

    __slots__ = ("error",)

    def __init__(self, error: ProtocolError) -> None:
        self.error = error


class NoReuse:
    """In the event queue after a response head whose connection ends with it (not delivered)."""

    __slots__ = ()


NO_REUSE = NoReuse()


class MessageParser:
    """The receiving half: bytes in, events out, through llhttp's callbacks.

    llhttp parses eagerly (a pipelined request is parsed with the one before it), so events wait in
    ``events`` until the connection consumes them, and a protocol error waits there behind the events that
    came before it. The checks llhttp leaves to its caller run as each head completes."""

    def __init__(self, client: bool, max_header_bytes: int) -> None:
        self.client = client
        self.max_header_bytes = max_header_bytes
        self.events: deque[Event | Broken | NoReuse] = deque()
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
        self._in_trailers = False  # a chunk's size line came and none of its data yet: the last one's trailers
        self._trailer_bytes = 0  # bytes of the trailer section seen (bounded as a head is)
        self._until_eof = False  # (client) the response body runs until the connection closes
        self._informational = False  # (client) the message being parsed is a 1xx response
        self._head_bytes = 0  # bytes of an incomplete head seen in earlier reads
        self._head_unsized = False  # the head began in a read after a message's end: its first bytes not counted
        self._chunk_length = 0  # the read being parsed
        self._completed = False  # a message completed in the read being parsed

    def _new_parser(self) -> httptools.HttpRequestParser | httptools.HttpResponseParser:
        return httptools.HttpResponseParser(self) if self.client else httptools.HttpRequestParser(self)

    @property
    def head_started(self) -> bool:
        """Some bytes of a message head have arrived and the head is not complete."""
        return self._in_head

    # -- feeding

    def receive(self, data: bytes) -> None:
        """Parse ``data``; the events (or the error) it makes are queued."""
        if self.switching:
            self.trailing += data
            return
        if self.broken or self._ignoring:
            return
        earlier_head, earlier_trailers = self._in_head, self._in_trailers
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
            if earlier_head or not self._completed:
                self._head_bytes += len(data)
            else:  # it began after a message that ended in this read, where in it llhttp does not tell
                self._head_bytes, self._head_unsized = 0, True
            if self._head_bytes > self.max_header_bytes:
                self._break(ProtocolError(f"message head larger than {self.max_header_bytes} bytes", 431))
        elif self._in_trailers and earlier_trailers:  # a trailer field still incomplete: llhttp holds it whole
            self._trailer_bytes += len(data)
            if self._trailer_bytes > self.max_header_bytes:
                self._break(ProtocolError(f"trailer section larger than {self.max_header_bytes} bytes", 431))

    def receive_eof(self) -> None:
        if self.broken:
            return
        if self._in_head and not self._ignoring:  # a hang-up, not a broken message: head_started says so
            self.broken = True
            self.events.append(CONNECTION_CLOSED)
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
        self.events.append(Broken(error))

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
        self._headers, self._framing = [], []

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        if not self._in_head:  # a chunked body's trailer field: dropped (after its head, it reaches no one)
            self._trailer_bytes += len(name) + len(value) + 4
            if self._trailer_bytes > self.max_header_bytes:
                raise ProtocolError(f"trailer section larger than {self.max_header_bytes} bytes", 431)
            return
        name = name.lower()
        item = (name, value.rstrip(b" \t"))
        self._headers.append(item)
        if name in _FRAMING:
            self._framing.append(item)

    def on_headers_complete(self) -> None:
        parser = self._parser
        headers, framing = self._headers, self._framing
        self._in_head = False
        if self._head_unsized or self._head_bytes + self._chunk_length > self.max_header_bytes:  # else not too large
            self._head_unsized = False
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
            self._response_head(parser, headers, version, keep_alive, chunked, length)  # type: ignore[arg-type]
            return
        if version == "1.1" and not host:
            raise ProtocolError("a request without a Host header")
        method = parser.get_method()  # type: ignore[union-attr]  # a server's parser: requests
        if (chunked or length) and method != b"CONNECT" and parser.should_upgrade():
            # llhttp would leave such a body unread: to one reader a body, to another the next request.
            raise ProtocolError("a request asking for a protocol upgrade must not carry a body")
        self.events.append(Request(method, self._url, headers, _VERSIONS[version], length, chunked, keep_alive,
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
        self.events.append(Response(status, headers, b"", _VERSIONS[version]))
        if self.head_request:
            # No body, whatever the head says. llhttp cannot be told so, and would read the next response as
            # this one's body: nothing more is read, and the connection is not reused (a HEAD is rare: the
            # API's preconnect, a proxied probe).
            self._in_body, self._ignoring = False, True
            self.events += (NO_REUSE, END_OF_MESSAGE)
            return
        if not chunked and length is None and status not in (204, 304):
            self._until_eof = True  # framed by the connection's end: never reused
        if not keep_alive or self._until_eof:
            self.events.append(NO_REUSE)

    def on_chunk_header(self) -> None:
        self._in_trailers, self._trailer_bytes = True, 0

    def on_body(self, body: bytes) -> None:
        self._in_trailers = False
        if not self._ignoring:
            self.events.append(Data(body))

    def on_message_complete(self) -> None:
        self._completed, self._in_trailers = True, False
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


def hop_free(headers: Headers, drop: frozenset[bytes] = HOP_BY_HOP) -> Headers:
    """``end_to_end`` for headers whose names are in lower case, as ``MessageParser`` gives them (no name is
    lowered again: this runs on both heads of every exchange), less the names in ``drop`` too (which must hold
    ``HOP_BY_HOP``)."""
    kept = [item for item in headers if item[0] not in drop]
    if len(kept) == len(headers):  # nothing dropped: no Connection header either (it is hop-by-hop)
        return kept
    listed = {token.strip().lower() for name, value in headers if name == b"connection" for token in value.split(b",")}
    return [item for item in kept if item[0] not in listed] if listed else kept


def connection_problem(headers: Iterable[tuple[bytes, bytes]]) -> str | None:
    """Why a head's Connection header makes it unusable, or None."""
    listed = {token.strip().lower() for value in header_values(headers, b"connection") for token in value.split(b",")}
    needed = sorted(listed & _NEEDED)
    if needed:
        return f"the Connection header names {needed[0].decode()}, which the message needs end to end"
    return None


def header_values(headers: Iterable[tuple[bytes, bytes]], name: bytes) -> list[bytes]:
    return [v for n, v in headers if n.lower() == name]
