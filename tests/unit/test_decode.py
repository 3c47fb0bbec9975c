"""What the gate decodes before DLP looks: a second round of percent-escapes and JSON string escapes in every
scanned window, and gzip, deflate and br request bodies under a bound on size and ratio; and what it refuses."""

from __future__ import annotations

import gzip
import json
import random
import tracemalloc
import zlib
from collections.abc import Callable
from urllib.parse import quote_from_bytes, unquote_to_bytes

import brotli
import pytest

from claude_bottle.gate import decode
from claude_bottle.gate.decode import (
    VIEWS,
    BodyDecoder,
    UndecodableBody,
    content_codings,
    json_unescaped,
    percent_decoded_twice,
    unquoted,
)
from claude_bottle.gate.dlp import BUILTIN_NAMES, DlpMatch, DlpPolicy

HELD = b"route-Zq8Xv2Lw9Tn4Rb7Ks1Pd6Hf3Jm0Yc5Ge"
GITHUB_TOKEN = ("gh" + "p_" + "aB3dE6gH9jK2mN5pQ8sT1vW4yZ7bC0eF3hJ6").encode()  # the format, not a real token


def json_escaped(value: bytes) -> bytes:
    """Every character as a \\uXXXX escape: what a JSON encoder may write, and any client can."""
    return b"".join(b"\\u%04x" % c for c in value)


def percent_escaped(value: bytes) -> bytes:
    """Every byte as a %XX escape."""
    return b"".join(b"%%%02X" % c for c in value)


def percent_twice(value: bytes) -> bytes:
    return percent_escaped(value).replace(b"%", b"%25")


# --- views of a window ------------------------------------------------------------------------------------------


def extra_views(window: bytes) -> list[bytes]:
    """The views of ``window`` beyond the single percent-decoding."""
    return [view for view in (percent_decoded_twice(window), json_unescaped(window)) if view is not None]


def test_percent_decoding_in_c_equals_the_standard_librarys_on_any_bytes() -> None:
    rng = random.Random(5)
    alphabet = b"%0123456789abcdefABCDEFgxX\\\n'\"\x00\xff"
    windows = [bytes(rng.choice(alphabet) for _ in range(rng.randrange(12))) for _ in range(20000)]
    windows += [b"\\x41%41", b"%%41", b"%4", b"100%", b"%41\\", quote_from_bytes(rng.randbytes(3000)).encode()]
    for window in windows:
        assert unquoted(window) == unquote_to_bytes(window), window


def test_a_window_without_escapes_has_no_extra_view() -> None:
    assert extra_views(b'{"model": "m", "text": "100% sure, %25 of it, a\\\\b"}') == []
    # what JSON encoders write all the time: control and non-ASCII characters, short escapes
    assert extra_views(b'{"text": "4.5 \\u2192 4.6\\n\\u001b[31mred\\t\\"q\\" \\u007f \\ud83d\\ude00"}') == []
    assert [view.name for view in VIEWS] == ["percent-decoded", "percent-decoded twice", "JSON-unescaped"]


def test_json_escapes_are_undone_as_a_json_parser_reads_them() -> None:
    (view,) = extra_views(b'{"s": "A\\/\\u00e9\\ud83d\\ude00\\"\\\\\\n"}')
    assert view == '{"s": "A/\u00e9\U0001f600"\\\n"}'.encode()


def test_an_escaped_backslash_is_not_the_start_of_an_escape() -> None:
    (view,) = extra_views(b"\\\\u0041 \\u0042")
    assert view == b"\\u0041 B"


def test_other_escapes_are_undone_once_a_printable_one_makes_a_view() -> None:
    (view,) = extra_views(b"\\u2192\\n\\u0041")
    assert view == "\u2192\nA".encode()


def test_a_lone_surrogate_escape_does_not_break_the_view() -> None:
    (view,) = extra_views(b"x\\ud800y" + json_escaped(HELD))
    assert HELD in view


@pytest.mark.parametrize(("written", "views"), [
    (percent_twice(HELD), 1),
    (json_escaped(HELD), 1),
], ids=["percent-twice", "json"])
def test_each_encoding_has_a_view_holding_the_value(written: bytes, views: int) -> None:
    found = list(extra_views(b"prefix " + written + b" suffix"))
    assert any(HELD in view for view in found)
    assert len(found) == views


@pytest.mark.parametrize("encode", [json_escaped, percent_twice], ids=["json", "percent-twice"])
@pytest.mark.parametrize("secret", [HELD, GITHUB_TOKEN], ids=["held", "github-token"])
def test_the_scanner_finds_an_encoded_value_split_anywhere(encode: Callable[[bytes], bytes], secret: bytes) -> None:
    """The scanner keeps its views' greatest expansion times its longest match: an escaped value cut anywhere is seen whole, and
    none of it is passed on."""
    policy = DlpPolicy() if secret == GITHUB_TOKEN else DlpPolicy(disabled=frozenset(BUILTIN_NAMES))
    value = encode(secret)
    filler = b"." * (policy.scanner([HELD]).tail + 7)
    body = filler + value + b" " + filler
    for cut in range(len(filler), len(filler) + len(value), 5):  # a cut inside the value
        scanner = policy.scanner([HELD])
        passed = scanner.feed(body[:cut])
        assert value[:6] not in passed
        with pytest.raises(DlpMatch):
            scanner.feed(body[cut:])
            scanner.finish()


def test_the_scanner_refuses_a_json_escaped_value_in_a_url_and_a_header() -> None:
    scanner = DlpPolicy().scanner([HELD])
    with pytest.raises(DlpMatch, match="in the request URL"):
        scanner.check_head(b"/q?s=" + percent_twice(HELD), [])
    with pytest.raises(DlpMatch, match="in the request headers"):
        DlpPolicy().scanner([HELD]).check_head(b"/", [(b"x-note", json_escaped(GITHUB_TOKEN))])


# --- bodies in a Content-Encoding -------------------------------------------------------------------------------


def test_content_codings_lists_them_in_the_order_applied_without_identity() -> None:
    assert content_codings([b"gzip, identity", b"Deflate"]) == ("gzip", "deflate")
    assert content_codings([]) == ()
    assert content_codings([b"identity"]) == ()


@pytest.mark.parametrize("coding", ["zstd", "compress", "x-custom"])
def test_a_coding_the_gate_cannot_undo_is_refused(coding: str) -> None:
    with pytest.raises(UndecodableBody, match="cannot decode") as refused:
        content_codings([b"gzip, " + coding.encode()])
    assert refused.value.status == 415


def raw_deflate(data: bytes) -> bytes:
    compressor = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    return compressor.compress(data) + compressor.flush()


PLAIN = b'{"note": "' + HELD + b'", "pad": "' + b"abc" * 5000 + b'"}'
ENCODED = {
    "gzip": ("gzip",), "deflate-zlib": ("deflate",), "deflate-raw": ("deflate",), "gzip-members": ("gzip",),
    "gzip-then-deflate": ("gzip", "deflate"), "br": ("br",), "gzip-then-br": ("gzip", "br"),
    "br-then-deflate": ("br", "deflate"),
}


def encoded(kind: str) -> bytes:
    if kind == "gzip":
        return gzip.compress(PLAIN)
    if kind == "deflate-zlib":
        return zlib.compress(PLAIN)
    if kind == "deflate-raw":
        return raw_deflate(PLAIN)
    if kind == "gzip-members":
        return gzip.compress(PLAIN[:1000]) + gzip.compress(PLAIN[1000:])
    if kind == "br":
        return brotli.compress(PLAIN)
    if kind == "gzip-then-br":
        return brotli.compress(gzip.compress(PLAIN))
    if kind == "br-then-deflate":
        return zlib.compress(brotli.compress(PLAIN))
    return zlib.compress(gzip.compress(PLAIN))


@pytest.mark.parametrize("kind", ENCODED)
def test_a_body_is_decoded_whole_and_fed_at_any_split(kind: str) -> None:
    body = encoded(kind)
    decoder = BodyDecoder(ENCODED[kind])
    assert decoder.feed(body) + decoder.finish() == PLAIN
    for size in (1, 2, 7, 1000):
        decoder = BodyDecoder(ENCODED[kind])
        out = b"".join(decoder.feed(body[i : i + size]) for i in range(0, len(body), size)) + decoder.finish()
        assert out == PLAIN, size


@pytest.mark.parametrize(("body", "words"), [
    (b"not gzip at all", "not valid gzip"),
    (gzip.compress(PLAIN)[:-30], "ends inside"),
    (gzip.compress(PLAIN) + b"trailing", "not valid gzip"),
], ids=["garbage", "cut", "trailing-garbage"])
def test_a_corrupt_or_cut_body_is_refused(body: bytes, words: str) -> None:
    decoder = BodyDecoder(("gzip",))
    with pytest.raises(UndecodableBody, match=words) as refused:
        decoder.feed(body)
        decoder.finish()
    assert refused.value.status == 400


@pytest.mark.parametrize(("body", "words"), [
    (b"not br at all", "not valid br"),
    (brotli.compress(PLAIN)[:-3], "ends inside its br"),
    (brotli.compress(PLAIN) + b"smuggled", "not valid br"),
], ids=["garbage", "cut", "bytes-after-the-stream"])
def test_a_corrupt_or_cut_br_body_is_refused(body: bytes, words: str) -> None:
    decoder = BodyDecoder(("br",))
    with pytest.raises(UndecodableBody, match=words) as refused:
        decoder.feed(body)
        decoder.finish()
    assert refused.value.status == 400


def test_bytes_after_a_deflate_stream_are_refused() -> None:
    decoder = BodyDecoder(("deflate",))
    with pytest.raises(UndecodableBody, match="after its deflate stream"):
        decoder.feed(zlib.compress(PLAIN) + b"smuggled")


def test_a_bomb_is_refused_by_its_ratio_without_decoding_it_all() -> None:
    bomb = gzip.compress(bytes(50 * 1024 * 1024))  # about 50 KB that would be 50 MiB
    decoder = BodyDecoder(("gzip",))
    with pytest.raises(UndecodableBody, match="decompression bomb") as refused:
        for i in range(0, len(bomb), 16384):
            decoder.feed(bomb[i : i + 16384])
        decoder.finish()
    assert refused.value.status == 413


def test_a_br_bomb_is_refused_by_its_ratio_without_decoding_it_all() -> None:
    compressor, zeros = brotli.Compressor(quality=5), bytes(1024 * 1024)
    bomb = b"".join(compressor.process(zeros) for _ in range(256)) + compressor.finish()  # 256 MiB in ~500 bytes
    decoder = BodyDecoder(("br",))
    tracemalloc.start()
    try:
        with pytest.raises(UndecodableBody, match="decompression bomb") as refused:
            decoder.feed(bomb)
            decoder.finish()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert refused.value.status == 413
    assert peak < 8 * 1024 * 1024, "decoding stopped near the bound (1 MiB for so small a body), not at its end"


@pytest.mark.parametrize("codings", [("gzip", "br"), ("br", "gzip")])
def test_a_bomb_stacked_with_br_is_refused(codings: tuple[str, ...]) -> None:
    data = bytes(50 * 1024 * 1024)
    for coding in codings:
        data = brotli.compress(data, quality=1) if coding == "br" else gzip.compress(data, 9)
    decoder = BodyDecoder(codings)
    with pytest.raises(UndecodableBody, match="decompression bomb"):
        decoder.feed(data)
        decoder.finish()


def test_a_bomb_inside_a_bomb_is_refused_at_its_inner_layer() -> None:
    bomb = zlib.compress(gzip.compress(bytes(50 * 1024 * 1024)), 9)
    decoder = BodyDecoder(("gzip", "deflate"))
    with pytest.raises(UndecodableBody, match="decompression bomb"):
        decoder.feed(bomb)
        decoder.finish()


def test_a_body_past_the_size_bound_is_refused_whatever_its_ratio(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(decode, "MAX_DECODED_BODY", 2 * 1024 * 1024)
    data = bytes(range(256)) * (3 * 1024 * 4)  # 3 MiB that compress little
    decoder = BodyDecoder(("gzip",))
    with pytest.raises(UndecodableBody, match="decompression bomb"):
        decoder.feed(gzip.compress(data, 1))
        decoder.finish()


def test_an_ordinary_compressed_body_passes_the_bounds() -> None:
    text = json.dumps([{"id": i, "name": f"item {i}", "tags": ["a", "b"]} for i in range(20000)]).encode()
    decoder = BodyDecoder(("gzip",))
    assert decoder.feed(gzip.compress(text)) + decoder.finish() == text
