"""What a receiving server decodes, decoded for DLP: the views of a scanned window, a request body's
``Content-Encoding``, and the forms in which a server may reflect a secret.

Views of a window (``View``, ``VIEWS``): a ``View`` turns a window (a URL, a header block, a piece of a body
with the tail before it) into the bytes a server would see once it undoes an encoding, or None when the
window holds nothing that encoding would change (then there is nothing more to search). DLP
(gate/dlp_scanner.py) searches the window as sent, then each view that returns bytes. ``expansion`` bounds
how many window bytes one decoded byte takes: the scanner's tail grows by it, so a match split across chunks
is seen whole in its decoded form too. The views (also in docs/inspection.md): percent-escapes decoded once;
decoded twice (``%2541`` is ``%41`` after one round, ``A`` after two: a server or framework that decodes
twice sees the value); JSON string escapes undone (``\\u0041``, ``\\/``: a JSON body's strings as its
parser reads them).

A request body's ``Content-Encoding`` (``BodyDecoder``): gzip, deflate and br are decompressed as the body
streams, under a bound on the decompressed size and on its ratio to the compressed size, so a bomb is
refused instead of being scanned forever. A body in an encoding the gate cannot undo (zstd, anything else)
is refused: its server would read what DLP could not.

What no decoding finds: encryption, an encoding the gate does not know (reversed, XORed, split across
requests, escapes of escapes beyond the views above), compression inside the payload itself (a zip or
tarball uploaded as such).
"""

from __future__ import annotations

import base64
import codecs
import re
import zlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from urllib.parse import quote_from_bytes, quote_plus

import brotli


@dataclass(frozen=True)
class View:
    """A decoding DLP also searches: ``decode(window)`` is the decoded window, or None when it has nothing to
    decode; one decoded byte comes from at most ``expansion`` window bytes. ``markers``: patterns (in the
    multi-pattern engine's syntax, plain enough for any) of which a window holds one wherever ``decode``
    returns bytes, so a matcher that finds them in its one pass skips the view elsewhere; none: always tried."""

    name: str
    decode: Callable[[bytes], bytes | None]
    expansion: int
    markers: tuple[bytes, ...] = ()


_ESCAPE = re.compile(rb"%[0-9A-Fa-f]{2}")
_ESCAPED_ESCAPE = re.compile(rb"%25[0-9A-Fa-f]{2}")
_LONE_PERCENT = re.compile(rb"%(?![0-9A-Fa-f]{2})")


def percent_decoded(window: bytes) -> bytes | None:
    """The window with its ``%XX`` escapes decoded (as ``unquote_to_bytes``), or None without a real escape: a
    ``%`` not followed by two hex digits decodes to itself, and searching the same bytes twice finds nothing new."""
    if b"%" not in window or _ESCAPE.search(window) is None:
        return None
    return unquoted(window)


def percent_decoded_twice(window: bytes) -> bytes | None:
    """The window percent-decoded twice, or None without an escaped escape (``%25`` and two hex digits)."""
    if b"%25" not in window or _ESCAPED_ESCAPE.search(window) is None:
        return None
    return unquoted(unquoted(window))


def unquoted(data: bytes) -> bytes:
    """``unquote_to_bytes(data)`` in C calls: each ``%XX`` spelled ``\\xXX`` (and each backslash doubled) is
    what ``codecs.escape_decode`` decodes, some 20 times faster than ``unquote_to_bytes``'s loop over escapes
    on a body made of them. A ``%`` without two hex digits after it (a window cut inside an escape, a stray
    ``%`` in bytes decoded once) is an invalid ``\\x`` escape there (ValueError): it decodes to itself, so it
    is spelled ``%25`` first."""
    escaped = data.replace(b"\\", b"\\\\") if b"\\" in data else data
    try:
        return codecs.escape_decode(escaped.replace(b"%", b"\\x"))[0]
    except ValueError:
        return codecs.escape_decode(_LONE_PERCENT.sub(b"%25", escaped).replace(b"%", b"\\x"))[0]


_JSON_ESCAPE = re.compile(rb'\\(?:u([dD][89abAB][0-9a-fA-F]{2})\\u([dD][c-fC-F][0-9a-fA-F]{2})'
                          rb'|u([0-9a-fA-F]{4})|(["\\/bfnrt]))')
_PRINTABLE_ESCAPE = re.compile(rb"\\u00(?:[2-6][0-9a-fA-F]|7[0-9a-eA-E])")
_SHORT_ESCAPES = {b'"': b'"', b"\\": b"\\", b"/": b"/", b"b": b"\b", b"f": b"\f", b"n": b"\n", b"r": b"\r",
                  b"t": b"\t"}


def json_unescaped(window: bytes) -> bytes | None:
    """The window with JSON string escapes undone, as a JSON parser reads them (an escaped backslash is not
    the start of an escape; a lone surrogate stays as it is), or None unless it holds an escape of a
    printable ASCII character (``\\u0041``, ``\\/``): what a token or a held secret is made of. Escapes of
    control and non-ASCII characters alone (``\\n``, ``\\u001b``, ``\\u2192``: JSON encoders write them all
    the time, Claude Code's bodies are full of them) make no view; they are undone when another escape
    makes one."""
    if b"\\/" not in window and (b"\\u" not in window or _PRINTABLE_ESCAPE.search(window) is None):
        return None
    return _JSON_ESCAPE.sub(_unescape, window)


def _unescape(match: re.Match[bytes]) -> bytes:
    high, low, single, short = match.groups()
    if short is not None:
        return _SHORT_ESCAPES[short]
    if single is not None:
        return chr(int(single, 16)).encode("utf-8", "surrogatepass")
    point = 0x10000 + ((int(high, 16) - 0xD800) << 10) + (int(low, 16) - 0xDC00)
    return chr(point).encode("utf-8")


# Markers: each view's own test of whether it has something to decode (``_ESCAPE``, ``_ESCAPED_ESCAPE``, ``\/``
# and ``_PRINTABLE_ESCAPE``), spelled for the engine.
PERCENT = View("percent-decoded", percent_decoded, 3, (rb"%[0-9A-Fa-f]{2}",))
PERCENT_TWICE = View("percent-decoded twice", percent_decoded_twice, 5, (rb"%25[0-9A-Fa-f]{2}",))  # %2541
JSON_STRING = View("JSON-unescaped", json_unescaped, 6,  # \u0041
                   (rb"\\/", rb"\\u00(?:[2-6][0-9a-fA-F]|7[0-9a-eA-E])"))
# Every view DLP searches besides the bytes as sent.
VIEWS: tuple[View, ...] = (PERCENT, PERCENT_TWICE, JSON_STRING)

# Body decoding bounds: the ratio applies beyond the first MiB (small bodies of one repeated byte are fine).
MAX_DECODED_BODY = 64 * 1024 * 1024
MAX_RATIO = 100
_RATIO_FREE = 1024 * 1024
_DECODABLE = ("gzip", "x-gzip", "deflate", "br")


_B64URL = bytes.maketrans(b"+/", b"-_")
_LOWER_ESCAPES = re.compile(rb"%[0-9A-F]{2}")


def reflected_forms(secret: bytes) -> tuple[bytes, ...]:
    """The forms in which a server may send ``secret`` back, each to be refused as the value itself: as is;
    percent-encoded (every byte outside the unreserved set escaped, ``/`` kept or not, hex in either case,
    ``+`` for a space); with JSON's ``\\/`` for ``/``; in base64 and base64url at each of the three
    alignments, padded or not, and in hex (the needles DLP searches requests for). A server escaping only some
    of the bytes it could is not covered."""
    forms = dict.fromkeys([secret, secret.replace(b"/", b"\\/")])
    for safe in ("", "/"):
        escaped = quote_from_bytes(secret, safe=safe).encode()
        forms.update(dict.fromkeys([escaped, _LOWER_ESCAPES.sub(lambda m: m.group(0).lower(), escaped),
                                    quote_plus(secret, safe=safe).encode()]))
    for alignment in range(3):  # the characters that depend on the secret alone, whatever is around it
        encoded = base64.b64encode(bytes(alignment) + secret)
        core = encoded[(alignment * 8 + 5) // 6 : (alignment + len(secret)) * 8 // 6]
        forms.update(dict.fromkeys([core, core.translate(_B64URL)]))
    forms.update(dict.fromkeys([secret.hex().encode(), secret.hex().upper().encode()]))
    return tuple(forms)


class UndecodableBody(ValueError):
    """A request body the gate cannot decode to scan; ``status`` is the refusal's (413 for a bomb)."""

    def __init__(self, reason: str, status: int = 415) -> None:
        super().__init__(reason)
        self.status = status


def content_codings(values: Sequence[bytes]) -> tuple[str, ...]:
    """The codings of ``Content-Encoding`` header values, in the order they were applied (``identity`` left
    out). Raises UndecodableBody for one the gate cannot undo."""
    if not values:  # nearly every request: no Content-Encoding
        return ()
    codings = tuple(token.strip().decode("latin-1").lower() for value in values for token in value.split(b","))
    codings = tuple(c for c in codings if c not in ("", "identity"))
    for coding in codings:
        if coding not in _DECODABLE:
            raise UndecodableBody(f"request body in Content-Encoding {coding!r}, which the gate cannot decode to "
                                  "scan it (it decodes gzip, deflate and br); send it unencoded")
    return codings


class BodyDecoder:
    """Undo ``codings`` (as ``content_codings`` returns them) on a body fed in order: ``feed`` returns the
    decoded bytes of each piece, ``finish`` the last ones once the body ended whole. Raises UndecodableBody
    for a corrupt or cut body, or one whose decoding (any layer of it) grows past ``MAX_DECODED_BODY`` or
    ``MAX_RATIO`` times the body's size as sent."""

    def __init__(self, codings: Sequence[str]) -> None:
        # The last applied is undone first.
        self._layers = [_BrotliLayer() if coding == "br" else _ZlibLayer(coding) for coding in reversed(codings)]
        self._read = 0

    def feed(self, chunk: bytes) -> bytes:
        self._read += len(chunk)
        for layer in self._layers:
            chunk = self._checked(layer, layer.feed(chunk, self._room(layer)))
        return chunk

    def finish(self) -> bytes:
        chunk = b""
        for layer in self._layers:
            chunk = self._checked(layer, layer.feed(chunk, self._room(layer)))
            layer.finish()
        return chunk

    def _limit(self) -> int:
        return min(MAX_DECODED_BODY, max(_RATIO_FREE, MAX_RATIO * self._read))

    def _room(self, layer: _Layer) -> int:
        """The most bytes ``layer`` may produce in one step: one past the bound, to see it crossed."""
        return max(1, self._limit() - layer.produced + 1)

    def _checked(self, layer: _Layer, decoded: bytes) -> bytes:
        layer.produced += len(decoded)
        if layer.produced > self._limit():
            raise UndecodableBody(f"compressed request body expands past what the gate scans (at most "
                                  f"{MAX_DECODED_BODY // 2**20} MiB, {MAX_RATIO} times its size): refused as "
                                  "a decompression bomb", 413)
        return decoded


class _Layer(ABC):
    """One coding undone: ``feed`` returns the decoded bytes of ``data``, at most about ``room`` of them (it
    may stop once past ``room``, with the body refused); ``finish`` raises UndecodableBody unless the coded
    data ended whole. ``produced`` counts the decoded bytes, kept by the BodyDecoder."""

    produced = 0

    @abstractmethod
    def feed(self, data: bytes, room: int) -> bytes: ...

    @abstractmethod
    def finish(self) -> None: ...


class _BrotliLayer(_Layer):
    """br: one Brotli stream (RFC 7932), decoded by Google's library. Its output bound (``room``) holds a bomb
    to about ``room`` bytes (it grows its buffer in steps of some 32 KiB); bytes after the stream's end are
    invalid data to it."""

    def __init__(self) -> None:
        self._decompressor = brotli.Decompressor()

    def feed(self, data: bytes, room: int) -> bytes:
        out: list[bytes] = []
        try:
            for _ in range(1024):  # output stopped by ``room`` is resumed with no input; bounded
                piece: bytes = self._decompressor.process(data, output_buffer_limit=room)
                out.append(piece)
                room, data = room - len(piece), b""
                if room <= 0 or self._decompressor.can_accept_more_data():
                    break
        except brotli.error:
            raise UndecodableBody("request body is not valid br data", 400) from None
        return b"".join(out)

    def finish(self) -> None:
        if not self._decompressor.is_finished():
            raise UndecodableBody("request body ends inside its br data", 400)


class _ZlibLayer(_Layer):
    """gzip (members one after another, as gzip itself writes them) or deflate (zlib as the standard says, raw
    deflate as some clients send)."""

    def __init__(self, coding: str) -> None:
        self._coding = coding
        self._inflater: zlib._Decompress | None = None
        self._pending = b""  # deflate's first byte, until the second shows whether a zlib header starts it

    def feed(self, data: bytes, room: int) -> bytes:
        data, self._pending = self._pending + data, b""
        out = []
        for _ in range(1024):  # gzip members in one piece; bounded
            if not data:
                break
            if self._inflater is None:
                if self._coding == "deflate" and len(data) < 2:
                    self._pending = data
                    break
                self._inflater = zlib.decompressobj(self._wbits(data))
            try:
                piece = self._inflater.decompress(data, room)
            except zlib.error:
                raise UndecodableBody(f"request body is not valid {self._coding} data", 400) from None
            out.append(piece)
            room -= len(piece)
            if room <= 0:
                break  # past the bound: the caller refuses the body
            if self._inflater.unconsumed_tail:
                data = self._inflater.unconsumed_tail
                continue
            if not self._inflater.eof:
                break
            data = self._inflater.unused_data
            if self._coding == "deflate":
                if data.strip(b"\0"):
                    raise UndecodableBody("request body has bytes after its deflate stream", 400)
                break
            self._inflater = None  # another gzip member follows, or nothing
        else:
            raise UndecodableBody(f"request body has more {self._coding} members in one piece than the gate "
                                  "decodes", 413)
        return b"".join(out)

    def finish(self) -> None:
        if self._pending or (self._inflater is not None and not self._inflater.eof):
            raise UndecodableBody(f"request body ends inside its {self._coding} data", 400)

    def _wbits(self, head: bytes) -> int:
        if self._coding != "deflate":
            return 16 + zlib.MAX_WBITS
        zlib_header = head[0] & 0x0F == 8 and (head[0] << 8 | head[1]) % 31 == 0
        return zlib.MAX_WBITS if zlib_header else -zlib.MAX_WBITS
