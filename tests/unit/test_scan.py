"""The response scanner: the injected credential never reaches the client, even split across chunks."""

from __future__ import annotations

import itertools

import pytest

from claude_bottle.gate.scan import SecretForms, SecretReflected, SecretScanner

SECRET = b"sk-ant-oat01-Qw3rTy_uIoP-aSdFgHjKl0123456789"
PRE = b'data: {"type":"ping"}\n\n'
POST = b" trailing\n\n"


def _feed_all(scanner: SecretScanner, chunks: list[bytes]) -> tuple[bytes, bool]:
    """Bytes returned before any exception, and whether SecretReflected was raised."""
    out = b""
    for chunk in chunks:
        try:
            out += scanner.feed(chunk)
        except SecretReflected:
            return out, True
    return out + scanner.finish(), False


def _split(data: bytes, offsets: tuple[int, ...]) -> list[bytes]:
    bounds = (0, *offsets, len(data))
    return [data[a:b] for a, b in itertools.pairwise(bounds)]


def _check_leak(out: bytes) -> None:
    assert SECRET not in out
    assert SECRET[:8] not in out
    # nothing of the secret at all: everything before it is PRE, which shares no suffix with a secret prefix
    assert out == PRE[: len(out)]


@pytest.mark.parametrize("cut", range(len(PRE) + 1, len(PRE) + len(SECRET)), ids=lambda c: f"at{c - len(PRE)}")
def test_secret_split_in_two_at_every_offset(cut: int) -> None:
    data = PRE + SECRET + POST
    out, raised = _feed_all(SecretForms([SECRET]).scanner(), _split(data, (cut,)))
    assert raised
    _check_leak(out)
    assert out == PRE  # the bytes before the secret were released, the prefix was held


def _three_way_cuts() -> list[tuple[int, int]]:
    start = len(PRE)
    return [(start + i, start + j) for i in range(1, len(SECRET)) for j in range(i + 1, len(SECRET))]


def test_secret_split_in_three_at_every_offset_pair() -> None:
    data = PRE + SECRET + POST
    cuts = _three_way_cuts()
    assert len(cuts) == (len(SECRET) - 1) * (len(SECRET) - 2) // 2
    for cut in cuts:
        out, raised = _feed_all(SecretForms([SECRET]).scanner(), _split(data, cut))
        assert raised, cut
        assert out == PRE, cut


@pytest.mark.parametrize("size", [1, 2, 3, 5, 7, 13], ids=lambda s: f"chunk{s}")
def test_secret_dribbled_in_small_chunks(size: int) -> None:
    data = PRE + SECRET + POST
    chunks = [data[i : i + size] for i in range(0, len(data), size)]
    out, raised = _feed_all(SecretForms([SECRET]).scanner(), chunks)
    assert raised
    _check_leak(out)


@pytest.mark.parametrize(
    "data",
    [SECRET, SECRET + POST, PRE + SECRET, b"sk-ant-" + SECRET, SECRET[:-1] + SECRET, b"sk" * 40 + SECRET],
    ids=["alone", "first", "last", "after-own-prefix", "after-almost-secret", "after-repeats"],
)
def test_secret_anywhere_every_split(data: bytes) -> None:
    for cut in range(len(data) + 1):
        out, raised = _feed_all(SecretForms([SECRET]).scanner(), _split(data, (cut,)))
        assert raised, cut
        # only bytes before the secret's first occurrence may have left, never a byte of the secret itself
        assert data.startswith(out), cut
        assert len(out) <= data.find(SECRET), cut


def test_self_overlapping_secret_byte_by_byte() -> None:
    secret = b"aaab"
    scanner = SecretForms([secret]).scanner()
    out = b""
    with pytest.raises(SecretReflected):
        for byte in b"xaaaaaaab":
            out += scanner.feed(bytes([byte]))
    assert out == b"xaaaa"  # the last three 'a's were held: they could have started the secret
    assert b"aaa" + b"b" not in out


def test_secret_split_at_every_offset_for_self_overlapping_secret() -> None:
    secret = b"abcabd"
    data = b"abcabcabd!"
    for i, j in itertools.combinations(range(1, len(data)), 2):
        out, raised = _feed_all(SecretForms([secret]).scanner(), _split(data, (i, j)))
        assert raised, (i, j)
        assert out in (b"", b"abc"), (i, j, out)


SAFE_CHUNKS = [
    b'event: message_start\ndata: {"type":"message_start"}\n\n',
    b'event: content_block_delta\ndata: {"delta":{"text":"sk-ant is the prefix"}}\n\n',
    b"data: " + SECRET[:-1] + b"\n\n",  # all but the last byte, then a newline: harmless, sent at once
    b"\n\n",
    b"",
]


@pytest.mark.parametrize("chunk", SAFE_CHUNKS, ids=["start", "mentions-prefix", "almost-secret", "blank", "empty"])
def test_sse_chunks_are_returned_whole(chunk: bytes) -> None:
    scanner = SecretForms([SECRET]).scanner()
    assert scanner.feed(chunk) == chunk
    assert scanner.finish() == b""


def test_stream_of_sse_events_holds_nothing() -> None:
    scanner = SecretForms([SECRET]).scanner()
    for chunk in SAFE_CHUNKS * 3:
        assert scanner.feed(chunk) == chunk
    assert scanner.finish() == b""


HOLD_CASES = [
    # (first chunk, held back, second chunk)
    (b"hello s", b"s", b"ome more\n\n"),
    (b"hello sk-ant", b"sk-ant", b"-api03-xyz\n\n"),
    (b"hello " + SECRET[:-1], SECRET[:-1], b"!\n\n"),
    (b"hello sk-ant-oat01-Q", b"sk-ant-oat01-Q", b"X"),
    (b"ssssk-an", b"sk-an", b"x"),
    (SECRET[:5], SECRET[:5], b"zzz"),
]


@pytest.mark.parametrize(("first", "held", "second"), HOLD_CASES, ids=[c[1].decode()[:20] for c in HOLD_CASES])
def test_proper_prefix_is_held_then_released(first: bytes, held: bytes, second: bytes) -> None:
    scanner = SecretForms([SECRET]).scanner()
    assert scanner.feed(first) == first[: len(first) - len(held)]
    assert scanner.feed(second) == held + second  # the next chunk proves it harmless: all of it goes
    assert scanner.finish() == b""


def test_held_prefix_extends_across_chunks_and_finish_returns_it() -> None:
    scanner = SecretForms([SECRET]).scanner()
    assert scanner.feed(b"x sk-") == b"x "
    assert scanner.feed(b"ant-oat01") == b""
    assert scanner.feed(b"-Qw3") == b""
    assert scanner.finish() == b"sk-ant-oat01-Qw3"
    assert scanner.finish() == b""  # finish empties the buffer


def test_finish_without_data() -> None:
    assert SecretForms([SECRET]).scanner().finish() == b""


def test_empty_secret_refused() -> None:
    for forms in ([b""], [], [SECRET, b""]):
        with pytest.raises(ValueError, match="non-empty"):
            SecretForms(forms)


def test_output_plus_finish_reproduces_harmless_input_at_every_split() -> None:
    data = PRE + SECRET[:-1] + b"?" + SECRET[:10]
    for i, j in itertools.combinations(range(len(data) + 1), 2):
        out, raised = _feed_all(SecretForms([SECRET]).scanner(), _split(data, (i, j)))
        assert not raised
        assert out == data, (i, j)
