"""gate/tls.py on real ClientHellos (captured by tests/capture_first_flight.py) and on crafted broken ones."""

from __future__ import annotations

import ssl
import struct
from pathlib import Path

import pytest

from claude_bottle.gate.tls import MAX_HELLO, MAX_RECORDS, BadHello, ClientHello, NotTls, read_client_hello, wanted

CAPTURED = Path(__file__).parent.parent / "testdata" / "first-flight"
CLIENTS = ("python-ssl", "curl", "node", "git")
NAME = "first-flight.example"


def captured(client: str) -> bytes:
    return (CAPTURED / f"{client}.bin").read_bytes()


def records(handshake: bytes, size: int, version: bytes = b"\x03\x01") -> bytes:
    """``handshake`` re-cut into TLS handshake records of at most ``size`` bytes each."""
    return b"".join(bytes([22]) + version + struct.pack("!H", len(handshake[i : i + size])) + handshake[i : i + size]
                    for i in range(0, len(handshake), size))


def handshake_of(data: bytes) -> bytes:
    """The handshake bytes of a single-record first flight."""
    assert data[0] == 22
    return data[5 : 5 + int.from_bytes(data[3:5], "big")]


def vector(width: int, body: bytes) -> bytes:
    return len(body).to_bytes(width, "big") + body


def extension(kind: int, body: bytes) -> bytes:
    return struct.pack("!H", kind) + vector(2, body)


def sni(*names: bytes, kind: int = 0) -> bytes:
    return extension(0, vector(2, b"".join(bytes([kind]) + vector(2, n) for n in names)))


def hello(extensions: bytes | None = None, session: bytes = b"", suites: bytes = b"\x13\x01",
          compression: bytes = b"\x00", trailing: bytes = b"") -> bytes:
    """A crafted ClientHello in one record; ``extensions=None`` leaves the extensions block out."""
    body = b"\x03\x03" + b"r" * 32 + vector(1, session) + vector(2, suites) + vector(1, compression)
    if extensions is not None:
        body += vector(2, extensions)
    body += trailing
    return records(b"\x01" + vector(3, body), 1 << 14)


def python_hello(server_name: str | None) -> bytes:
    """Python's own first flight, made in memory."""
    context = ssl.create_default_context()
    if server_name is None:
        context.check_hostname = False
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = context.wrap_bio(incoming, outgoing, server_hostname=server_name)
    with pytest.raises(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()


@pytest.mark.parametrize("client", CLIENTS)
def test_a_real_hello_yields_its_server_name(client: str) -> None:
    data = captured(client)
    assert read_client_hello(data) == ClientHello(NAME, len(data))


@pytest.mark.parametrize("client", CLIENTS)
def test_a_real_hello_split_at_every_byte_is_incomplete_until_its_last_byte(client: str) -> None:
    data = captured(client)
    for cut in range(len(data)):
        assert read_client_hello(data[:cut]) is None, f"decided after {cut} of {len(data)} bytes"
    assert read_client_hello(data) == ClientHello(NAME, len(data))


@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize("size", [9, 10, 16, 64, 200, 1 << 14])
def test_a_real_hello_spread_over_many_records(client: str, size: int) -> None:
    data = records(handshake_of(captured(client)), size)
    assert read_client_hello(data) == ClientHello(NAME, len(data))
    for cut in range(0, len(data), 13):
        assert read_client_hello(data[:cut]) is None


@pytest.mark.parametrize("client", CLIENTS)
def test_bytes_after_the_hello_are_not_part_of_it(client: str) -> None:
    data = captured(client)
    later = b"\x14\x03\x03\x00\x01\x01" + b"\x17\x03\x03\x00\x05early"  # change_cipher_spec, early data
    assert read_client_hello(data + later) == ClientHello(NAME, len(data))


@pytest.mark.parametrize("name", ["example.com", "xn--bcher-kva.example", "a.b-c_d.example", "127.0.0.1"])
def test_python_hello_carries_the_name_it_was_given(name: str) -> None:
    data = python_hello(name)
    expected = None if name == "127.0.0.1" else name  # Python sends no SNI for an IP address
    assert read_client_hello(data) == ClientHello(expected, len(data))


def test_a_hello_without_sni_has_no_name() -> None:
    data = python_hello(None)
    assert read_client_hello(data) == ClientHello(None, len(data))
    assert read_client_hello(hello(None)) == ClientHello(None, len(hello(None)))
    assert read_client_hello(hello(extension(10, b"\x00\x02\x00\x1d"))) is not None


@pytest.mark.parametrize(("data", "words"), [
    (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", "not a TLS handshake"),
    (b"SSH-2.0-OpenSSH_9.6\r\n", "not a TLS handshake"),
    (b"\x00", "not a TLS handshake"),
    (b"\x80\x2e\x01\x00\x02\x00\x15\x00\x00\x00\x10", "SSLv2"),  # SSLv2-format hello
    (b"\x16\x02\x00\x00\x05hello", "not TLS"),
    (b"\x16\x04\x01\x00\x05hello", "not TLS"),
])
def test_non_tls_bytes_are_not_tls(data: bytes, words: str) -> None:
    with pytest.raises(NotTls, match=words):
        read_client_hello(data)


GOOD_SNI = sni(b"a.example")


def test_the_crafted_hello_is_sound() -> None:
    """The control for the table below: each broken hello differs from this one in one thing."""
    data = hello(extension(10, b"\x00\x02\x00\x1d") + GOOD_SNI, session=b"s" * 32)
    assert read_client_hello(data) == ClientHello("a.example", len(data))


@pytest.mark.parametrize(("data", "words"), [
    (b"\x16\x03\x01\x00\x00", "record of 0 bytes"),
    (b"\x16\x03\x01\xff\xff", "record of 65535 bytes"),
    (b"\x16\x03\x01\x00\x04\x02\x00\x00\x00", "handshake message type 2"),
    (b"\x17\x03\x03\x00\x01x", "not a TLS handshake"),
    (records(b"\x01\x00\x00\x08", 4) + b"\x17\x03\x03\x00\x01x", "record of type 23"),
    (records(b"\x01" + (MAX_HELLO).to_bytes(3, "big"), 4), "ClientHello of"),
    (records(b"\x01\x00\x00\x02ab", 9), "truncated"),
    (hello(GOOD_SNI, session=b"s" * 33), "session id"),
    (hello(GOOD_SNI, suites=b""), "cipher suite"),
    (hello(GOOD_SNI, suites=b"\x13"), "cipher suite"),
    (hello(GOOD_SNI, compression=b""), "compression"),
    (hello(GOOD_SNI, trailing=b"x"), "after the ClientHello's extensions"),
    (hello(GOOD_SNI + GOOD_SNI), "appears twice"),
    (hello(extension(0, vector(2, b"\x00" + vector(2, b"a.example")) + b"x")), "after the server name list"),
    (hello(sni(b"a.example", b"b.example")), "more than one TLS server name"),
    (hello(sni(b"a.example", kind=1)), "unknown type 1"),
    (hello(extension(0, vector(2, b""))), "empty TLS server name list"),
    (hello(sni(b"")), "printable ASCII"),
    (hello(sni(b"a.example\x00.b")), "printable ASCII"),
    (hello(sni("bücher.example".encode())), "printable ASCII"),
    (hello(sni(b"a example")), "printable ASCII"),
    (hello(extension(0, b"\x00")), "truncated"),
    (hello(extension(0, vector(2, b"\x00\x00\x09a.ex"))), "truncated"),
])
def test_malformed_hellos_are_refused_with_a_reason(data: bytes, words: str) -> None:
    with pytest.raises(BadHello, match=words):
        read_client_hello(data)


def test_a_handshake_record_carrying_more_than_the_hello_is_refused() -> None:
    body = handshake_of(hello(GOOD_SNI))
    with pytest.raises(BadHello, match="more handshake data"):
        read_client_hello(records(body + b"\x10\x00\x00\x00", 1 << 14))


def test_a_hello_in_too_many_records_is_refused() -> None:
    body = handshake_of(captured("curl"))
    assert read_client_hello(records(body, -(-len(body) // MAX_RECORDS))) is not None
    with pytest.raises(BadHello, match=f"more than {MAX_RECORDS} TLS records"):
        read_client_hello(records(body, 1))


def test_an_incomplete_hello_is_cut_at_the_bound() -> None:
    header = b"\x01" + (MAX_HELLO - 4).to_bytes(3, "big")
    data = records(header + b"\x00" * 29_996, 10_000) + b"\x16\x03\x01\x27\x10" + b"\x00" * 3_000
    with pytest.raises(BadHello, match="no complete ClientHello"):
        read_client_hello(data)


@pytest.mark.parametrize("client", CLIENTS)
def test_wanted_is_the_end_of_the_record_being_received(client: str) -> None:
    data = records(handshake_of(captured(client)), 100)
    starts = list(range(0, len(data), 105))  # 5-byte header + 100 bytes each (the last one shorter)
    for cut in range(len(data)):
        start = max(s for s in starts if s <= cut)
        header_seen = cut - start >= 5
        expected = min(start + 105, len(data)) if header_seen else start + 5
        assert wanted(data[:cut]) == expected, cut
    assert wanted(data) == len(data) + 5


def test_garbage_never_raises_anything_but_bad_hello() -> None:
    """Bounded fuzz: random bytes and random corruptions of real hellos."""
    rng = __import__("random").Random(1234)
    real = [captured(c) for c in CLIENTS]
    for _ in range(3000):
        base = bytearray(rng.choice(real))
        for _ in range(rng.randint(1, 4)):
            base[rng.randrange(len(base))] = rng.randrange(256)
        for data in (bytes(base), bytes(rng.randrange(256) for _ in range(rng.randint(0, 64))),
                     b"\x16\x03\x01" + bytes(base[3 : rng.randint(3, len(base))])):
            try:
                result = read_client_hello(data)
            except BadHello:
                continue
            assert result is None or (result.server_name is None or result.server_name.isascii())
