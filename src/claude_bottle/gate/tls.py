"""The server name in a TLS ClientHello, read from the first bytes a client sends into a tunnel.

Pure and incremental: ``read_client_hello(data)`` looks at everything received so far and returns None
while more is needed, the ClientHello once it is complete, or raises ``NotTls`` (the bytes are not a TLS
handshake at all) or ``BadHello`` (they start like one but break its rules). The hello may arrive split over
several TLS records and any number of TCP segments; ``MAX_HELLO`` bounds what is buffered to find it.

Only what the gate decides on is parsed (RFC 8446 4.1.2, RFC 6066 3); the rest is length-checked and
skipped. Strict where a lenient parser could be fooled into reading a different name than the server
would: every length must add up exactly, an extension may appear once, and the name list may hold one
host name. Written here rather than taken from a TLS library: those that parse hellos (scapy, dpkt,
tlslite-ng) are general dissectors, large for the gate image and lenient by design, and none takes input
incrementally with a bound; the gate needs one field and strictness.
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_HELLO = 32 * 1024  # real ClientHellos are 0.5-3 KiB (post-quantum key shares included)
HANDSHAKE = 22  # TLS record content type
CLIENT_HELLO = 1  # handshake message type
SERVER_NAME = 0  # extension type
HOST_NAME = 0  # server name type
MAX_RECORD = 16384 + 256  # RFC 8446 5.1: a plaintext record's fragment is at most 2^14 bytes
MAX_RECORDS = 64  # clients use one record, two for a hello past 16 KiB; splitters a few more


class BadHello(ValueError):
    """TLS-looking bytes that are not an acceptable ClientHello; the message says what was wrong."""


class NotTls(BadHello):
    """The first bytes are not a TLS handshake record."""


@dataclass(frozen=True)
class ClientHello:
    server_name: str | None  # the SNI host name as sent (ASCII, not yet normalised); None if absent
    size: int  # bytes of ``data`` the records carrying the hello took


class _Reader:
    """Bounds-checked reads over one byte string; running past the end is a BadHello."""

    def __init__(self, data: bytes, what: str) -> None:
        self.data, self.at, self.what = data, 0, what

    def take(self, n: int) -> bytes:
        if self.at + n > len(self.data):
            raise BadHello(f"{self.what} is truncated")
        piece = self.data[self.at : self.at + n]
        self.at += n
        return piece

    def number(self, width: int) -> int:
        return int.from_bytes(self.take(width), "big")

    def vector(self, width: int) -> _Reader:
        """A length-prefixed field, as its own reader."""
        return _Reader(self.take(self.number(width)), self.what)

    def left(self) -> int:
        return len(self.data) - self.at


def read_client_hello(data: bytes | bytearray) -> ClientHello | None:
    """The ClientHello at the start of ``data``, or None while it is incomplete. Raises NotTls or BadHello."""
    if not data:
        return None
    if data[0] != HANDSHAKE:
        if data[0] & 0x80:
            raise NotTls("an SSLv2-format hello, which no current TLS client sends")
        raise NotTls("not a TLS handshake")
    handshake = bytearray()
    at = count = 0
    while True:
        if count == MAX_RECORDS:
            raise BadHello(f"a ClientHello spread over more than {MAX_RECORDS} TLS records")
        count += 1
        if len(data) - at < 5:
            _check_bound(data)
            return None
        kind, major, length = data[at], data[at + 1], int.from_bytes(data[at + 3 : at + 5], "big")
        if kind != HANDSHAKE:
            raise BadHello(f"a TLS record of type {kind} before the ClientHello was complete")
        if major != 3:
            raise NotTls(f"TLS record version {major}.{data[at + 2]} is not TLS")
        if not 0 < length <= MAX_RECORD:
            raise BadHello(f"a TLS record of {length} bytes")
        if len(data) - at - 5 < length:
            _check_bound(data)
            return None
        handshake += data[at + 5 : at + 5 + length]
        at += 5 + length
        if handshake[0] != CLIENT_HELLO:
            raise BadHello(f"handshake message type {handshake[0]} where a ClientHello was expected")
        if len(handshake) >= 4:
            size = 4 + int.from_bytes(handshake[1:4], "big")
            if size > MAX_HELLO:
                raise BadHello(f"a ClientHello of {size} bytes (at most {MAX_HELLO} are read)")
            if len(handshake) >= size:
                if len(handshake) > size:
                    raise BadHello("more handshake data after the ClientHello in its records")
                return ClientHello(_server_name(bytes(handshake[4:size])), at)


def wanted(data: bytes | bytearray) -> int:
    """How many bytes ``data`` must reach before ``read_client_hello`` can get further: the end of the
    first incomplete record (only record headers are read). Lets a caller receiving a trickle parse once per
    record, not once per segment."""
    at = 0
    while len(data) - at >= 5:
        end = at + 5 + int.from_bytes(data[at + 3 : at + 5], "big")
        if end > len(data):
            return end
        at = end
    return at + 5


def _check_bound(data: bytes | bytearray) -> None:
    """An incomplete hello may not grow past the bound (many tiny records cost 5 bytes each)."""
    if len(data) > MAX_HELLO + 64:
        raise BadHello(f"no complete ClientHello in the first {MAX_HELLO} bytes")


def _server_name(body: bytes) -> str | None:
    hello = _Reader(body, "the ClientHello")
    hello.take(2 + 32)  # legacy_version, random
    if len(hello.vector(1).data) > 32:
        raise BadHello("a ClientHello session id longer than 32 bytes")
    suites = hello.vector(2).data
    if not suites or len(suites) % 2:
        raise BadHello("a ClientHello with a malformed cipher suite list")
    if not hello.vector(1).data:
        raise BadHello("a ClientHello without compression methods")
    if not hello.left():
        return None  # no extensions at all (allowed before TLS 1.3): no name
    extensions = hello.vector(2)
    if hello.left():
        raise BadHello("bytes after the ClientHello's extensions")
    seen: set[int] = set()
    name: str | None = None
    while extensions.left():
        kind = extensions.number(2)
        content = extensions.vector(2)
        if kind in seen:
            raise BadHello(f"TLS extension {kind} appears twice in the ClientHello")
        seen.add(kind)
        if kind == SERVER_NAME:
            name = _host_name(content)
    return name


def _host_name(extension: _Reader) -> str:
    names = extension.vector(2)
    if extension.left():
        raise BadHello("bytes after the server name list")
    found: str | None = None
    while names.left():
        kind = names.number(1)
        value = names.vector(2).data
        if kind != HOST_NAME:
            raise BadHello(f"server name of unknown type {kind}")
        if found is not None:
            raise BadHello("more than one TLS server name")
        if not value or not value.isascii() or any(b <= 0x20 or b == 0x7F for b in value):
            raise BadHello("a TLS server name that is not a printable ASCII host name")
        found = value.decode("ascii")
    if found is None:
        raise BadHello("an empty TLS server name list")
    return found
