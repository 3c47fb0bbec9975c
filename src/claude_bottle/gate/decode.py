"""Decoded views of a window of request bytes: what a receiving server would decode, for DLP to search too.

A ``View`` turns a window (a URL, a header block, a piece of a body with the tail before it) into the bytes a
server would see once it undoes an encoding, or None when the window holds nothing that encoding would change
(then there is nothing more to search). DLP (gate/dlp_scanner.py) searches the window as sent, then each view
that returns bytes. ``expansion`` bounds how many window bytes one decoded byte takes: the scanner's tail
grows by it, so a match split across chunks is seen whole in its decoded form too.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import unquote_to_bytes


@dataclass(frozen=True)
class View:
    """A decoding DLP also searches: ``decode(window)`` is the decoded window, or None when it has nothing to
    decode; one decoded byte comes from at most ``expansion`` window bytes."""

    name: str
    decode: Callable[[bytes], bytes | None]
    expansion: int


_ESCAPE = re.compile(rb"%[0-9A-Fa-f]{2}")


def percent_decoded(window: bytes) -> bytes | None:
    """The window with its ``%XX`` escapes decoded (as ``unquote_to_bytes``), or None without a real escape: a
    ``%`` not followed by two hex digits decodes to itself, and searching the same bytes twice finds nothing new."""
    if b"%" not in window or _ESCAPE.search(window) is None:
        return None
    return unquote_to_bytes(window)


PERCENT = View("percent-decoded", percent_decoded, 3)
# Every view DLP searches besides the bytes as sent.
VIEWS: tuple[View, ...] = (PERCENT,)
