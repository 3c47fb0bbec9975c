"""Hostile and broken clients: the gate answers or closes that one connection and keeps serving."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import os

import pytest

from claude_bottle.gate import server
from claude_bottle.gate.resolver import StaticResolver
from claude_bottle.stub import StubUpstream
from tests.conftest import GateFactory, RunningGate
from tests.helpers import (
    connect_via,
    eventually,
    exchange,
    messages_request,
    parse_head,
    raw_server,
    read_all,
    read_head,
)

pytestmark = pytest.mark.asyncio

TLS_CLIENT_HELLO = bytes.fromhex("16030100f8010000f40303") + b"r" * 32 + b"\x00\x02\x13\x01\x01\x00"


async def still_serving(gate: RunningGate) -> None:
    response = await exchange(gate.api, messages_request({"model": "m"}), 2)
    assert parse_head(response)[0] == 200, "the gate stopped serving"


@pytest.mark.parametrize("listener", ["api", "proxy"])
@pytest.mark.parametrize(("data", "status"), [
    (b"\x00\xff garbage \x13\x37\r\n\r\n", 400),
    (TLS_CLIENT_HELLO, 400),
    (b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 40_000 + b"\r\n\r\n", 431),
    (b"GET / HTTP/9.9\r\nHost: x\r\n\r\n", 505),
    (b"GET / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n", 501),
])
async def test_bad_bytes_are_answered_and_the_gate_keeps_serving(
    make_gate: GateFactory, listener: str, data: bytes, status: int
) -> None:
    async with make_gate() as gate:
        response = await exchange(getattr(gate, listener), data, 3)
        assert parse_head(response)[0] == status
        assert gate.records()[-1]["decision"] == "deny"
        await still_serving(gate)


@pytest.mark.parametrize(("smuggle", "words"), [
    (b"POST /v1/messages HTTP/1.1\r\nHost: g\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
     "both Content-Length and Transfer-Encoding"),
    (b"POST /v1/messages HTTP/1.1\r\nHost: g\r\nContent-Length: 4\r\nContent-Length: 40\r\n\r\nabcd",
     "Content-Length"),
    (b"POST /v1/messages HTTP/1.1\r\nHost: g\r\nX-Fold: a\r\n b\r\nContent-Length: 0\r\n\r\n", "folding"),
    (b"POST /v1/messages HTTP/1.1\nHost: g\nContent-Length: 0\n\n", "bare LF"),
    (b"POST /v1/messages HTTP/1.1\r\nHost: g\r\nTransfer-Encoding: chunked, identity\r\n\r\n0\r\n\r\n",
     "Transfer-Encoding"),
])
async def test_request_smuggling_framings_are_refused(
    make_gate: GateFactory, stub: StubUpstream, smuggle: bytes, words: str
) -> None:
    async with make_gate() as gate:
        response = await exchange(gate.api, smuggle, 2)
        status, headers = parse_head(response)
        await still_serving(gate)
    assert status in (400, 501) and words in headers["x-deny-reason"]
    assert len(stub.requests) == 1, "only the follow-up request may reach the upstream"


async def test_slow_client_is_cut_off_after_the_header_timeout(make_gate: GateFactory) -> None:
    async with make_gate(header_timeout=0.5) as gate:
        reader, writer = await asyncio.open_connection(gate.api.host, gate.api.port)
        writer.write(b"POST /v1/messages HTTP/1.1\r\nHost: g\r\n")  # and then nothing more
        loop = asyncio.get_running_loop()
        started = loop.time()
        answer = await read_all(reader, 5)
        assert loop.time() - started < 3, "the gate waited far beyond its header timeout"
        assert parse_head(answer)[0] == 408
        writer.close()
        await still_serving(gate)
        assert "not complete within 0.5s" in gate.records()[0]["reason"]


async def test_slow_body_is_cut_off_after_the_idle_timeout(make_gate: GateFactory, stub: StubUpstream) -> None:
    async with make_gate(idle_timeout=0.5) as gate:
        reader, writer = await asyncio.open_connection(gate.api.host, gate.api.port)
        writer.write(b"POST /v1/messages HTTP/1.1\r\nHost: g\r\nContent-Length: 100\r\n\r\n{")
        assert b"message_stop" not in await read_all(reader, 5)
        writer.close()
        await still_serving(gate)


async def test_many_requests_leave_no_tasks_or_sockets_behind(make_gate: GateFactory) -> None:
    """Bounded: 150 rounds of an allowed, a refused and a broken exchange."""
    async with make_gate() as gate:
        await still_serving(gate)
        fds_before = len(os.listdir("/proc/self/fd"))
        tasks_before = len(asyncio.all_tasks())
        async with asyncio.timeout(60):
            for _ in range(150):
                await exchange(gate.api, messages_request({"model": "m", "stream": True}), 2)
                await exchange(gate.proxy, b"CONNECT nope.example:443 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", 2)
                await exchange(gate.api, b"\x16\x03\x01 not http\r\n\r\n", 2)
            # Keep-alive upstream connections may stay.
            await eventually(lambda: len(asyncio.all_tasks()) <= tasks_before
                             and len(os.listdir("/proc/self/fd")) <= fds_before + 4, what="connections to close")
        assert len(gate.records()) == 1 + 450


@pytest.mark.parametrize("listener", ["api", "proxy"])
async def test_a_head_trickled_in_is_cut_at_the_head_deadline(make_gate: GateFactory, listener: str) -> None:
    """One byte every 0.1 s: each read is quick, the whole head is not."""
    async with make_gate(header_timeout=0.5) as gate:
        reader, writer = await asyncio.open_connection(gate.api.host, getattr(gate, listener).port)
        loop = asyncio.get_running_loop()
        started = loop.time()
        head = b"GET http://example.com/ HTTP/1.1\r\nHost: example.com\r\nX-Slow: " + b"a" * 100
        answer = b""
        for byte in head:  # at most 140 bytes, 0.1 s apart
            writer.write(bytes([byte]))
            with contextlib.suppress(TimeoutError):
                answer = await asyncio.wait_for(reader.read(65536), 0.1)
            if answer:
                break
        elapsed = loop.time() - started
        answer += await read_all(reader, 2)
        writer.close()
        await still_serving(gate)
    assert elapsed < 2, f"the gate took bytes for {elapsed:.1f}s past a 0.5s head deadline"
    assert parse_head(answer)[0] == 408
    assert "request head not complete within 0.5s" in gate.records()[0]["reason"]


# A request each listener answers and then keeps the connection for the next (a refusal keeps it too).
KEPT = {"api": messages_request({"model": "m"}, keep_alive=True),
        "proxy": b"CONNECT nope.example:443 HTTP/1.1\r\nHost: x\r\n\r\n"}


async def held_connection(gate: RunningGate, listener: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection the gate is serving: it answered one request on it, and keeps it open for the next."""
    endpoint = getattr(gate, listener)
    reader, writer = await asyncio.open_connection(endpoint.host, endpoint.port)
    writer.write(KEPT[listener])
    assert (await read_head(reader))[0] in (200, 403)
    return reader, writer


async def served_again(gate: RunningGate, listener: str) -> None:
    """Wait until a new connection to ``listener`` is served rather than refused 503 (bounded)."""
    endpoint = getattr(gate, listener)
    async with asyncio.timeout(5):
        while True:
            reader, writer = await asyncio.open_connection(endpoint.host, endpoint.port)
            writer.write(KEPT[listener])
            status = (await read_head(reader))[0]
            writer.close()
            if status != 503:
                return
            await asyncio.sleep(0.05)


@pytest.mark.parametrize("listener", ["api", "proxy"])
async def test_connections_past_the_cap_are_refused_503_and_the_gate_recovers(
    make_gate: GateFactory, listener: str
) -> None:
    async with make_gate(max_connections=3) as gate:
        endpoint = getattr(gate, listener)
        held = [await held_connection(gate, listener) for _ in range(3)]
        extra = await exchange(endpoint, b"", 2)
        status, headers = parse_head(extra)
        for _, writer in held:
            writer.close()
        await served_again(gate, listener)
        await still_serving(gate)
        (refusal,) = [record for record in gate.records() if record["status"] == 503][:1]
    assert status == 503 and f"too many connections to the {listener} listener (limit 3)" in headers["x-deny-reason"]
    assert refusal["decision"] == "deny" and refusal["status"] == 503 and refusal["listener"] == listener


async def test_the_other_listener_is_not_starved_by_a_flood(make_gate: GateFactory) -> None:
    async with make_gate(max_connections=2) as gate:
        held = [await held_connection(gate, "proxy") for _ in range(2)]
        assert parse_head(await exchange(gate.proxy, b"", 2))[0] == 503, "the proxy listener is full"
        await still_serving(gate)  # the API listener has its own cap
        for _, writer in held:
            writer.close()


async def test_protected_upstream_addresses_survive_a_failed_refresh(make_gate: GateFactory, stub: StubUpstream,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The upstream by name resolves to the stub's address; then its DNS fails. An alias of that address must
    stay refused: the last addresses that resolved stay protected."""
    resolver = StaticResolver({"api.upstream.test": [ipaddress.ip_address("127.0.0.1")],
                               "alias.example.com": [ipaddress.ip_address("127.0.0.1")]})
    monkeypatch.setattr(server, "UPSTREAM_ADDRESS_TTL", 0.0)  # each proxy connection refreshes them
    async with make_gate(upstream=f"http://api.upstream.test:{stub.port}", allow=(f"alias.example.com:{stub.port}",),
                         allow_private=("127.0.0.0/8",), resolver=resolver) as gate:
        del resolver.table["api.upstream.test"]
        status, headers, _, writer = await connect_via(gate.proxy, f"alias.example.com:{stub.port}")
        writer.close()
        assert resolver.calls.count("api.upstream.test") == 2, "the refresh did run, and failed"
    assert status == 403 and "credential upstream" in headers["x-deny-reason"]
    assert stub.requests == []


async def test_a_fault_inside_an_exchange_is_answered_and_audited_with_its_reason(
    make_gate: GateFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def broken(*args: object) -> None:
        raise RuntimeError("simulated fault")

    monkeypatch.setattr(server, "proxy_exchange", broken)
    async with make_gate() as gate:
        response = await exchange(gate.proxy, b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com\r\n\r\n", 2)
        await still_serving(gate)
        record = gate.records()[0]
    assert parse_head(response)[0] == 500
    assert record["decision"] == "error" and "RuntimeError: simulated fault" in record["reason"]


@pytest.mark.parametrize("listener", ["api", "proxy"])
async def test_a_client_stalling_mid_upload_is_answered_408_as_its_own_fault(make_gate: GateFactory,
                                                                             listener: str) -> None:
    """The upstream is waiting for the body, not failing: the gate must not blame it (504)."""
    async def patient(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):
            await reader.read()  # reads whatever comes, answers nothing

    host = "127.0.0.1" if listener == "api" else "127.0.0.2"
    async with raw_server(patient, host) as origin, \
            make_gate(upstream=f"http://{origin}" if listener == "api" else None, api_paths=("POST /v1/upload",),
                      allow=(str(origin),), allow_private=("127.0.0.2/32",), idle_timeout=0.5) as gate:
        endpoint = gate.api if listener == "api" else gate.proxy
        target = "/v1/upload" if listener == "api" else f"http://{origin}/upload"
        reader, writer = await asyncio.open_connection(endpoint.host, endpoint.port)
        writer.write(f"POST {target} HTTP/1.1\r\nHost: {origin}\r\nContent-Length: 100\r\n\r\n".encode()
                     + b"ten bytes.")
        await writer.drain()
        answer = await read_all(reader, 5)
        writer.close()
        await eventually(gate.records, what="the audit line")
        record = gate.records()[0]
    status, headers = parse_head(answer)
    assert status == 408 and "client idle" in headers["x-deny-reason"]
    assert record["decision"] == "error" and record["status"] == 408
    assert "client idle too long" in record["reason"] and "upstream" not in record["reason"]
    assert record["bytes_up"] == 0, "the ten bytes are within the tail DLP holds back: none went upstream"


# A request whose body the gate keeps whole to judge it, 512 KiB long, of which 400 KiB are sent: on the API
# listener a Messages request, on the proxy's an MCP server's call (never dialled: its body is judged first).
HELD = {"api": ("POST /v1/messages HTTP/1.1\r\nHost: gate\r\n", "api"),
        "proxy": ("POST http://127.0.0.2:9/mcp HTTP/1.1\r\nHost: 127.0.0.2:9\r\n", "proxy")}
HELD_LENGTH, HELD_SENT = 512 * 1024, 400 * 1024


async def held_body(gate: RunningGate, listener: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    endpoint = getattr(gate, listener)
    reader, writer = await asyncio.open_connection(endpoint.host, endpoint.port)
    head, _ = HELD[listener]
    writer.write(f"{head}Content-Type: application/json\r\nContent-Length: {HELD_LENGTH}\r\n\r\n".encode()
                 + b"[" + b" " * (HELD_SENT - 1))
    await writer.drain()
    return reader, writer


@pytest.mark.parametrize("listener", ["api", "proxy"])
async def test_bodies_held_past_a_listeners_budget_are_refused_503_and_the_budget_comes_back(
        make_gate: GateFactory, listener: str) -> None:
    """What a listener's exchanges hold of request bodies to judge them is bounded (here 1 MiB): two bodies
    of 400 KiB are held, a third is refused 503 at once rather than held, the other listener serves meanwhile,
    and once the two exchanges end a body is held again."""
    async with make_gate(allow_private=("127.0.0.0/8",), mcp_servers=("tracker 127.0.0.2:9",),
                         api_held_bytes=1 << 20, proxy_held_bytes=1 << 20) as gate:
        held = [await held_body(gate, listener) for _ in range(2)]
        await asyncio.sleep(0.3)
        reader, writer = await held_body(gate, listener)
        status, headers = await asyncio.wait_for(read_head(reader), 5)
        writer.close()
        assert status == 503 and "request bodies to judge already (at most 1 MiB at once)" in headers["x-deny-reason"]
        await still_serving(gate)
        for _, other in held:
            other.close()
        await asyncio.sleep(0.3)
        reader, writer = await held_body(gate, listener)
        with pytest.raises(TimeoutError):  # held, not refused
            await asyncio.wait_for(reader.read(1), 0.5)
        writer.close()
    refusals = [r for r in gate.records() if r["status"] == 503]
    assert len(refusals) == 1 and refusals[0]["listener"] == listener
