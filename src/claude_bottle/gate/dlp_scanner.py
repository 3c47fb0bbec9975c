"""The streaming scan of one request (``DlpScanner``) over the literals and rules a matcher prepared once per
gate (``DlpMatcher``): which engine finds the matches is the matcher's business, where a match may be and what
leaves before it is seen is the scanner's.

Streaming: ``feed`` keeps the last ``DlpMatcher.tail`` bytes seen (the longest match, as long as the most
expansive decoded view makes it, plus margins) for the next chunk: a body is never held whole. Those bytes
are also held back from the upstream until the next chunk (or ``finish``) shows they end no match, so no
prefix of a match leaves before the match is seen. Each chunk is searched as sent with only the last
``DlpMatcher.raw_tail`` of them before it (the longest match as sent, plus margins: a match that begins
earlier was seen whole with the chunk before), and each decoded view (gate/decode.py) that has something to
decode is made of the whole window, the tail and the chunk: a view is tried only while one of its markers
may be in that window, and it decides itself whether there is anything to decode.
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
        self.raw_tail = longest + 2 * MARGIN  # what the bytes as sent need: no encoded byte is longer there

    def scanner(self) -> DlpScanner:
        return DlpScanner(self)

    def clean(self, data: bytes) -> bool:
        """Whether ``data`` certainly holds nothing: ``search`` of any run of bytes within it would raise no
        match and name no view to decode. A cheap first look for data that is nearly always clean (a request
        head); False when unsure, as this engine-free default always is."""
        return False

    def clean_request(self, target: bytes, headers: Iterable[tuple[bytes, bytes]], body: bytes) -> bool:
        """A cheap first look at a small request read whole: True when its head (as ``DlpScanner.check_head``
        joins it) and its body together are ``clean``; then neither the head's check nor a scan of the body as
        sent can find anything (a match or a view in a part is one in the whole)."""
        return self.clean(b"\r\n".join([target, *map(b": ".join, headers), body]))

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
        # Per view of the matcher: where in the body the last window whose bytes as sent held a marker of it
        # ended; the view may have something to decode while that is past ``_offset``.
        self._marked = [0] * len(matcher.views)
        self._marked_until = 0  # the latest of them

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
        held = self._held
        self._scan_body(held, chunk, final=False)
        over = len(held) + len(chunk) - self.tail  # how many bytes may leave now
        if over <= 0:
            self._held = held + chunk
            return b""
        self._offset += over
        if over < len(held):
            self._held = held[over:] + chunk
            return held[:over]
        self._held = chunk[over - len(held) :]
        return held + chunk[: over - len(held)]

    def finish(self, last: bytes = b"") -> bytes:
        """The body's end, with its ``last`` bytes if they were not fed (a body read whole: its last piece is
        then scanned once, not fed and scanned again here). Returns what was held back, and ``last``."""
        held, self._held = self._held, b""
        if held or last:
            self._scan_body(held, last, final=True)
        return held + last

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

    def _scan_body(self, held: bytes, chunk: bytes, final: bool) -> None:
        """``_scan`` of the window ``held + chunk`` with the same outcome, for less: the bytes as sent are
        searched with only the last ``raw_tail`` held bytes before the chunk, and the window is made and
        decoded only for a view whose marker may be in it.

        Why the outcome is the same: a match as sent that begins before the raw tail's first ``MARGIN`` bytes
        ends at least a margin before the held bytes do (the raw tail is the longest match and two margins),
        so the window before saw it whole, with the context its look-arounds need, and refused the body
        then; the searched bytes begin past a margin, as ``_start`` says, since the bytes before them are
        cut. A marker (a few bytes) lies whole in the bytes as searched with the chunk holding its end, so a
        view marked in no window since the held bytes began has nothing to decode in this one."""
        matcher, start = self._matcher, self._start()
        cut = len(held) - matcher.raw_tail
        if cut > 0:
            views = matcher.search(held[cut:] + chunk, "body", MARGIN, final)
        else:
            views = matcher.search(held + chunk, "body", start, final)
        end = self._offset + len(held) + len(chunk)
        if not views and self._marked_until <= self._offset:
            return  # the common case: nothing to decode in the whole window
        window = held + chunk
        for index, view in enumerate(matcher.views):
            if view in views:
                self._marked[index] = end
            elif self._marked[index] <= self._offset:
                continue
            if (decoded := view.decode(window)) is not None:
                matcher.search(decoded, "body", start // view.expansion, final)
        self._marked_until = max(self._marked)
