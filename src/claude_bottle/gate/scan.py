"""Stop a response from carrying a credential the gate injects back to the client, in any form a server may
reflect it (gate/decode.py's ``reflected_forms``), even split across chunks.

``SecretForms`` is every form of every injected credential, prepared once per gate: one multi-pattern search
(Hyperscan when it can be imported, else the standard library) finds any of them in one pass, and the proper
prefixes of all of them say what to hold back at a chunk's end. A response is scanned by one ``SecretScanner``
whatever the number of forms: one window per chunk, one search.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Sequence
from typing import Any

_hyperscan: Any
try:
    import hyperscan as _hyperscan
except ImportError:  # the standard library's search: slower on large chunks, never weaker
    _hyperscan = None

# Up to this size a window is searched with one alternation of every form; above it, one ``bytes.find`` per
# form costs less (measured: an alternation ~1.4 us + ~5 ns a byte, six finds ~4 us + ~0.3 ns a byte).
_SMALL_WINDOW = 1024

# A suffix this long or longer that starts a form starts with one of the forms' first _KEY bytes: a suffix is
# looked up only where those are, so a long run of one byte costs one search, not a lookup per byte.
_KEY = 8


class SecretReflected(Exception):
    """The upstream sent a credential back; the response must not be delivered."""


class SecretForms:
    """The forms a response must never carry, each refused as the credential itself. ``found_in(data)``: one
    of them occurs in ``data`` (searched by Hyperscan where it can be imported, unless ``hyperscan`` is false,
    else by the standard library, with the same outcome); ``held(window)``: how many bytes at ``window``'s
    end are the start of one (the longest such suffix, shorter than the form), which must wait for the next
    chunk."""

    def __init__(self, forms: Sequence[bytes], hyperscan: bool = True) -> None:
        self.forms = tuple(dict.fromkeys(forms))
        if not self.forms or not all(self.forms):
            raise ValueError("every form must be a non-empty byte string, and there must be one")
        self.longest = max(map(len, self.forms))
        # Every byte of any form: a window ending in another byte ends in no form's start, so nothing is held
        # back (a response ending in a newline, as every SSE event does, costs no prefix check).
        self._alphabet = bytes(sorted(set(b"".join(self.forms))))
        self._keys = tuple(dict.fromkeys(form[:_KEY] for form in self.forms if len(form) > _KEY))
        self._prefixes = frozenset(form[:i] for form in self.forms for i in range(1, len(form)))
        self._newline_free = not any(b"\n" in form for form in self.forms)
        self._alternation = re.compile(b"|".join(map(re.escape, self.forms)))
        fast = _hyperscan_search(self.forms) if hyperscan else None
        self.found_in: Callable[[bytes], bool] = fast or self._standard_search
        self.engine = "Hyperscan" if fast else "the standard library"

    def scanner(self) -> SecretScanner:
        return SecretScanner(self)

    def in_headers(self, headers: Sequence[tuple[bytes, bytes]]) -> bool:
        """One of the forms occurs in a header's name or value. Names too: a name may hold any letter, digit
        and ``-``, so a server can send a form (hex, say) back as a header's name. One search over the names
        and values joined by a newline (which neither holds), or one per name and value for a form with a
        newline in it."""
        if self._newline_free:
            return self.found_in(b"\n".join(map(b"\n".join, headers)))
        return any(self.found_in(name) or self.found_in(value) for name, value in headers)

    def in_message(self, headers: Sequence[tuple[bytes, bytes]], body: bytes) -> bool:
        """One of the forms occurs in a header's name or value or in ``body``: ``in_headers`` and the body
        searched in one pass where no form has a newline (so none spans the newline that joins them)."""
        if self._newline_free:
            return self.found_in(b"\n".join([*map(b"\n".join, headers), body]))
        return self.in_headers(headers) or self.found_in(body)

    def held(self, window: bytes) -> int:
        if not window or window[-1] not in self._alphabet:
            return 0  # the common case: a response or an SSE event ends in a byte no form has
        tail = window[-(self.longest - 1) :]
        run = len(tail)
        held = next((size for size in range(min(run, _KEY - 1), 0, -1) if tail[-size:] in self._prefixes), 0)
        for key in self._keys:  # a longer one starts with a form's first _KEY bytes: only there is it looked up
            at = tail.find(key)
            while 0 <= at < run - held:
                if tail[at:] in self._prefixes:
                    held = run - at
                    break
                at = tail.find(key, at + 1)
        return held

    def _standard_search(self, data: bytes) -> bool:
        if len(data) <= _SMALL_WINDOW:
            return self._alternation.search(data) is not None
        return any(form in data for form in self.forms)


def _hyperscan_search(forms: Sequence[bytes]) -> Callable[[bytes], bool] | None:
    """One Hyperscan pass that says whether any form occurs, or None where the engine cannot run. The callback
    is a module function (the binding needs it alive for every scan); scratch space is per thread (a scan never
    awaits, so scans at the same time are in different threads)."""
    hyperscan = _hyperscan
    if hyperscan is None:
        return None
    database = hyperscan.Database(mode=hyperscan.HS_MODE_BLOCK)
    try:
        database.compile(expressions=[b"".join(b"\\x%02x" % byte for byte in form) for form in forms],
                         ids=list(range(len(forms))), elements=len(forms),
                         flags=[hyperscan.HS_FLAG_SINGLEMATCH] * len(forms))
    except hyperscan.error:
        return None
    local = threading.local()

    def search(data: bytes) -> bool:
        scratch = getattr(local, "scratch", None)
        if scratch is None:
            scratch = local.scratch = hyperscan.Scratch(database)
        found: list[int] = []
        database.scan(data, _found, 0, found, scratch)  # by position, as gate/dlp_hyperscan.py says why
        return bool(found)

    return search


def _found(id_: int, _from: int, _to: int, _flags: int, found: Any) -> None:
    """The match callback: notes the form (each reports once: ``HS_FLAG_SINGLEMATCH``)."""
    found.append(id_)


class SecretScanner:
    """Feed response bytes in order; get back the bytes that are safe to send now.

    Bytes that could be the start of a form are held back until the next chunk shows they are not, so no
    prefix of any form ever leaves early. Real traffic (SSE events end in a newline) holds back nothing.
    """

    def __init__(self, forms: SecretForms) -> None:
        self._forms = forms
        self._held = b""

    def feed(self, chunk: bytes) -> bytes:
        window = self._held + chunk if self._held else chunk
        if self._forms.found_in(window):
            raise SecretReflected("the response contains a credential the gate injects")
        keep = self._forms.held(window)
        self._held = window[len(window) - keep :] if keep else b""
        return window[: len(window) - keep] if keep else window

    def finish(self) -> bytes:
        held, self._held = self._held, b""
        return held
