"""Differential tests of DLP matching: generated bodies scanned end to end (chunk by chunk, as the gate streams
them) by a matcher under test and by the reference (gate/dlp_reference.py) must give the same outcome: the same
refusal, naming the same rule, after the same bytes were passed on."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Iterator
from typing import Protocol
from urllib.parse import quote_from_bytes, unquote_to_bytes

import pytest

from claude_bottle.gate import dlp
from claude_bottle.gate.decode import PERCENT, View, percent_decoded
from claude_bottle.gate.dlp import BUILTIN_NAMES, DlpMatch, DlpMatcher, DlpPolicy, parse_dlp_rule, secret_needles
from claude_bottle.gate.dlp_reference import ReferenceMatcher
from claude_bottle.gate.failures import Refused
from claude_bottle.gate.forward import Outbound
from claude_bottle.gate.inspection import data_loss
from tests.unit.test_dlp import HELD, HELD_FORMS, SAMPLES

RNG = random.Random(20261126)
# Configured rules of every shape: anchored by a literal or not, case-blind, look-around, alternation, classes.
CONFIGURED = DlpPolicy(extra=tuple(parse_dlp_rule(name, regex) for name, regex in [
    ("internal-token", r"itk_[a-z0-9]{32}"),
    ("case-blind", r"(?i)corp-secret-[0-9a-f]{12}"),
    ("bounded", r"(?<![A-Za-z0-9])[A-Z]{4}[0-9]{8}(?![A-Za-z0-9])"),
    ("either", r"(?:alpha|beta)-key:[A-Za-z0-9+/]{16,40}"),
    ("digits-only", r"\b\d{16}\b"),
    ("dotted", r"tok\.[^\s.]{10}\.[a-z]{3,9}"),
    ("verbose", r"(?x) key = [0-9]{8} (?# eight digits )"),
    ("repeated", r"(q)\1{7}[0-9]{4}"),  # a back-reference: no prefilter, the reference searches it
    ("not-digits", r"zz[\D]{8}!"),  # a negated category in a class: likewise
]), disabled=frozenset({"jwt"}))
POLICIES = {"default": DlpPolicy(), "configured": CONFIGURED,
            "held only": DlpPolicy(disabled=frozenset(BUILTIN_NAMES))}
CONFIGURED_SAMPLES = [b"itk_" + bytes(RNG.choices(b"abcdefghijklmnopqrstuvwxyz0123456789", k=32)),
                      b"CORP-Secret-0123456789ab", b"ABCD12345678", b"beta-key:" + b"Zm9vYmFy" * 3,
                      b"1234567812345678", b"tok.abcdefghij.abc", b"key=12345678", b"qqqqqqqq1234",
                      b"zzabcdefgh!"]
FILLER = (b'{"role":"user","content":[{"type":"text","text":"def main():\\n    return 42 % 7\\n"}]}, '
          b"lorem ipsum 100% sure, secret: none; AKIA is a prefix; eyJ alone; ghp_ short; npm_x ")


class Scanner(Protocol):
    def feed(self, chunk: bytes) -> bytes: ...
    def finish(self) -> bytes: ...


def outcome(matcher: DlpMatcher, chunks: list[bytes]) -> tuple[bytes, str | None]:
    """The bytes passed on before a refusal, and the refusing rule (None: all passed on)."""
    return scanned(matcher.scanner(), chunks)


def scanned(scanner: Scanner, chunks: list[bytes]) -> tuple[bytes, str | None]:
    """``outcome`` for a scanner made by the caller."""
    out = b""
    try:
        for chunk in chunks:
            out += scanner.feed(chunk)
        out += scanner.finish()
    except DlpMatch as match:
        return out, match.rule + ":" + match.reason
    return out, None


def near_misses(token: bytes) -> list[bytes]:
    """A token cut short, with a byte changed, run into a longer word, and case-flipped."""
    return [token[:-1], token[:len(token) // 2], token[:-2] + b"!" + token[-1:], b"x" + token, token + b"x",
            token.swapcase()]


def encoded(token: bytes) -> list[bytes]:
    escaped = quote_from_bytes(token, safe=b"").encode()
    return [escaped, token.replace(b"_", b"%5F"), token.hex().encode(), escaped.replace(b"%", b"%25"),
            b"".join(b"\\u%04x" % byte if i % 3 == 0 else bytes([byte]) for i, byte in enumerate(token)),
            token.replace(b"/", b"\\/")]


def bodies(count: int) -> Iterator[list[bytes]]:
    """``count`` bodies, each cut into chunks: filler around tokens (every rule, every held-secret encoding,
    near misses, configured rules' samples, encoded forms), some cut at a token's edge and one byte either side."""
    kinds = [list(SAMPLES.values()), list(HELD_FORMS.values()), CONFIGURED_SAMPLES]
    for _ in range(count):
        parts: list[bytes] = []
        for _ in range(RNG.randint(1, 4)):
            token = RNG.choice(RNG.choice(kinds))
            kind = RNG.random()
            if kind < 0.3:
                token = RNG.choice(near_misses(token))
            elif kind < 0.45:
                token = RNG.choice(encoded(token))
            elif kind < 0.5:
                token = b""
            parts += [FILLER[: RNG.randint(0, len(FILLER))] * RNG.randint(1, 3), token]
        body = b"".join(parts) + FILLER[: RNG.randint(0, 40)]
        yield cut(body, parts)


def cut(body: bytes, parts: list[bytes]) -> list[bytes]:
    """The body in chunks: random sizes, or cut at a token's start or end and one byte either side."""
    edges = [i for i in range(1, len(parts)) if parts[i]]
    if edges and RNG.random() < 0.5:
        i = RNG.choice(edges)
        at = len(b"".join(parts[:i])) + (len(parts[i]) if RNG.random() < 0.5 else 0) + RNG.choice((-1, 0, 1))
        at = min(max(at, 1), len(body))
        return [body[:at], body[at:]]
    chunks, at = [], 0
    while at < len(body):
        size = RNG.choice((1, 7, 64, 500, 4096, 70000))
        chunks.append(body[at : at + size])
        at += size
    return chunks


# --- the percent-decoded view only where a real escape is ------------------------------------------------------


def any_percent(window: bytes) -> bytes | None:
    """The percent view as it was: decoded wherever the window has a ``%``."""
    return unquote_to_bytes(window) if b"%" in window else None


EVERY_PERCENT = View("percent-decoded (any %)", any_percent, 3)


@pytest.mark.parametrize("window", [b"", b"%", b"100%", b"%zz", b"%4", b"a%4g%", b"%%41", b"%41", b"x%2fy", b"%E9"])
def test_the_percent_view_exists_exactly_where_decoding_changes_the_window(window: bytes) -> None:
    decoded = percent_decoded(window)
    assert (decoded is not None) == (unquote_to_bytes(window) != window)
    assert decoded is None or decoded == unquote_to_bytes(window)


@pytest.mark.parametrize("name", POLICIES)
def test_the_percent_view_only_with_an_escape_finds_what_it_found_for_any_percent(name: str) -> None:
    needles = secret_needles([HELD])
    rules = POLICIES[name].rules
    new, old = ReferenceMatcher(rules, needles, (PERCENT,)), ReferenceMatcher(rules, needles, (EVERY_PERCENT,))
    for chunks in bodies(1500):
        stray = [chunk.replace(b"_", b"%_") for chunk in chunks]  # a stray % before a token's '_'
        assert outcome(new, chunks) == outcome(old, chunks), chunks
        assert outcome(new, stray) == outcome(old, stray), stray


# --- the multi-pattern engine against the reference -----------------------------------------------------------


def engines(name: str) -> tuple[DlpMatcher, DlpMatcher]:
    from claude_bottle.gate.dlp_hyperscan import HyperscanMatcher

    rules, needles = POLICIES[name].rules, secret_needles([HELD])
    return HyperscanMatcher(rules, needles), ReferenceMatcher(rules, needles)


@pytest.mark.parametrize("name", POLICIES)
def test_the_multi_pattern_matcher_refuses_exactly_what_the_reference_refuses(name: str) -> None:
    pytest.importorskip("hyperscan")
    fast, reference = engines(name)
    for chunks in bodies(2500):
        assert outcome(fast, chunks) == outcome(reference, chunks), chunks


@pytest.mark.parametrize("name", POLICIES)
def test_the_multi_pattern_matcher_judges_heads_as_the_reference(name: str) -> None:
    pytest.importorskip("hyperscan")
    fast, reference = engines(name)
    for chunks in bodies(600):
        body = b"".join(chunks)[:700]
        for target, headers in [(b"/v1/x?q=" + body, []), (b"/", [(b"x-data", body)]), (body, [(body, b"1")])]:
            results = []
            for matcher in (fast, reference):
                try:
                    matcher.scanner().check_head(target, headers)
                    results.append(None)
                except DlpMatch as match:
                    results.append(match.reason)
            assert results[0] == results[1], (target, headers)


@pytest.mark.parametrize("name", POLICIES)
def test_a_small_request_found_clean_whole_holds_nothing_in_its_head_or_body(name: str) -> None:
    """``clean_request`` (the first look at a small request read whole, gate/inspection.py) says clean only
    where ``check_head`` and the body's own scan find nothing; and it does say so for most clean requests."""
    pytest.importorskip("hyperscan")
    fast, reference = engines(name)
    looked = clean = 0
    for chunks in bodies(600):
        body = b"".join(chunks)[:2000]
        for target, headers in [(b"/v1/messages", [(b"content-type", b"application/json")]),
                                (b"/v1/x?q=" + body[:80], [(b"x-data", body[80:160])])]:
            found = []
            for matcher in (fast, reference):
                scanner = matcher.scanner()
                try:
                    scanner.check_head(target, headers)
                    scanner.finish(body)
                    found.append(False)
                except DlpMatch:
                    found.append(True)
            assert found[0] == found[1]
            for matcher in (fast, reference):
                if matcher.clean_request(target, headers, body):
                    looked += matcher is fast
                    assert not found[0], (target, headers, body)
            clean += not found[0]
    assert looked > clean // 4 if not fast.uncompiled else looked == 0, (looked, clean)


def test_rules_the_engine_cannot_compile_are_named_and_searched_apart() -> None:
    pytest.importorskip("hyperscan")
    fast, _ = engines("configured")
    assert fast.uncompiled == ("repeated", "not-digits")  # type: ignore[attr-defined]
    note = dlp.engine_note(fast)
    assert "Hyperscan" in note and "repeated, not-digits" in note


def test_without_the_engine_the_gate_uses_the_reference_and_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dlp, "hyperscan_matcher", None)
    matcher = DlpPolicy().matcher([HELD])
    assert isinstance(matcher, ReferenceMatcher)
    assert "standard library" in dlp.engine_note(matcher) and "never weaker" in dlp.engine_note(matcher)


@pytest.mark.parametrize("window", [b"plain", b"100%", b"%41", b"%2541", b"a\\/b", b"\\u0041", b"\\u00e9\\n",
                                    b"\\u2192", b"\\\\u0041", b"%25%41\\u007e"])
def test_the_engine_tries_every_view_that_has_something_to_decode(window: bytes) -> None:
    pytest.importorskip("hyperscan")
    fast, _ = engines("held only")
    tried = fast.search(window, "body", 0, True)
    assert {view.name for view in tried} == {view.name for view in fast.views if view.decode(window) is not None}


# --- a body streamed in the pieces it arrives in against the same body read whole -----------------------------


def refusal(matcher: DlpMatcher, body: bytes | list[bytes]) -> str | None:
    """The refusing rule of the request filter ``data_loss`` for a JSON body read whole
    (``bytes``) or streamed in pieces (a list), as the API route meets a Messages body; None: it passed."""

    async def pieces(chunks: list[bytes]) -> AsyncIterator[bytes]:
        for chunk in chunks:
            yield chunk

    async def run() -> str | None:
        streamed = isinstance(body, list)
        request = Outbound(b"POST", b"/v1/messages", [(b"content-type", b"application/json")],
                           pieces(body) if isinstance(body, list) else body, None, streamed)
        try:
            await data_loss(matcher)(request)
            if not isinstance(request.body, bytes):
                async for _ in request.body:
                    pass
        except Refused as refused:
            return refused.rule
        return None

    return asyncio.run(run())


def one_token_bodies(count: int) -> Iterator[list[bytes]]:
    """Bodies as ``bodies`` makes them with one token each (which rule names a body with several depends on
    which the scan meets first, in any reading)."""
    kinds = [list(SAMPLES.values()), list(HELD_FORMS.values()), CONFIGURED_SAMPLES]
    for _ in range(count):
        token = RNG.choice(RNG.choice(kinds))
        token = RNG.choice([token, *near_misses(token), *encoded(token)])
        parts = [FILLER * RNG.randint(0, 3), token, FILLER[: RNG.randint(0, len(FILLER))]]
        yield cut(b"".join(parts), parts)


@pytest.mark.parametrize("engine", ["reference", "multi-pattern"])
@pytest.mark.parametrize("name", POLICIES)
def test_a_body_streamed_in_pieces_is_refused_as_the_same_body_read_whole(name: str, engine: str) -> None:
    """The same refusal, by the same rule for a body with one token. (Its reason may name another of the
    encodings it found: where one string is two forms of a held secret, the first found in a window is named.)"""
    if engine == "multi-pattern":
        pytest.importorskip("hyperscan")
    matcher = engines(name)[0 if engine == "multi-pattern" else 1]
    for chunks in bodies(300):
        assert (refusal(matcher, chunks) is None) == (refusal(matcher, b"".join(chunks)) is None), chunks
    for chunks in one_token_bodies(300):
        assert refusal(matcher, chunks) == refusal(matcher, b"".join(chunks)), chunks


# --- a request head: one first look at the whole head, the outcome of the target and headers searched apart ---

# Rules that tell a head looked at whole from its views searched apart: one anchored at the view's start, one
# that spans a line break (only the whole head has one between the target and the first header).
HEAD_SHAPED = DlpPolicy(extra=tuple(parse_dlp_rule(name, regex) for name, regex in [
    ("view-start", r"^x-secret: [0-9]{6}"),
    ("across-lines", r"end\r\nx-[a-z]{4}"),
    ("header-line", r"(?m)^x-key: [a-z]{8}\r?$"),
]))
HEAD_POLICIES = {**POLICIES, "head-shaped": HEAD_SHAPED}
HEAD_SAMPLES = [b"x-secret: 123456", b"end\r\nx-abcd", b"x-key: abcdefgh", b"%41", b"%2541", b"\\u0041", b"\\/"]
# Claude Code's headers as the API route's DLP filter sees them (benchkit/claude_code_head.http, abridged).
CLAUDE_HEADERS = [(b"accept", b"application/json"), (b"content-type", b"application/json"),
                  (b"user-agent", b"claude-cli/2.1.190 (external, sdk-cli)"),
                  (b"x-claude-code-session-id", b"68b7ee0c-0a90-4933-8381-ccac57e770fb"),
                  (b"x-stainless-retry-count", b"0"), (b"x-stainless-runtime-version", b"v24.3.0"),
                  (b"anthropic-beta", b"claude-code-20250219,oauth-2025-04-20,interleaved-thinking-2025-05-14"),
                  (b"anthropic-version", b"2023-06-01"), (b"x-app", b"cli")]


def head_token() -> bytes:
    token = RNG.choice(RNG.choice([list(SAMPLES.values()), list(HELD_FORMS.values()), CONFIGURED_SAMPLES,
                                   HEAD_SAMPLES]))
    kind = RNG.random()
    if kind < 0.3:
        return RNG.choice(near_misses(token))
    if kind < 0.45:
        return RNG.choice(encoded(token))
    return b"" if kind < 0.6 else token


def heads(count: int) -> Iterator[tuple[bytes, list[tuple[bytes, bytes]]]]:
    """``count`` heads: Claude Code's headers, some left out, with tokens (as in ``bodies``) in the target's
    query, in header names and values, and cut across the target and the first header or a name and its value."""
    for _ in range(count):
        headers = [h for h in CLAUDE_HEADERS if RNG.random() < 0.8]
        for _ in range(RNG.randint(0, 3)):
            filler = FILLER[: RNG.randint(0, 40)]
            at = RNG.randint(0, len(headers))
            if RNG.random() < 0.2:
                headers.insert(at, (b"x-" + head_token(), filler))
            else:
                headers.insert(at, (RNG.choice((b"x-data", b"x-secret", b"x-key", b"cookie2")), filler + head_token()))
        target = b"/v1/messages?beta=true" + (b"&q=" + head_token() if RNG.random() < 0.4 else b"")
        shape = RNG.random()
        if shape < 0.05:  # what the head-shaped rules match only at a view's start or a line's
            headers.insert(0, RNG.choice(((b"x-secret", b"123456"), (b"x-key", b"abcdefgh"))))
        elif shape < 0.1:  # a line break the whole head has and neither view does
            target, headers = target + b"end", [(b"x-abcd", b"1"), *headers]
        if headers and RNG.random() < 0.2:  # a token cut between two parts of the head
            token = head_token()
            cut_at = RNG.randint(0, len(token))
            if RNG.random() < 0.5:
                target += token[:cut_at]
                headers[0] = (token[cut_at:] + headers[0][0], headers[0][1])
            else:
                i = RNG.randrange(len(headers))
                headers[i] = (headers[i][0] + token[:cut_at], token[cut_at:] + headers[i][1])
        yield target, headers


def head_outcome(matcher: DlpMatcher, target: bytes, headers: list[tuple[bytes, bytes]], apart: bool = False
                 ) -> str | None:
    """The refusal's reason (None: allowed) of ``check_head``, or with ``apart`` of the target and the headers
    each searched as its own view, as the head was before its first look."""
    scanner = matcher.scanner()
    try:
        if apart:
            scanner.scan_view(target, "URL")
            scanner.scan_view(b"".join([name + b": " + value + b"\r\n" for name, value in headers]), "headers")
        else:
            scanner.check_head(target, headers)
    except DlpMatch as match:
        return match.rule + ":" + match.reason
    return None


@pytest.mark.parametrize("name", HEAD_POLICIES)
def test_a_head_looked_at_whole_first_is_judged_as_its_parts_searched_apart(name: str) -> None:
    pytest.importorskip("hyperscan")
    from claude_bottle.gate.dlp_hyperscan import HyperscanMatcher

    rules, needles = HEAD_POLICIES[name].rules, secret_needles([HELD])
    fast, reference = HyperscanMatcher(rules, needles), ReferenceMatcher(rules, needles)
    outcomes: dict[str | None, int] = {}
    looked = 0
    for target, headers in heads(2000):
        expected = head_outcome(reference, target, headers, apart=True)
        assert head_outcome(fast, target, headers, apart=True) == expected, (target, headers)
        assert head_outcome(fast, target, headers) == expected, (target, headers)
        assert head_outcome(reference, target, headers) == expected, (target, headers)
        outcomes[expected] = outcomes.get(expected, 0) + 1
        block = b"\r\n".join([target, *map(b": ".join, headers), b""])
        looked += fast.clean(block)
        assert not reference.clean(block) or fast.clean(block), (target, headers)
    # Both ways are taken: heads found clean at the first look (never with a rule searched apart, which the
    # first look cannot rule out), and heads searched apart that end either way.
    assert (looked > 200 if not fast.uncompiled else looked == 0) and outcomes[None] > looked, (looked, outcomes)
    assert len(outcomes) > 5, outcomes
