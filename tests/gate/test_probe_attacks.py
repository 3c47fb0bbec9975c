"""verify's tunnel and listener attacks (claude_bottle.verify.gate_requests) against a gate on loopback: blocked by the gate
as it is, and reported as leaks when the protection they attack is absent."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
from collections.abc import AsyncIterator
from typing import Any

import pytest

from claude_bottle.gate.resolver import StaticResolver
from claude_bottle.stub import StubUpstream
from claude_bottle.verify import gate_requests
from tests.conftest import GateFactory

pytestmark = pytest.mark.asyncio
FRONT = "front.test"


@contextlib.asynccontextmanager
async def attacked(make_gate: GateFactory, raw_tcp: bool = False, **limits: float) -> AsyncIterator[dict[str, Any]]:
    """A gate whose allowlist holds FRONT (a stub on 127.0.0.2), and the probe's targets for it."""
    resolver = StaticResolver({FRONT: [ipaddress.ip_address("127.0.0.2")]})
    async with StubUpstream("127.0.0.2") as front:
        listed = (f"{FRONT}:{front.port}", FRONT)
        async with make_gate(allow=() if raw_tcp else listed, allow_tcp=listed if raw_tcp else (),
                             allow_private=("127.0.0.2/32",), resolver=resolver, **limits) as gate:
            yield {"gate": gate.proxy.host, "proxy_port": gate.proxy.port, "front_host": FRONT,
                   "front_port": front.port, "unlisted_host": "exfiltrate.example",
                   "header_timeout": limits.get("header_timeout", 5), "max_connections": limits.get("max_connections")}


@pytest.mark.parametrize("raw_tcp", [False, True])
async def test_domain_fronting_and_plain_bytes_in_a_tunnel(make_gate: GateFactory, raw_tcp: bool) -> None:
    async with attacked(make_gate, raw_tcp) as targets:
        fronted = await asyncio.to_thread(gate_requests.fronted_hello, targets)
        plain = await asyncio.to_thread(gate_requests.non_tls_in_tunnel, targets)
    if raw_tcp:  # no first-flight check there: the attacks get through, and say so
        assert not fronted[1] and "relayed: the upstream answered HTTP/1.1 400" in fronted[0]
        assert not plain[1] and "relayed" in plain[0]
    else:
        assert fronted[1] and "cut by the gate" in fronted[0], fronted
        assert plain[1] and "cut by the gate" in plain[0], plain


async def test_port_80_connect(make_gate: GateFactory) -> None:
    async with attacked(make_gate) as targets:
        actual, blocked, _ = await asyncio.to_thread(gate_requests.proxy_request, targets, gate_requests.connect(f"{FRONT}:80"))
    assert blocked and "403" in actual and "port 80" in actual


async def test_slow_head(make_gate: GateFactory) -> None:
    async with attacked(make_gate, header_timeout=0.5) as targets:
        actual, blocked = await asyncio.to_thread(gate_requests.slow_head, targets)
    assert blocked and "head deadline 0.5s" in actual


async def test_connection_flood(make_gate: GateFactory) -> None:
    async with attacked(make_gate, max_connections=8) as targets:
        outcome = await asyncio.to_thread(gate_requests.connection_flood, targets)
    assert outcome.blocked, outcome
    assert "16 refused with 503, 8 held" in outcome.actual and "403" in outcome.actual
