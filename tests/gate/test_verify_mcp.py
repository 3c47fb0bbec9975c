"""verify's MCP round (``claude_bottle.verify.mcp_attacks``) against a gate on loopback: the MCP stand-in
(``claude_bottle.verify.mcp_server``, run as a process as verify runs it in its container) behind a real gate
with the server's tool rules and credential route, the round's script run with bash and curl as in the bottle.
Every attack is blocked by the gate as it is; a gate without the server's tool rules lets the rule attacks
through, and the round says so."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import os
import shutil
import ssl
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trustme

from claude_bottle.gate.resolver import StaticResolver
from claude_bottle.gate.routes import CredentialRoute, RouteSpec, Scheme, new_sentinel
from claude_bottle.stub import StubUpstream
from claude_bottle.verify import mcp_attacks, mcp_server
from claude_bottle.verify.attack import Outcome
from claude_bottle.verify.mcp_attacks import ROUND, Sent
from tests.conftest import GateFactory
from tests.gate.test_inspection import StandInCA

pytestmark = pytest.mark.asyncio
TRACKER, OTHER, ADDRESS = "tracker.test", "inspected.test", "127.0.0.2"
VALUE = "verify-mcp-value-" + "R" * 24


@dataclass
class StandIns:
    """The MCP stand-in's process and port, the other inspected host (a stub), their CA's file."""

    server: asyncio.subprocess.Process
    port: int
    other: StubUpstream
    ca_file: Path

    async def logged(self) -> list[dict[str, Any]]:
        """What both logged: the MCP stand-in's JSON lines (it is stopped first), the stub's requests."""
        self.server.terminate()
        output, _ = await asyncio.wait_for(self.server.communicate(), 10)
        lines = [json.loads(line) for line in output.decode().splitlines() if line.startswith("{")]
        return lines + [{"method": r.method, "target": r.target, "headers": [[n.decode(), v.decode()]
                                                                             for n, v in r.headers]}
                        for r in self.other.requests]


@contextlib.asynccontextmanager
async def stand_ins(tmp_path: Path) -> AsyncIterator[StandIns]:
    ca = trustme.CA()
    pem, ca_file = tmp_path / "tracker.pem", tmp_path / "ca.pem"
    leaf = ca.issue_cert(TRACKER)
    pem.write_bytes(b"".join(b.bytes() for b in leaf.cert_chain_pems) + leaf.private_key_pem.bytes())
    ca.cert_pem.write_to_path(str(ca_file))
    other_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ca.issue_cert(OTHER).configure_cert(other_context)
    server = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "claude_bottle.verify.mcp_server", "--listen", f"{ADDRESS}:0", "--log", "--tls", str(pem),
        stdout=asyncio.subprocess.PIPE, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    try:
        assert server.stdout is not None
        first = (await asyncio.wait_for(server.stdout.readline(), 30)).decode()
        assert first.startswith(mcp_server.SERVING), first
        async with StubUpstream(ADDRESS, tls=other_context) as other:
            yield StandIns(server, int(first.rsplit(":", 1)[1]), other, ca_file)
    finally:
        if server.returncode is None:
            server.kill()
            await server.wait()


async def round_through(make_gate: GateFactory, tmp_path: Path, rules: bool = True) -> list[Outcome]:
    """The round sent through a gate in front of the stand-ins (with the server's tool rules, or without),
    judged."""
    async with stand_ins(tmp_path) as found:
        route = CredentialRoute(RouteSpec("verify-tracker", ((TRACKER, found.port),), Scheme.BEARER, "",
                                          new_sentinel("verify-tracker")), VALUE)
        resolver = StaticResolver({name: [ipaddress.ip_address(ADDRESS)] for name in (TRACKER, OTHER)})
        servers = (f"verify-tracker {TRACKER}:{found.port} tools=search_*,get_issue deny_tools=delete_*",)
        async with make_gate(allow=(f"{OTHER}:{found.other.port}", f"{TRACKER}:{found.port}"),
                             allow_private=(f"{ADDRESS}/32",), resolver=resolver, ca=StandInCA(),
                             extra_ca=(str(found.ca_file),), routes=(route,),
                             mcp_servers=servers if rules else ()) as gate:
            sent = Sent(TRACKER, found.port, ADDRESS, f"{OTHER}:{found.other.port}", route.spec.sentinel, VALUE)
            proxy = f"http://{gate.proxy.host}:{gate.proxy.port}"
            environment = {"PATH": os.environ.get("PATH", ""), "https_proxy": proxy, "http_proxy": proxy}
            done = await asyncio.to_thread(subprocess.run, ["bash", "-c", mcp_attacks.script(ROUND, sent)],
                                           capture_output=True, text=True, env=environment, timeout=120)
        return mcp_attacks.judged(sent, done.stdout, await found.logged())


needs_curl = pytest.mark.skipif(shutil.which("curl") is None, reason="the round is sent with curl, not installed here")


@needs_curl
async def test_the_gate_blocks_every_attack_of_the_round(make_gate: GateFactory, tmp_path: Path) -> None:
    outcomes = await round_through(make_gate, tmp_path)
    assert [(o.attack, o.actual) for o in outcomes if not o.blocked] == []
    assert len(outcomes) == len(ROUND)
    assert outcomes[0].actual.startswith("arrived with the route's value")


@needs_curl
async def test_a_gate_without_the_tool_rules_fails_the_round(make_gate: GateFactory, tmp_path: Path) -> None:
    outcomes = await round_through(make_gate, tmp_path, rules=False)
    leaked = {o.attack for o in outcomes if not o.blocked}
    assert outcomes[0].blocked, "the control still arrives: the refusals that remain prove something"
    refused_anyway = {"delete_issue sent to the server's address", "delete_issue sent in plain HTTP through the proxy"}
    assert leaked == {a.name for a in ROUND if "delete_issue" in a.name or a.name.startswith(("tools/list", "malformed"))
                      } - refused_anyway
    assert all("the server got it" in o.actual or "offered delete_issue" in o.actual for o in outcomes
               if not o.blocked), outcomes
