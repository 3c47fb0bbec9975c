"""The sending half of HTTP/1.1, without I/O: the heads the gate writes and each message's framing, held to
the exchange's state (``Outgoing``), as gate/http1.py is the receiving half. gate/sending.py writes what this
frames.

The gate frames every message it sends itself: a body of known length by its ``Content-Length`` (and held to
it: more or less is the gate's own error, ``LocalProtocolError``), one of unknown length chunked for an
HTTP/1.1 peer or ended by the connection's close for an HTTP/1.0 one; it refuses to send a header that would
break the head's lines, and gives a status the standard reason phrase. Header names are in lower case, as the
parser gives them and as every header the gate adds is spelled.
"""

from __future__ import annotations

from http import HTTPStatus
from typing import Final

from claude_bottle.gate.http1 import (
    Headers,
    InformationalResponse,
    LocalProtocolError,
    Request,
    Response,
    State,
)

# Below this size a message's pieces go as one bytes (one small copy costs less than a vectored write): a whole
# body framed by its length in the same bytes as its head. A larger body is a piece of its own, never copied.
JOIN_BELOW = 64 * 1024


def message_head(start: bytes, headers: Headers, body: bytes = b"") -> bytes:
    """A message head (``start`` is its first line, without its line end), and ``body`` right after it in the
    same bytes; ``LocalProtocolError`` for a header that would break the head's lines."""
    data = b"\r\n".join([start, *map(b": ".join, headers), b"", body])  # C-level: no Python per header
    lines, end = len(headers) + 2, len(data) - len(body)
    if data.count(b"\n", 0, end) != lines or data.count(b"\r", 0, end) != lines:
        raise LocalProtocolError("a header or the start line holds a line break")
    return data


class Framing:
    """How a message's body is delimited on the wire (plain constants, as ``State`` is, for the same reason)."""

    LENGTH: Final = "length"
    CHUNKED: Final = "chunked"
    UNTIL_CLOSE: Final = "until close"  # an HTTP/1.0 peer: no framing header, the connection ends the body


# The headers that bear on how a request the gate sends is framed.
_FRAMING_NAMES = frozenset({b"content-length", b"transfer-encoding", b"connection"})


def request_framing(headers: Headers) -> tuple[str, int, bool]:
    """How a request the gate sends with ``headers`` is framed: by length (its Content-Length, else none) or
    chunked, the length it promises, and whether it asks to close the connection after the exchange."""
    framing, length, close = Framing.LENGTH, 0, False
    for name, value in headers:  # names in lower case, as the gate sends them
        if name in _FRAMING_NAMES:  # one lookup for the many other headers
            if name == b"content-length":
                length = int(value)
            elif name == b"transfer-encoding":
                framing = Framing.CHUNKED
            elif b"close" in value.lower():
                close = True
    return framing, length, close


def response_framing(status: int, method: bytes, headers: Headers, peer_version: bytes, keep_alive: bool
                     ) -> tuple[str, int, bool, Headers]:
    """How a response to a ``method`` request from an HTTP/``peer_version`` client goes on the wire: its framing,
    the body length it promises, whether the connection stays open after it (``keep_alive``: so far), and its
    headers as sent. A body of unknown length is chunked for an HTTP/1.1 peer; for an HTTP/1.0 one (or no valid
    request at all) it has no framing header and the connection's end closes it."""
    length: int | None = None
    chunked = close = False
    for name, value in headers:  # names in lower case, as the gate sends them
        if name == b"content-length":
            if length is not None and int(value) != length:
                raise LocalProtocolError("conflicting Content-Length headers")
            length = int(value)
        elif name == b"transfer-encoding":
            chunked = True
        elif name == b"connection" and b"close" in value.lower():
            close = True
    if status in (204, 304) or (method == b"CONNECT" and 200 <= status < 300):
        framing, remaining = Framing.LENGTH, 0
    elif chunked or length is None:
        headers = [(n, v) for n, v in headers if n not in (b"content-length", b"transfer-encoding")]
        if peer_version == b"1.1":
            headers.append((b"transfer-encoding", b"chunked"))
            framing, remaining = Framing.CHUNKED, 0
        else:
            framing, remaining = Framing.UNTIL_CLOSE, 0
            if method != b"HEAD":
                keep_alive = False
    else:
        framing, remaining = Framing.LENGTH, length
    if method == b"HEAD":
        framing, remaining = Framing.LENGTH, 0
    if close:
        keep_alive = False
    elif not keep_alive:
        headers = [*headers, (b"connection", b"close")]
    return framing, remaining, keep_alive, headers


_PHRASES = {status.value: status.phrase.encode() for status in HTTPStatus}


def phrase(status: int) -> bytes:
    """The standard reason phrase for ``status`` (empty for a status without one)."""
    return _PHRASES.get(status, b"")


class Outgoing:
    """Our side of a connection's exchanges, as a client (``client``) or a server: what may be sent next, how
    the message under way is framed and how much of its body it still owes. A request that arrived moves it
    (``answering``: a server answers it next); ``reset`` readies it for the next exchange."""

    def __init__(self, client: bool) -> None:
        self.client = client
        self.state = State.IDLE
        self.framing = Framing.LENGTH
        self.remaining = 0  # body bytes still owed under a Content-Length
        self.keep_alive = True
        self.request_method = b""  # (server) the request being answered
        self.their_version = b""  # (server) its HTTP version; empty before one arrived

    def answering(self, request: Request) -> None:
        """(server) ``request`` arrived: a response to it is what goes next."""
        self.state = State.SEND_RESPONSE
        self.request_method, self.their_version, self.keep_alive = (request.method, request.http_version,
                                                                    request.keep_alive)

    def reset(self) -> None:
        self.state, self.request_method = State.IDLE, b""

    def request_head(self, request: Request) -> bytes:
        return message_head(*self._request_start(request))

    def response_head(self, response: Response) -> bytes:
        return message_head(*self._response_start(response))

    def informational_head(self, response: InformationalResponse) -> bytes:
        if self.client or self.state is not State.SEND_RESPONSE or not 100 <= response.status_code < 200:
            raise LocalProtocolError("an interim response outside a request, or with a final status")
        status = response.status_code
        return message_head(b"HTTP/1.1 %d %s" % (status, response.reason or phrase(status)), response.headers)

    def whole(self, head: Request | Response, body: bytes) -> list[bytes]:
        """A message whose body is all here, in one step: the pieces of its head, body and end as they go on
        the wire, the state moved past its end. A small body framed by its length goes in the head's bytes (one
        write of one piece); a large one is a piece of its own, never copied. A response to HEAD goes without
        its body."""
        start, headers = (self._request_start(head) if type(head) is Request
                          else self._response_start(head))  # type: ignore[arg-type]
        if self.state is not State.SEND_BODY:
            raise LocalProtocolError("a tunnel's answer has no body to send")
        if self.request_method == b"HEAD":
            body = b""  # the gate's own answer to HEAD (a refusal): its head only, as RFC 9110 has it
        if self.framing is Framing.LENGTH and len(body) < JOIN_BELOW:
            self.body(body)  # held to the length (the bytes are the same)
            self.end()
            return [message_head(start, headers, body)]
        pieces = [message_head(start, headers)]
        if body:
            pieces.append(self.body(body))
        if last := self.end():
            pieces.append(last)
        return pieces

    def _request_start(self, request: Request) -> tuple[bytes, Headers]:
        """The start line and headers of ``request``, with the state moved to its body."""
        if not self.client or self.state is not State.IDLE:
            raise LocalProtocolError("a request on a server connection, or before the last exchange ended")
        self.framing, self.remaining, close = request_framing(request.headers)
        if close:
            self.keep_alive = False
        self.state = State.SEND_BODY
        return request.method + b" " + request.target + b" HTTP/1.1", request.headers

    def _response_start(self, response: Response) -> tuple[bytes, Headers]:
        """The start line and headers (framed anew) of ``response``, with the state moved to its body."""
        if self.client or self.state not in (State.IDLE, State.SEND_RESPONSE):
            raise LocalProtocolError("a response on a client connection, or a second one for a request")
        status, method = response.status_code, self.request_method
        self.framing, self.remaining, self.keep_alive, headers = response_framing(
            status, method, response.headers, self.their_version, self.keep_alive)
        reason = response.reason or phrase(status)
        self.state = State.SWITCHED if method == b"CONNECT" and 200 <= status < 300 else State.SEND_BODY
        return b"HTTP/1.1 %d %s" % (status, reason), headers

    def body(self, data: bytes) -> bytes:
        """Body ``data`` as it goes on the wire, held to the message's framing."""
        if self.state is not State.SEND_BODY:
            raise LocalProtocolError("body data outside a message")
        if self.framing is Framing.LENGTH:
            self.remaining -= len(data)
            if self.remaining < 0:
                raise LocalProtocolError("more body than its Content-Length")
        return b"%x\r\n%b\r\n" % (len(data), data) if data and self.framing is Framing.CHUNKED else data

    def end(self) -> bytes:
        """The message's end: what its framing needs (the last chunk), with the state moved past it."""
        if self.state is not State.SEND_BODY:
            raise LocalProtocolError("end of a message that was not started")
        if self.framing is Framing.LENGTH and self.remaining:
            raise LocalProtocolError("less body than its Content-Length")
        self.state = State.DONE if self.keep_alive else State.MUST_CLOSE
        return b"0\r\n\r\n" if self.framing is Framing.CHUNKED else b""
