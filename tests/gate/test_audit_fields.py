"""The audit as data: `policy suggest` and `logs` read a real gate's lines by their fields, never their
reasons. Every reason is reworded and nothing they derive changes but the reason column.

Targets live on 127.0.0.2 (the stub Messages API holds 127.0.0.1) under names a static resolver knows.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import AsyncIterator
from typing import Any

import pytest

from claude_bottle import logview, suggest
from claude_bottle.gate.resolver import StaticResolver
from claude_bottle.stub import StubUpstream
from tests.conftest import GateFactory, RunningGate
from tests.helpers import connect_via, eventually, exchange, messages_request, parse_head, read_all

pytestmark = pytest.mark.asyncio
LOOPBACK = ("127.0.0.0/8",)
LISTED, UNLISTED, RAW = "listed.example.test", "unlisted.example.test", "raw.example.test"
METADATA = "metadata.example.test"
RESOLVER = StaticResolver({name: [ipaddress.ip_address("127.0.0.2")] for name in (LISTED, UNLISTED, RAW)}
                          | {METADATA: [ipaddress.ip_address("169.254.169.254")]})


@pytest.fixture
async def target() -> AsyncIterator[StubUpstream]:
    async with StubUpstream("127.0.0.2") as server:
        yield server


def get(host: str, port: int, path: str) -> bytes:
    return f"GET http://{host}:{port}{path} HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: close\r\n\r\n".encode()


async def raw_tunnel(gate: RunningGate, authority: str) -> None:
    """A CONNECT whose bytes are plain HTTP, not TLS: only raw TCP carries them."""
    status, _, reader, writer = await connect_via(gate.proxy, authority)
    assert status == 200
    writer.write(f"GET /v1/models HTTP/1.1\r\nHost: {authority}\r\nConnection: close\r\n\r\n".encode())
    await read_all(reader, 3)
    writer.close()


async def run_audit(make_gate: GateFactory, port: int) -> list[dict[str, Any]]:
    """The audit of a learning gate and of a strict one, each asked for listed, unlisted, raw-TCP and
    guarded destinations."""
    lines: list[dict[str, Any]] = []
    for learn in (True, False):
        async with make_gate(learn=learn, allow=(f"{LISTED}:{port}",), allow_tcp=(f"{RAW}:{port}",),
                             allow_private=LOOPBACK, resolver=RESOLVER) as gate:
            await exchange(gate.proxy, get(LISTED, port, "/v1/models"), 3)
            await exchange(gate.proxy, get(UNLISTED, port, "/simple/x/"), 3)
            await exchange(gate.proxy, get(METADATA, port, "/latest"), 3)
            await raw_tunnel(gate, f"{RAW}:{port}")
            _, _, _, writer = await connect_via(gate.proxy, f"{UNLISTED}:{port}")
            writer.close()
            await eventually(lambda: len(gate.records()) == 5, what="five audit lines")
            lines += gate.records()
    return lines


def reworded(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{**line, "reason": f"lorem ipsum {i}"} for i, line in enumerate(lines)]


def without_reason(row: str) -> str:
    return row[:sum(width + 1 for _, width in logview.COLUMNS)]


async def test_suggest_and_logs_read_fields_so_rewording_every_reason_changes_only_the_reason_column(
        make_gate: GateFactory, target: StubUpstream) -> None:
    lines = await run_audit(make_gate, target.port)
    again = reworded(lines)

    found, found_again = suggest.suggest(lines), suggest.suggest(again)
    assert found.destinations == found_again.destinations
    assert found.refused.keys() == found_again.refused.keys()
    assert found.destinations[RAW + f":{target.port}"].raw_tcp  # what the fields say, read
    assert found.destinations[UNLISTED + f":{target.port}"].would_deny

    assert [without_reason(logview.row(line, colour=False)) for line in lines] == \
        [without_reason(logview.row(line, colour=False)) for line in again]
    offers = [logview.offer(line, "dev") for line in lines]
    assert offers == [logview.offer(line, "dev") for line in again]
    assert sum(offer is not None for offer in offers) == 3  # the strict gate's three unlisted refusals


async def test_each_line_names_its_tunnel_mode_and_unlisted_targets(make_gate: GateFactory,
                                                                  target: StubUpstream) -> None:
    lines = await run_audit(make_gate, target.port)
    tunnels = {(line["target"], line["decision"], line.get("tunnel")) for line in lines if line["method"] == "CONNECT"}
    raw, unlisted = f"{RAW}:{target.port}", f"{UNLISTED}:{target.port}"
    # learn mode let the unlisted CONNECT through, then its first flight was refused: the mode was opaque
    assert tunnels == {(raw, "allow", "raw_tcp"), (unlisted, "deny", "opaque"), (unlisted, "deny", None)}
    assert sorted((line["target"], line["decision"]) for line in lines if line.get("unlisted")) == \
        sorted([(unlisted, "allow"), (unlisted, "deny"), (unlisted, "deny"), (f"{METADATA}:{target.port}", "deny")])


async def test_a_tunnel_that_fails_before_its_200_names_the_mode_chosen_for_it(make_gate: GateFactory) -> None:
    with socket.socket() as closed:  # a port nothing listens on: the upstream refuses the connection
        closed.bind(("127.0.0.2", 0))
        port = closed.getsockname()[1]
    async with make_gate(allow=(f"{LISTED}:{port}",), allow_tcp=(f"{RAW}:{port}",), allow_private=LOOPBACK,
                         resolver=RESOLVER) as gate:
        for host in (LISTED, RAW):
            status, _, _, writer = await connect_via(gate.proxy, f"{host}:{port}")
            writer.close()
            assert status == 502
        await eventually(lambda: len(gate.records()) == 2, what="the two tunnels' lines")
    modes = {(line["target"], line["decision"], line["side"], line.get("tunnel")) for line in gate.records()}
    assert modes == {(f"{LISTED}:{port}", "error", "upstream", "opaque"), (f"{RAW}:{port}", "error", "upstream",
                                                                          "raw_tcp")}


async def test_a_failure_names_its_side(make_gate: GateFactory, target: StubUpstream) -> None:
    async with make_gate(allow=(f"{LISTED}:{target.port}",), allow_private=LOOPBACK, resolver=RESOLVER,
                         idle_timeout=0.5) as gate:
        stalled = (f"POST http://{LISTED}:{target.port}/upload HTTP/1.1\r\nHost: {LISTED}:{target.port}\r\n"
                   "Content-Length: 10\r\n\r\nab").encode()  # a body that stops coming
        await exchange(gate.proxy, stalled, 3)
        await eventually(lambda: len(gate.records()) == 1, what="the client's failure")
        (client,) = gate.records()
    assert (client["decision"], client["status"], client["side"]) == ("error", 408, "client")
    with socket.socket() as closed:  # a port nothing listens on: the upstream refuses the connection
        closed.bind(("127.0.0.2", 0))
        port = closed.getsockname()[1]
    async with make_gate(allow=(f"{LISTED}:{port}",), allow_private=LOOPBACK, resolver=RESOLVER) as gate:
        await exchange(gate.proxy, get(LISTED, port, "/"), 3)
        await eventually(lambda: len(gate.records()) == 1, what="the failure's line")
        (upstream,) = gate.records()
    assert (upstream["decision"], upstream["status"], upstream["side"]) == ("error", 502, "upstream")


async def test_a_fault_of_the_gate_is_answered_through_answer_on_neither_side(
        make_gate: GateFactory, stub: StubUpstream, monkeypatch: pytest.MonkeyPatch) -> None:
    async with make_gate() as gate:
        def broken(*args: object) -> None:
            raise RuntimeError("policy exploded")

        monkeypatch.setattr(type(gate.gate.config.messages_policy), "decide", broken)
        response = await exchange(gate.api, messages_request({"model": "m", "max_tokens": 1, "messages": []}), 2)
        (line,) = gate.records()
    status, headers = parse_head(response)
    assert (status, headers["x-deny-reason"]) == (500, "internal gate error"), "the exception stays in the audit"
    assert (line["decision"], line["status"], "side" in line) == ("error", 500, False)
    assert line["reason"].endswith("gate error: RuntimeError: policy exploded")
