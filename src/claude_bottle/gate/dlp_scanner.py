"""The streaming scan of one request (``DlpScanner``) over the literals and rules a matcher prepared once per
gate (``DlpMatcher``): which engine finds the matches is the matcher's business, where a match may be and what
leaves before it is seen is the scanner's.

Streaming: ``feed`` scans ``tail + chunk`` and keeps only the last ``DlpMatcher.tail`` bytes (the longest
match, as long as the most expansive decoded view makes it, plus margins) for the next window: a body is
never held whole. Those bytes are also held back from the upstream until the next chunk (or ``finish``)
shows they end no match, so no prefix of a match leaves before the match is seen. Each window is searched as
sent, then in each decoded view (gate/decode.py) that has something to decode.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence

from claude_bottle.gate.decode import VIEWS, View
from claude_bottle.gate.dlp_rules import MARGIN, DlpRule


class DlpMatcher(ABC):
    """Rules and needles (a held secret's encodings, with the encoding's name), prepared once: what every
    scanner of a gate searches for. ``search`` is the engine; ``engine`` names it for the gate's start line."""

    engine: str

    def __init__(self, rules: Sequence[DlpRule], needles: Sequence[tuple[bytes, str]],
                 views: Sequence[View] = VIEWS) -> None:
        self.rules = tuple(rules)
        self.needles = tuple(needles)
        self.views = tuple(views)
        longest = max([len(n) for n, _ in needles] + [rule.width for rule in rules] + [1])
        # An encoded byte takes up to ``expansion`` bytes; the margins keep look-behind and look-ahead context.
        self.tail = max([1] + [view.expansion for view in views]) * longest + 2 * MARGIN

    def scanner(self) -> DlpScanner:
        return DlpScanner(self)

    def clean(self, data: bytes) -> bool:
        """Whether ``data`` certainly holds nothing: ``search`` of any run of bytes within it would raise no
        match and name no view to decode. A cheap first look for data that is nearly always clean (a request
        head); False when unsure, as this engine-free default always is."""
        return False

    @abstractmethod
    def search(self, view: bytes, where: str, start: int, final: bool) -> Sequence[View]:
        """Raise DlpMatch for the first needle (in ``needles`` order) found anywhere in ``view``, else the first
        rule (in ``rules`` order) whose ``DlpRule.search(view, start, final)`` is true. Every engine names the
        same needle or rule for the same view: the reference (gate/dlp_reference.py) defines the outcome.
        Returns the views worth decoding ``view`` into: at least every one whose ``markers`` it holds."""


class DlpScanner:
    """Scans one request: ``check_head`` once, then ``feed`` each body chunk in order and ``finish`` at the
    end of the body (with the last piece of a body read whole: ``finish(last)``). Each raises DlpMatch on a
    match; after that the request must be refused, or if body bytes already went upstream, that connection
    reset so the request never completes.

    ``feed`` returns the bytes that may be forwarded now; the last ``tail`` bytes seen are held back until
    the next chunk or ``finish`` (which returns them). A body of any size costs ``tail`` bytes of memory.
    """

    def __init__(self, matcher: DlpMatcher) -> None:
        self._matcher = matcher
        self.tail = matcher.tail
        self._held = b""
        self._offset = 0  # where in the body the held bytes begin

    def check_head(self, target: bytes, headers: Iterable[tuple[bytes, bytes]]) -> None:
        """The request target (origin or absolute form, with its query) and every header, names included:
        the target searched as the view "URL", the headers as one view "headers" of ``name: value\r\n`` lines.

        Both are first looked at together, in one block joined by C-level calls (no Python loop per header),
        by the matcher's ``clean``: a real head nearly always is, and then neither view can hold a match.
        Otherwise each is searched apart as above, so the outcome (what matches, and where) never depends on
        that first look."""
        block = b"\r\n".join([target, *map(b": ".join, headers), b""])
        if not self._matcher.clean(block):
            self.scan_view(target, "URL")
            self.scan_view(block[len(target) + 2 :], "headers")

    def feed(self, chunk: bytes) -> bytes:
        if not chunk:
            return b""
        window = self._held + chunk
        self._scan(window, "body", self._start(), final=False)
        keep = min(len(window), self.tail)
        self._held, self._offset = window[len(window) - keep :], self._offset + len(window) - keep
        return window[: len(window) - keep]

    def finish(self, last: bytes = b"") -> bytes:
        """The body's end, with its ``last`` bytes if they were not fed (a body read whole: its last piece is
        then scanned once, not fed and scanned again here). Returns what was held back, and ``last``."""
        window, self._held = self._held + last, b""
        if window:
            self._scan(window, "body", self._start(), final=True)
        return window

    def scan_view(self, data: bytes, where: str) -> None:
        """Scan ``data`` whole (and its decoded views), as a part of the request named ``where`` ("URL",
        "headers", "body"): for bytes seen at once, not streamed, such as a body decoded apart."""
        if data:
            self._scan(data, where, start=0, final=True)

    def _start(self) -> int:
        """Where matches may begin in a window: after the margin once the body's first bytes were passed on.
        A match that begins earlier was seen whole in the window before (the tail is long enough), and the
        bytes before it, which would have refuted a look-behind, are gone now."""
        return MARGIN if self._offset else 0

    def _scan(self, window: bytes, where: str, start: int, final: bool) -> None:
        search = self._matcher.search
        for view in search(window, where, start, final):
            decoded = view.decode(window)
            if decoded is not None:
                # Encoded bytes take up to ``expansion`` bytes each: in the decoded view the margin shrinks so.
                search(decoded, where, start // view.expansion, final)
