"""A tunnel's first flight: nothing reaches the upstream until the client's TLS ClientHello names the CONNECT
host, unless raw TCP is allowed there. Real TLS clients and servers on loopback (a trustme CA); the TLS
server's certificate is valid for the fronted name too, so a fronted handshake would succeed if relayed."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import pytest
import trustme

from claude_bottle.gate.resolver import StaticResolver
from claude_bottle.gate.tls import read_client_hello
from tests.conftest import GateFactory, RunningGate
from tests.helpers import connect_via, eventually, read_all, read_head
from tests.unit.test_tls import python_hello, records

pytestmark = pytest.mark.asyncio
NAME, FRONTED = "tls.example.test", "other.example"
LOOPBACK = ("127.0.0.0/8",)


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@dataclass
class Recorder:
    """A TCP server on 127.0.0.2 that keeps every byte it receives; ``speak_first`` is sent on accept."""

    speak_first: bytes = b""
    received: list[bytes] = field(default_factory=list)
    port: int = 0

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(self.speak_first)
        with contextlib.suppress(ConnectionError):
            while data := await reader.read(65536):
                self.received.append(data)
                writer.write(data)
        writer.close()

    @property
    def data(self) -> bytes:
        return b"".join(self.received)


@contextlib.asynccontextmanager
async def recorder(speak_first: bytes = b"") -> AsyncIterator[Recorder]:
    rec = Recorder(speak_first)
    server = await asyncio.start_server(rec.serve, "127.0.0.2", 0)
    rec.port = server.sockets[0].getsockname()[1]
    try:
        yield rec
    finally:
        server.close()


@contextlib.asynccontextmanager
async def tls_echo(ca: trustme.CA) -> AsyncIterator[int]:
    """A TLS echo server whose certificate covers NAME and FRONTED (one front, many sites)."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert(NAME, FRONTED).configure_cert(context)

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, ssl.SSLError):
            while data := await reader.read(65536):
                writer.write(data)
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.2", 0, ssl=context)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()


def resolver() -> StaticResolver:
    return StaticResolver({NAME: [ipaddress.ip_address("127.0.0.2")]})


async def tls_through(gate: RunningGate, ca: trustme.CA, connect_to: str, server_name: str) -> bytes:
    """CONNECT, then a real TLS handshake naming ``server_name``, then an echo; what came back."""
    status, _, reader, writer = await connect_via(gate.proxy, connect_to)
    assert status == 200
    context = ssl.create_default_context()
    ca.configure_trust(context)
    try:
        async with asyncio.timeout(5):
            await writer.start_tls(context, server_hostname=server_name)
            writer.write(b"hello over TLS")
            return await reader.readexactly(14)
    finally:
        writer.close()


async def last_record(gate: RunningGate) -> dict[str, object]:
    await eventually(gate.records, what="the audit record")
    return gate.records()[-1]


async def test_a_real_tls_client_naming_the_connect_host_gets_through(make_gate: GateFactory, ca: trustme.CA) -> None:
    async with tls_echo(ca) as port, make_gate(allow=(f"{NAME}:{port}",), allow_private=LOOPBACK,
                                               resolver=resolver()) as gate:
        assert await tls_through(gate, ca, f"{NAME}:{port}", NAME) == b"hello over TLS"
        record = await last_record(gate)
    assert record["decision"] == "allow" and f"TLS server name {NAME} matches" in str(record["reason"])


async def test_a_fronted_tls_client_is_cut_before_the_upstream_hears_it(make_gate: GateFactory, ca: trustme.CA) -> None:
    async with tls_echo(ca) as port, make_gate(allow=(f"{NAME}:{port}",), allow_private=LOOPBACK,
                                               resolver=resolver()) as gate:
        with pytest.raises((ssl.SSLError, ConnectionError, asyncio.IncompleteReadError)):
            await tls_through(gate, ca, f"{NAME}:{port}", FRONTED)
        record = await last_record(gate)
    assert record["decision"] == "deny" and record["status"] == 200
    assert f"TLS server name {FRONTED} does not match the CONNECT host {NAME}" in str(record["reason"])


async def send_through(gate: RunningGate, connect_to: str, data: bytes, pieces: int = 1,
                       pause: float = 0.0) -> bytes:
    """CONNECT, send ``data`` in ``pieces`` writes, read what comes back until the tunnel closes."""
    status, _, reader, writer = await connect_via(gate.proxy, connect_to)
    assert status == 200
    size = -(-len(data) // pieces)
    for start in range(0, len(data), size):
        writer.write(data[start : start + size])
        await writer.drain()
        await asyncio.sleep(pause)
    answer = await read_all(reader, 1)
    writer.close()
    return answer


Gated = Callable[..., Awaitable[tuple[Recorder, RunningGate, bytes]]]


@pytest.mark.parametrize(("connect_host", "hello", "relayed"), [
    (NAME, python_hello(NAME), True),
    (NAME.upper(), python_hello(NAME), True),
    (NAME, python_hello(NAME.upper() + "."), True),
    ("xn--bcher-kva.example", python_hello("XN--Bcher-KVA.example."), True),
    (NAME, python_hello(FRONTED), False),
    (NAME, python_hello(f"{NAME}.{FRONTED}"), False),
    (NAME, python_hello(None), False),
    ("127.0.0.2", python_hello(NAME), False),
    ("127.0.0.2", python_hello(None), True),
])
async def test_the_server_name_must_be_the_connect_host(
    make_gate: GateFactory, connect_host: str, hello: bytes, relayed: bool
) -> None:
    rslv = StaticResolver({NAME: [ipaddress.ip_address("127.0.0.2")],
                           "xn--bcher-kva.example": [ipaddress.ip_address("127.0.0.2")]})
    async with recorder() as rec:
        allow = (f"{NAME}:{rec.port}", f"Bücher.example:{rec.port}", f"127.0.0.2:{rec.port}")
        async with make_gate(allow=allow, allow_private=LOOPBACK, resolver=rslv) as gate:
            echoed = await send_through(gate, f"{connect_host}:{rec.port}", hello)
            record = await last_record(gate)
            await asyncio.sleep(0.1)
    if relayed:
        assert rec.data == hello and echoed == hello, "the hello goes upstream first, unchanged"
        assert record["decision"] == "allow"
    else:
        assert rec.data == b"" and echoed == b"", "nothing of a refused first flight reaches the upstream"
        assert record["decision"] == "deny" and "TLS" in str(record["reason"])


@pytest.mark.parametrize(("pieces", "record_size"), [(1, 1 << 14), (517, 1 << 14), (7, 50), (517, 9)])
async def test_a_hello_in_many_segments_and_records_is_put_together(
    make_gate: GateFactory, pieces: int, record_size: int
) -> None:
    hello = python_hello(NAME)
    data = records(hello[5:], record_size) + b"\x17\x03\x03\x00\x04more"  # and bytes after it
    async with recorder() as rec, make_gate(allow=(f"{NAME}:{rec.port}",), allow_private=LOOPBACK,
                                            resolver=resolver()) as gate:
        assert read_client_hello(data) is not None
        echoed = await send_through(gate, f"{NAME}:{rec.port}", data, min(pieces, len(data)), 0.0)
    assert rec.data == data and echoed == data


async def test_hello_sent_with_the_connect_head_counts(make_gate: GateFactory) -> None:
    hello = python_hello(NAME)
    async with recorder() as rec, make_gate(allow=(f"{NAME}:{rec.port}",), allow_private=LOOPBACK,
                                            resolver=resolver()) as gate:
        reader, writer = await asyncio.open_connection(gate.proxy.host, gate.proxy.port)
        writer.write(f"CONNECT {NAME}:{rec.port} HTTP/1.1\r\nHost: {NAME}\r\n\r\n".encode() + hello[:100])
        await reader.readuntil(b"\r\n\r\n")
        writer.write(hello[100:])
        assert await asyncio.wait_for(reader.readexactly(len(hello)), 3) == hello
        writer.close()


@pytest.mark.parametrize(("data", "words"), [
    (b"GET / HTTP/1.1\r\nHost: other.example\r\n\r\n", "not a TLS handshake in a tunnel"),
    (b"SSH-2.0-OpenSSH_9.6\r\n", "not a TLS handshake"),
    (b"\x80\x2e\x01\x00\x02", "SSLv2"),
    (b"\x16\x03\x01\x00\x05\x02\x00\x00\x01\x00", "malformed TLS ClientHello"),
])
async def test_non_tls_first_bytes_are_refused(make_gate: GateFactory, data: bytes, words: str) -> None:
    async with recorder() as rec, make_gate(allow=(f"{NAME}:{rec.port}",), allow_private=LOOPBACK,
                                            resolver=resolver()) as gate:
        assert await send_through(gate, f"{NAME}:{rec.port}", data) == b""
        record = await last_record(gate)
    assert rec.data == b""
    assert record["decision"] == "deny" and words in str(record["reason"])


async def test_raw_tcp_allowed_relays_anything_and_lets_the_server_speak_first(make_gate: GateFactory) -> None:
    async with recorder(b"SSH-2.0-server\r\n") as rec, make_gate(allow_tcp=(f"{NAME}:{rec.port}",),
                                                                 allow_private=LOOPBACK, resolver=resolver()) as gate:
        status, _, reader, writer = await connect_via(gate.proxy, f"{NAME}:{rec.port}")
        assert status == 200
        assert await asyncio.wait_for(reader.readexactly(16), 3) == b"SSH-2.0-server\r\n"
        writer.write(b"SSH-2.0-client\r\n")
        assert await asyncio.wait_for(reader.readexactly(16), 3) == b"SSH-2.0-client\r\n"
        writer.close()
        record = await last_record(gate)
    assert "allow-tcp pattern" in str(record["reason"]) and "raw TCP allowed" in str(record["reason"])


async def test_raw_tcp_is_per_target(make_gate: GateFactory) -> None:
    """allow_tcp on one port leaves the host's other allowed ports under the TLS check."""
    async with recorder() as raw, recorder() as checked, make_gate(
        allow_tcp=(f"{NAME}:{raw.port}",), allow=(f"{NAME}:{checked.port}",), allow_private=LOOPBACK,
        resolver=resolver(),
    ) as gate:
        assert await send_through(gate, f"{NAME}:{raw.port}", b"plain") == b"plain"
        assert await send_through(gate, f"{NAME}:{checked.port}", b"plain") == b""


async def test_a_silent_client_is_cut_at_the_first_flight_deadline(make_gate: GateFactory) -> None:
    """A hello started and never finished: the gate cuts the tunnel at its deadline, tells the upstream
    nothing, and audits how much came. The 40 bytes come with the CONNECT head, so the gate holds them before
    its deadline starts: sent after the 200, a test starved of CPU for the deadline's length (a loaded
    machine) wrote them only after the cut, and the audit rightly said 0 bytes."""
    async with recorder() as rec, make_gate(allow=(f"{NAME}:{rec.port}",), allow_private=LOOPBACK,
                                            resolver=resolver(), first_flight_timeout=0.5) as gate:
        loop = asyncio.get_running_loop()
        started = loop.time()  # before the CONNECT: the gate's deadline starts after this, on the same clock
        reader, writer = await asyncio.open_connection(gate.proxy.host, gate.proxy.port)
        writer.write(f"CONNECT {NAME}:{rec.port} HTTP/1.1\r\nHost: {NAME}\r\n\r\n".encode()
                     + python_hello(NAME)[:40])
        status, _ = await read_head(reader)
        rest = b""
        async with asyncio.timeout(30):  # only a hang ends here: the gate's cut is the end being waited for
            with contextlib.suppress(ConnectionResetError):  # the cut may be a reset (the 200 was sent)
                rest = await reader.read()
        elapsed = loop.time() - started
        writer.close()
        record = await last_record(gate)
    assert status == 200 and rest == b"" and rec.data == b""
    assert elapsed >= 0.49, "cut at the deadline, not before it (the loop's clock counts in milliseconds)"
    assert "no TLS ClientHello within 0.5s (40 bytes received)" in str(record["reason"])


async def test_connect_to_port_80_is_refused_unless_raw_tcp_is_allowed(make_gate: GateFactory) -> None:
    async with make_gate(allow=(NAME,), resolver=resolver()) as gate:
        status, headers, _, writer = await connect_via(gate.proxy, f"{NAME}:80")
        writer.close()
    assert status == 403 and "CONNECT to port 80 is refused" in headers["x-deny-reason"]
    assert "absolute URL" in headers["x-deny-reason"]
