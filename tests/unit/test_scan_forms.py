"""One scanner for every reflected form of every injected credential, differential: on generated responses (each
form, near misses, forms cut at every chunk edge plus and minus one byte) it refuses exactly where one scanner
per form, chained as the response filters were, refuses, with either search engine; and what it lets out
before a refusal is never the start of a form."""

from __future__ import annotations

import itertools
import random

import pytest

from claude_bottle.gate.decode import reflected_forms
from claude_bottle.gate.scan import SecretForms, SecretReflected

TOKEN = b"sk-ant-oat01-Qw3rTy_uIoP-aSdFgHjKl0123456789/+=?&x y"
ROUTE = b"ghp_" + b"R2d2C3po" * 5
FORMS = [form for secret in (TOKEN, ROUTE) for form in reflected_forms(secret)]
PRE = b'event: content_block_delta\ndata: {"delta":{"text":"'
POST = b'"}}\n\n'


class _OneForm:
    """The reference: one form's scanner (a window per chunk, the longest suffix that starts the form held)."""

    def __init__(self, form: bytes) -> None:
        self._form, self._held = form, b""

    def feed(self, chunk: bytes) -> bytes:
        window = self._held + chunk
        if self._form in window:
            raise SecretReflected
        keep = next((len(window) - at for at in range(max(0, len(window) - len(self._form) + 1), len(window))
                     if self._form.startswith(window[at:])), 0)
        self._held = window[len(window) - keep :]
        return window[: len(window) - keep]

    def finish(self) -> bytes:
        held, self._held = self._held, b""
        return held


def _reference_refuses(chunks: list[bytes]) -> bool:
    """The forms' scanners chained, each one's output the next one's input, as the filters wrapped the body."""
    stream = chunks
    try:
        for form in dict.fromkeys(FORMS):
            scanner, out = _OneForm(form), []
            for chunk in stream:
                out.append(scanner.feed(chunk))
            out.append(scanner.finish())
            stream = out
    except SecretReflected:
        return True
    return False


def _scan(forms: SecretForms, chunks: list[bytes]) -> tuple[bytes, bool]:
    scanner, out = forms.scanner(), b""
    try:
        for chunk in chunks:
            out += scanner.feed(chunk)
    except SecretReflected:
        return out, True
    return out + scanner.finish(), False


def _bodies() -> list[tuple[bytes, int]]:
    """(body, where the payload starts): every form whole, and near misses of it (one byte off, cut short)."""
    bodies = []
    for form in dict.fromkeys(FORMS):
        flipped = form[:-1] + bytes([form[-1] ^ 1])
        for payload in (form, form[:-1], form[1:], flipped, form[: len(form) // 2] + b"\n" + form[len(form) // 2 :]):
            bodies.append((PRE + payload + POST, len(PRE)))
    return bodies


def _cuts(body: bytes, start: int, rng: random.Random) -> list[tuple[int, ...]]:
    """Chunk edges at the payload's start and end plus and minus one byte, and random ones."""
    end = len(body) - len(POST)
    edges = [e for e in (start - 1, start, start + 1, end - 1, end, end + 1) if 0 < e < len(body)]
    cuts: list[tuple[int, ...]] = [(e,) for e in edges] + [pair for pair in itertools.combinations(edges, 2)]
    cuts += [tuple(sorted(rng.sample(range(1, len(body)), 3))) for _ in range(8)]
    return cuts


@pytest.mark.parametrize("hyperscan", [True, False], ids=["hyperscan", "standard"])
def test_one_scanner_refuses_where_the_scanners_per_form_refuse(hyperscan: bool) -> None:
    forms = SecretForms(FORMS, hyperscan=hyperscan)
    rng = random.Random(27)
    checked = 0
    for body, start in _bodies():
        for cut in _cuts(body, start, rng):
            bounds = (0, *cut, len(body))
            chunks = [body[a:b] for a, b in itertools.pairwise(bounds)]
            out, refused = _scan(forms, chunks)
            assert refused == _reference_refuses(chunks) == any(f in body for f in FORMS), (body, cut)
            assert body.startswith(out)
            if refused:
                first = min(body.find(f) for f in FORMS if f in body)
                assert len(out) <= first, (body, cut)  # not a byte of the form left
            else:
                assert out == body
            checked += 1
    assert checked > 1000


@pytest.mark.parametrize("hyperscan", [True, False], ids=["hyperscan", "standard"])
def test_large_windows_and_headers_searched_alike(hyperscan: bool) -> None:
    forms = SecretForms(FORMS, hyperscan=hyperscan)
    filler = b"x" * 70_000
    for form in dict.fromkeys(FORMS):
        assert forms.found_in(filler + form + filler)
        assert not forms.found_in(filler + form[:-1] + filler)
        assert forms.in_headers([(b"content-type", b"text/plain"), (b"x-echo", b"a " + form)])
        assert forms.in_headers([(b"content-type", b"text/plain"), (b"x-" + form, b"1")]), "a header's name"
        # a form split over two header values, or over a header's name and value, is not in either
        half = len(form) // 2
        assert not forms.in_headers([(b"x-a", form[:half]), (b"x-b", form[half:])])
        assert not forms.in_headers([(form[:half], form[half:])])


@pytest.mark.parametrize("hyperscan", [True, False], ids=["hyperscan", "standard"])
def test_a_whole_message_is_searched_as_its_headers_and_body_apart(hyperscan: bool) -> None:
    forms = SecretForms(FORMS, hyperscan=hyperscan)
    for form in dict.fromkeys(FORMS):
        half = len(form) // 2
        for headers, body in [([(b"x-a", b"1")], b"{" + form + b"}"), ([(b"x-echo", form)], b""),
                              ([(b"x-a", form[:half])], form[half:]), ([(b"x-a", b"1")], form[:-1] + b"\n"),
                              ([(b"x-a", form[:half]), (b"x-b", form[half:])], b""),
                              ([(form, b"1")], b""), ([(b"x-a", form[:half])], form[half:])]:
            assert forms.in_message(headers, body) == (forms.in_headers(headers) or forms.found_in(body))


def test_a_form_with_a_newline_is_searched_header_by_header() -> None:
    forms = SecretForms([b"ab\ncd"])
    assert not forms.in_headers([(b"x-a", b"ab"), (b"x-b", b"cd")])
    assert forms.in_headers([(b"x-a", b"zab\ncd")]) and forms.in_headers([(b"zab\ncd", b"1")])
    assert not forms.in_headers([(b"ab", b"cd")])
    assert not forms.in_message([(b"x-a", b"ab")], b"cd") and forms.in_message([(b"x-a", b"1")], b"ab\ncd")


def test_nothing_is_held_after_a_byte_no_form_has() -> None:
    forms = SecretForms(FORMS)
    scanner = forms.scanner()
    for form in dict.fromkeys(FORMS):
        assert scanner.feed(b"data: " + form[:-1] + b"\n\n") == b"data: " + form[:-1] + b"\n\n"
    assert scanner.finish() == b""
