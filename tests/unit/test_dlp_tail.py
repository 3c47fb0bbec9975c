"""The streaming scanner searches the bytes as sent with a short tail (``DlpMatcher.raw_tail``) and decodes a
view only while one of its markers may be in the window; here it is compared with the scanner it replaced,
which searched the whole window (``tail + chunk``) and each of its views with every piece: the same refusal,
naming the same rule, after the same bytes were passed on, for tokens at the edges of both tails and views
whose escapes straddle pieces."""

from __future__ import annotations

import base64
import random
import warnings
from collections.abc import Iterator

import pytest

from claude_bottle.gate.decode import VIEWS
from claude_bottle.gate.dlp import BUILTIN_NAMES, DlpMatcher, DlpPolicy, parse_dlp_rule, secret_needles
from claude_bottle.gate.dlp_reference import ReferenceMatcher
from claude_bottle.gate.dlp_rules import MARGIN
from tests.unit.test_dlp import HELD, HELD_FORMS, SAMPLES
from tests.unit.test_dlp_engines import (
    CONFIGURED_SAMPLES,
    FILLER,
    POLICIES,
    bodies,
    encoded,
    near_misses,
    outcome,
    scanned,
)

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    import sre_parse  # a marker's width

RNG = random.Random(20261126_2)


class WholeWindowScanner:
    """The scanner as it was: each piece searched with the whole tail before it, and every view the matcher
    names decoded from that whole window."""

    def __init__(self, matcher: DlpMatcher) -> None:
        self._matcher, self._held, self._offset = matcher, b"", 0

    def feed(self, chunk: bytes) -> bytes:
        if not chunk:
            return b""
        window = self._held + chunk
        self._scan(window, MARGIN if self._offset else 0, final=False)
        keep = min(len(window), self._matcher.tail)
        self._held, self._offset = window[len(window) - keep :], self._offset + len(window) - keep
        return window[: len(window) - keep]

    def finish(self) -> bytes:
        window, self._held = self._held, b""
        if window:
            self._scan(window, MARGIN if self._offset else 0, final=True)
        return window

    def _scan(self, window: bytes, start: int, final: bool) -> None:
        for view in self._matcher.search(window, "body", start, final):
            if (decoded := view.decode(window)) is not None:
                self._matcher.search(decoded, "body", start // view.expansion, final)


def whole_window_outcome(matcher: DlpMatcher, chunks: list[bytes]) -> tuple[bytes, str | None]:
    return scanned(WholeWindowScanner(matcher), chunks)


def matchers(name: str) -> list[DlpMatcher]:
    rules, needles = POLICIES[name].rules, secret_needles([HELD])
    found: list[DlpMatcher] = [ReferenceMatcher(rules, needles)]
    try:
        from claude_bottle.gate.dlp_hyperscan import HyperscanMatcher
    except ImportError:
        return found
    return [HyperscanMatcher(rules, needles), *found]


# The longest match of the built-in rules: a JWT with the longest header and payload its rule takes.
LONG_JWT = (b"eyJ" + base64.urlsafe_b64encode(RNG.randbytes(450))[:600] + b".eyJ"
            + base64.urlsafe_b64encode(RNG.randbytes(2250))[:3000] + b".sig")


def json_escaped(token: bytes, every: int) -> bytes:
    """``token`` with every ``every``-th byte written as a JSON ``\\u00XX`` escape."""
    return b"".join(b"\\u%04x" % byte if i % every == 0 else bytes([byte]) for i, byte in enumerate(token))


def tokens() -> list[bytes]:
    plain = [*SAMPLES.values(), *HELD_FORMS.values(), *CONFIGURED_SAMPLES, LONG_JWT]
    return [*plain, *(m for t in plain for m in near_misses(t)), *(e for t in plain for e in encoded(t)),
            json_escaped(LONG_JWT, 3), json_escaped(LONG_JWT, 997), LONG_JWT.replace(b"A", b"%41"), b""]


def filler(size: int) -> bytes:
    return (FILLER * (size // len(FILLER) + 1))[:size]


def edge_bodies(matcher: DlpMatcher, count: int) -> Iterator[list[bytes]]:
    """Bodies in pieces of one size with a token placed at an edge: where the raw tail's counted bytes begin
    (``raw_tail - MARGIN`` before a piece), where the raw tail begins, where the whole tail begins, across a
    piece's start, and ending at a piece's end; each one byte either side too."""
    pool = tokens()
    for _ in range(count):
        size = RNG.choice((1000, 4096, 16 * 1024))
        piece = RNG.randint(2, 3) * size
        token = RNG.choice(pool)
        edge = RNG.choice((matcher.raw_tail - MARGIN, matcher.raw_tail, matcher.tail, matcher.tail - MARGIN, 0))
        at = piece - edge + RNG.choice((-1, 0, 1))
        if RNG.random() < 0.3:
            at = piece - len(token) + RNG.choice((-1, 0, 1))  # the token ends at a piece's end
        elif RNG.random() < 0.3:
            at -= RNG.randint(0, len(token))  # the token straddles the edge
        at = max(0, at)
        body = filler(at) + token + filler(RNG.randint(0, 2 * size))
        if RNG.random() < 0.2:  # a second token, a view's marker, before the first
            body = filler(RNG.randint(0, at)) + RNG.choice((b"%41", b"\\u0041", b"\\/", b"%2541")) + body
        yield [body[i : i + size] for i in range(0, len(body), size)]


@pytest.mark.parametrize("name", POLICIES)
def test_tokens_at_every_tail_edge_are_judged_as_with_the_whole_window(name: str) -> None:
    for matcher in matchers(name):
        assert matcher.raw_tail < matcher.tail
        refused = 0
        for chunks in edge_bodies(matcher, 200):
            expected = whole_window_outcome(matcher, chunks)
            assert outcome(matcher, chunks) == expected, ([len(c) for c in chunks], type(matcher).__name__)
            refused += expected[1] is not None
        assert 40 < refused < 200, refused  # both ways are taken


@pytest.mark.parametrize("name", POLICIES)
def test_generated_bodies_are_judged_as_with_the_whole_window(name: str) -> None:
    for matcher in matchers(name):
        for chunks in bodies(400):
            padded = [filler(RNG.randint(0, 3 * matcher.raw_tail)) + chunks[0], *chunks[1:]]
            assert outcome(matcher, padded) == whole_window_outcome(matcher, padded), padded


def test_every_marker_is_shorter_than_a_margin() -> None:
    """A marker lies whole in the bytes searched with the piece holding its end (the raw tail is longer than
    a margin): that is how a view marked in an earlier piece is still tried while the marker is held."""
    for view in VIEWS:
        for marker in view.markers:
            assert sre_parse.parse(marker.decode("latin-1")).getwidth()[1] <= MARGIN, (view.name, marker)


# --- the margins, and a view marked only before the raw tail ------------------------------------------------------

# Rules whose match needs context at the raw tail's edges: the longest rule (so it sets the raw tail) with a
# look-ahead past its match, a look-behind as long as the margin, and one matching across JSON escapes that
# make no view by themselves (a newline): only a marker elsewhere in the window makes that view.
EDGE_RULES = DlpPolicy(extra=tuple(parse_dlp_rule(name, regex) for name, regex in [
    ("long-ahead", r"lng_[a-z]{4,4000}(?=[0-9]{4})"),
    ("behind", r"(?<![0-9]{16})nlb_[a-z]{8}"),
    ("lines", r"begin\n[a-z]{8}\n[0-9]{8}"),
]), disabled=frozenset(BUILTIN_NAMES))
LONG_AHEAD = b"lng_" + b"a" * 4000 + b"1234"


def edge_matchers() -> list[DlpMatcher]:
    rules, needles = EDGE_RULES.rules, secret_needles([HELD])
    found: list[DlpMatcher] = [ReferenceMatcher(rules, needles)]
    try:
        from claude_bottle.gate.dlp_hyperscan import HyperscanMatcher
    except ImportError:
        return found
    return [HyperscanMatcher(rules, needles), *found]


def placed(before: bytes, token: bytes, at: int, size: int) -> list[bytes]:
    """``token`` at body offset ``at`` (``before`` right in front of it, filler before that), in pieces of ``size``."""
    body = filler(at - len(before)) + before + token + filler(size)
    return [body[i : i + size] for i in range(0, len(body), size)]


def judged_alike(matcher: DlpMatcher, chunks: list[bytes]) -> bool:
    """Whether the scanner refuses ``chunks`` as the whole-window scanner does (asserted), and refuses them."""
    expected = whole_window_outcome(matcher, chunks)
    assert outcome(matcher, chunks) == expected, [len(c) for c in chunks]
    return expected[1] is not None


@pytest.mark.parametrize("size", [4096, 16 * 1024])
def test_a_look_ahead_past_the_raw_tail_is_seen(size: int) -> None:
    """The longest match, followed by what its look-ahead needs, ending within a margin of a piece's end:
    the piece it ends in cannot see the look-ahead hold, the next one sees it from the raw tail's margin on."""
    for matcher in edge_matchers():
        assert matcher.raw_tail == len(LONG_AHEAD) - 4 + 2 * MARGIN
        for piece in (2 * size, 3 * size):
            found = [judged_alike(matcher, placed(b"", LONG_AHEAD, piece - len(LONG_AHEAD) + 4 + end, size))
                     for end in range(-2 * MARGIN, 2 * MARGIN)]
            assert all(found), found


@pytest.mark.parametrize("size", [4096, 16 * 1024])
def test_a_look_behind_before_the_raw_tail_is_seen(size: int) -> None:
    """Digits that refute the look-behind, lying before the raw tail while the match begins in its margin."""
    for matcher in edge_matchers():
        for piece in (2 * size, 3 * size):
            for at in range(piece - matcher.raw_tail - 2, piece - matcher.raw_tail + MARGIN + 2):
                assert not judged_alike(matcher, placed(b"0123456789012345", b"nlb_abcdefgh", at, size)), at
                assert judged_alike(matcher, placed(b"x", b"nlb_abcdefgh", at, size)), at


@pytest.mark.parametrize("size", [4096, 16 * 1024])
def test_a_view_marked_before_the_raw_tail_is_still_decoded(size: int) -> None:
    """A JSON body's newlines (escapes that make no view) in a match that ends in the next piece, with the
    only escape that makes the view before the raw tail: the view of the whole window still finds it."""
    token = b"begin\\nabcdefgh\\n12345678"
    for matcher in edge_matchers():
        for piece in (2 * size, (matcher.tail // size + 2) * size):
            for marker_at in (piece - matcher.tail + 1, piece - matcher.raw_tail - 10, piece - 100):
                if marker_at < 0:
                    continue
                found = []
                for cut in range(1, len(token)):
                    body = plain(marker_at) + b"\\/" + plain(piece - cut - marker_at - 2) + token + plain(size)
                    found.append(judged_alike(matcher, [body[i : i + size] for i in range(0, len(body), size)]))
                assert all(found), (marker_at, found)


def plain(size: int) -> bytes:
    """Filler without a backslash (which would escape the marker after it)."""
    return (b"lorem ipsum dolor sit amet " * (size // 27 + 1))[:size]
