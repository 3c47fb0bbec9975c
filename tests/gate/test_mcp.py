"""A remote MCP server behind a real gate: a real server from the official SDK (``mcp``) over HTTPS on
loopback, recording every request it receives and accepting only the real token. Tool calls are judged by
the server's tool rules, tool lists are cut to them, anything but well-formed JSON-RPC is refused, and the
token the server needs is the gate's (the bottle holds a sentinel)."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import trustme
import uvicorn

from claude_bottle.gate.resolver import StaticResolver
from claude_bottle.gate.routes import CredentialRoute, RouteSpec, Scheme, new_sentinel
from claude_bottle.policy.mcp import POLICY_ERROR
from tests.conftest import GateFactory, RunningGate
from tests.gate.test_inspection import StandInCA, response
from tests.helpers import connect_via, eventually
from tests.mcp_tracker import app, recording

pytestmark = pytest.mark.asyncio

HOST, OTHER = "mcp.example.test", "other.example.test"
TOKEN = "mcp-real-token-" + "Q" * 32  # what the server accepts; only the gate holds it


@dataclass
class McpUpstream:
    port: int
    ca_file: Path
    seen: list[dict[str, Any]] = field(default_factory=list)  # every request: method, path, authorization, body
    route: CredentialRoute | None = None

    @property
    def target(self) -> str:
        return f"{HOST}:{self.port}"

    def calls(self) -> list[str]:
        """The tools/call names the server received."""
        bodies = [b for r in self.seen for b in (r["body"] if isinstance(r["body"], list) else [r["body"]])]
        return [b["params"]["name"] for b in bodies if isinstance(b, dict) and b.get("method") == "tools/call"]


@pytest.fixture(params=["sse", "json"])
async def mcp_upstream(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[McpUpstream]:
    """The SDK's streamable HTTP server (answering in SSE, or in JSON), behind a recorder that refuses any
    request without the real token, over HTTPS with a private CA the gate trusts."""
    ca = trustme.CA()
    cert = ca.issue_cert(HOST, OTHER)
    cert_file, key_file, ca_file = tmp_path / "cert.pem", tmp_path / "key.pem", tmp_path / "ca.pem"
    cert.cert_chain_pems[0].write_to_path(str(cert_file))
    cert.private_key_pem.write_to_path(str(key_file))
    ca.cert_pem.write_to_path(str(ca_file))
    sock = socket.socket()
    sock.bind(("127.0.0.2", 0))
    upstream = McpUpstream(sock.getsockname()[1], ca_file)

    def record(request: dict[str, Any]) -> None:
        body = request["body"]
        try:
            parsed = json.loads(body) if body else None
        except ValueError:
            parsed = body.decode("utf-8", "replace")
        upstream.seen.append({"method": request["method"], "path": request["path"],
                              "authorization": request["authorization"], "body": parsed})

    recorder = recording(app(json_response=request.param == "json"), f"Bearer {TOKEN}", record)
    server = uvicorn.Server(uvicorn.Config(recorder, log_level="warning", lifespan="on",
                                           ssl_certfile=str(cert_file), ssl_keyfile=str(key_file)))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    await eventually(lambda: server.started, what="the MCP server listening")
    try:
        yield upstream
    finally:
        server.should_exit = True
        await task


def route(upstream: McpUpstream) -> CredentialRoute:
    """The server's route, the same for the whole test (its sentinel is made once)."""
    if upstream.route is None:
        upstream.route = CredentialRoute(RouteSpec("tracker", ((HOST, upstream.port),), Scheme.BEARER, "",
                                                   new_sentinel("tracker")), TOKEN)
    return upstream.route


def gate_for(make_gate: GateFactory, upstream: McpUpstream, ca: StandInCA, rules: str = "tools=search_*,get_issue",
             **kwargs: Any) -> Any:
    resolver = StaticResolver({name: [ipaddress.ip_address("127.0.0.2")] for name in (HOST, OTHER)})
    return make_gate(allow=(f"{OTHER}:{upstream.port}",), allow_private=("127.0.0.0/8",), resolver=resolver, ca=ca,
                     extra_ca=(str(upstream.ca_file),), routes=(route(upstream),),
                     mcp_servers=(f"tracker {upstream.target} {rules} deny_tools=delete_*",), **kwargs)


def post(target: str, payload: Any, sentinel: str = "", raw: bytes | None = None, method: str = "POST",
         header: str = "Authorization: Bearer") -> bytes:
    body = raw if raw is not None else json.dumps(payload).encode()
    auth = f"{header} {sentinel}\r\n" if sentinel else ""
    return (f"{method} /mcp HTTP/1.1\r\nHost: {target}\r\nContent-Type: application/json\r\n"
            f"Accept: application/json, text/event-stream\r\nMCP-Protocol-Version: 2025-06-18\r\n{auth}"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body


async def exchange(gate: RunningGate, ca: StandInCA, target: str, request: bytes) -> tuple[int, dict[str, str], Any]:
    """One request through a tunnel the gate terminates; the answer's JSON-RPC (from JSON or SSE)."""
    status, _, reader, writer = await connect_via(gate.proxy, target)
    assert status == 200
    await writer.start_tls(ca.client_context(), server_hostname=target.split(":")[0])
    writer.write(request)
    try:
        code, headers, body = await response(reader)
    finally:
        writer.close()
    if headers.get("content-type", "").startswith("text/event-stream"):
        data = [line[5:].strip() for line in body.decode().splitlines() if line.startswith("data:")]
        return code, headers, json.loads(data[0]) if data else None
    return code, headers, json.loads(body) if body and headers.get("content-type") == "application/json" else body


def call(ident: int, tool: str, arguments: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": ident, "method": "tools/call",
            "params": {"name": tool, "arguments": arguments or {"number": 7}}}


async def test_an_allowed_call_reaches_the_server_with_the_real_token_and_a_refused_one_never_does(
        make_gate: GateFactory, mcp_upstream: McpUpstream) -> None:
    ca, sentinel = StandInCA(), route(mcp_upstream).spec.sentinel
    async with gate_for(make_gate, mcp_upstream, ca) as gate:
        target = mcp_upstream.target
        allowed = await exchange(gate, ca, target, post(target, call(1, "get_issue"), sentinel))
        denied = await exchange(gate, ca, target, post(target, call(2, "delete_issue"), sentinel))
        unlisted = await exchange(gate, ca, target, post(target, call(3, "close_issue"), sentinel))
        records = [r for r in gate.records() if r["method"] == "POST"]
        calls = [r for r in gate.records() if r["listener"] == "mcp"]
    assert allowed[0] == 200 and allowed[2]["result"]["content"][0]["text"] == "issue 7 is open"
    assert mcp_upstream.calls() == ["get_issue"], "the refused calls never reached the server"
    assert [r["authorization"] for r in mcp_upstream.seen] == [f"Bearer {TOKEN}"]
    for (status, _, answer), ident, rule in ((denied, 2, "deny_tools 'delete_*'"), (unlisted, 3, "tools list")):
        assert status == 200 and answer["id"] == ident and answer["error"]["code"] == POLICY_ERROR
        assert "claude-bottle policy" in answer["error"]["message"] and rule in answer["error"]["message"]
    assert [r["decision"] for r in records] == ["allow", "deny", "deny"]
    assert records[1]["rule"] == "[mcp.servers.tracker] deny_tools delete_*"
    assert [(c["tool"], c["decision"]) for c in calls] == [("get_issue", "allow"), ("delete_issue", "deny"),
                                                           ("close_issue", "deny")], "one line per call"
    assert {k: v for k, v in calls[1].items() if k not in ("time", "client", "seq")} == {
        "version": 2, "listener": "mcp", "method": "tools/call", "target": target, "decision": "deny",
        "reason": records[1]["reason"], "status": 200, "path": "/mcp",
        "rule": "[mcp.servers.tracker] deny_tools delete_*", "server": "tracker", "tool": "delete_issue"}


async def test_the_tool_list_lacks_the_tools_that_cannot_be_called(make_gate: GateFactory,
                                                                   mcp_upstream: McpUpstream) -> None:
    ca = StandInCA()
    async with gate_for(make_gate, mcp_upstream, ca) as gate:
        target = mcp_upstream.target
        status, _, answer = await exchange(gate, ca, target, post(target, {"jsonrpc": "2.0", "id": 1,
                                                                           "method": "tools/list"}))
        everything = await exchange(gate, ca, target, post(target, {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}))
    assert status == 200
    assert [t["name"] for t in answer["result"]["tools"]] == ["search_issues", "get_issue"]
    assert everything[2] == answer | {"id": 2}


async def test_a_batch_with_a_refused_call_is_answered_by_the_gate_whole(make_gate: GateFactory,
                                                                        mcp_upstream: McpUpstream) -> None:
    ca = StandInCA()
    async with gate_for(make_gate, mcp_upstream, ca) as gate:
        target = mcp_upstream.target
        status, _, answer = await exchange(gate, ca, target, post(target, [
            call(1, "get_issue"), call(2, "delete_issue"),
            {"jsonrpc": "2.0", "method": "notifications/initialized"}]))
        notified = await exchange(gate, ca, target, post(target, {"jsonrpc": "2.0", "method": "tools/call",
                                                                  "params": {"name": "delete_issue"}}))
        calls = [r for r in gate.records() if r["listener"] == "mcp"]
    assert mcp_upstream.seen == [], "nothing of a batch with a refused call reaches the server"
    assert status == 200 and [a["id"] for a in answer] == [1, 2]
    assert "not sent" in answer[0]["error"]["message"] and answer[1]["error"]["code"] == POLICY_ERROR
    assert notified[0] == 403, "a refused notification has no id to answer: refused outright"
    assert [(c["method"], c.get("tool"), c["decision"], c.get("rule")) for c in calls] == [
        ("tools/call", "get_issue", "deny", None),
        ("tools/call", "delete_issue", "deny", "[mcp.servers.tracker] deny_tools delete_*"),
        ("notifications/initialized", None, "deny", None),
        ("tools/call", "delete_issue", "deny", "[mcp.servers.tracker] deny_tools delete_*")], "a line per message"
    assert calls[0]["reason"].startswith("not sent: its request was refused: MCP tool delete_issue")
    assert [c["status"] for c in calls] == [200, 200, 200, 403]


@pytest.mark.parametrize("mcp_upstream", ["json"], indirect=True)
async def test_anything_but_well_formed_json_rpc_is_refused(make_gate: GateFactory, mcp_upstream: McpUpstream) -> None:
    ca = StandInCA()
    attempts = {
        "not JSON": post("", None, raw=b"name=delete_issue"),
        "no jsonrpc member": post("", {"id": 1, "method": "tools/call", "params": {"name": "get_issue"}}),
        "a call without a tool name": post("", {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {}}),
        "an id that is an object": post("", {"jsonrpc": "2.0", "id": {}, "method": "tools/list"}),
        "an empty batch": post("", []),
        "params that are a string": post("", {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": "x"}),
        "a PUT": post("", call(1, "get_issue"), method="PUT"),
        # Read strictly: Python keeps the last of two keys, a server may keep the first and run delete_issue.
        "a duplicate tool name": post("", None, raw=b'{"jsonrpc": "2.0", "id": 1, "method": "tools/call", '
                                      b'"params": {"name": "delete_issue", "name": "get_issue"}}'),
        "NaN": post("", None, raw=b'{"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"n": NaN}}'),
    }
    async with gate_for(make_gate, mcp_upstream, ca) as gate:
        target = mcp_upstream.target
        answers = {name: await exchange(gate, ca, target, request.replace(b"Host: \r\n", f"Host: {target}\r\n".encode()))
                   for name, request in attempts.items()}
        records = [r for r in gate.records() if r["method"] in ("POST", "PUT")]
    assert mcp_upstream.seen == []
    assert {name: answer[0] for name, answer in answers.items()} == {
        name: 405 if name == "a PUT" else 400 for name in attempts}
    assert all(r["decision"] == "deny" and "MCP server tracker" in r["reason"] for r in records)


@pytest.mark.parametrize("mcp_upstream", ["json"], indirect=True)
async def test_a_held_secret_in_a_tool_argument_is_refused_even_escaped(make_gate: GateFactory,
                                                                         mcp_upstream: McpUpstream) -> None:
    ca = StandInCA()
    sentinel = route(mcp_upstream).spec.sentinel
    escaped = "".join(f"\\u{ord(c):04x}" for c in sentinel)  # JSON escapes: the raw bytes hold no sentinel
    async with gate_for(make_gate, mcp_upstream, ca) as gate:
        target = mcp_upstream.target
        plain = await exchange(gate, ca, target, post(target, call(1, "search_issues", {"query": sentinel})))
        hidden = await exchange(gate, ca, target, post("", None, raw=(
            '{"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "search_issues", '
            f'"arguments": {{"query": "{escaped}"}}}}}}').encode()).replace(b"Host: \r\n", f"Host: {target}\r\n".encode()))
        to_other = await exchange(gate, ca, f"{OTHER}:{mcp_upstream.port}", post(
            f"{OTHER}:{mcp_upstream.port}", call(3, "get_issue"), sentinel))
        other_name = await exchange(gate, ca, target, post(target, call(4, "get_issue"), sentinel, header="X-Token:"))
        as_name = await exchange(gate, ca, target, post(target, call(5, sentinel)))
        in_method = await exchange(gate, ca, target, post(target, {"jsonrpc": "2.0", "id": 6, "method": sentinel}))
        audit = gate.records()
    assert mcp_upstream.seen == [], "the sentinel reached no server: not in arguments, not to another host"
    for status, _, answer in (as_name, in_method):
        assert status == 200 and "DLP rule held-secret" in answer["error"]["message"]
    assert sentinel not in json.dumps(audit), "a name the client chose is audited as [redacted] if it is a secret"
    assert [(c["method"], c.get("tool")) for c in audit if c["listener"] == "mcp"][-2:] == [
        ("tools/call", "[redacted]"), ("[redacted]", None)]
    for status, _, answer in (plain, hidden):
        assert status == 200 and answer["error"]["code"] == POLICY_ERROR and "DLP rule held-secret" in \
            answer["error"]["message"]
    assert to_other[0] == 403
    assert other_name[0] == 403, "the sentinel under another header name to the server itself"


@pytest.mark.parametrize("mcp_upstream", ["json"], indirect=True)
async def test_a_lone_surrogate_in_a_call_is_judged_not_a_fault_of_the_gate(make_gate: GateFactory,
                                                                             mcp_upstream: McpUpstream) -> None:
    ca = StandInCA()
    async with gate_for(make_gate, mcp_upstream, ca) as gate:
        target = mcp_upstream.target
        raw = b'{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "search_issues", ' \
              b'"arguments": {"query": "\\ud800"}}}'
        await exchange(gate, ca, target, post(target, None, raw=raw))
        request = next(r for r in gate.records() if r["method"] == "POST")
    assert request["decision"] != "error" and "gate error" not in request["reason"], request
    assert mcp_upstream.calls() == ["search_issues"], "valid JSON, an allowed tool: judged and sent"


@pytest.mark.parametrize("mcp_upstream", ["sse"], indirect=True)
async def test_the_sdk_client_through_the_gate_sees_the_allowed_tools_and_the_policy_error(
        make_gate: GateFactory, mcp_upstream: McpUpstream) -> None:
    """The SDK's own client, as an MCP host in the bottle would talk: initialize, list, call."""
    import httpx2
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    ca = StandInCA()
    sentinel = route(mcp_upstream).spec.sentinel
    async with gate_for(make_gate, mcp_upstream, ca) as gate:
        context = ca.client_context()
        proxy = f"http://{gate.proxy.host}:{gate.proxy.port}"
        client = httpx2.AsyncClient(proxy=proxy, verify=context, headers={"Authorization": f"Bearer {sentinel}"},
                                    timeout=10)
        async with contextlib.AsyncExitStack() as stack:
            await stack.enter_async_context(client)
            streams = await stack.enter_async_context(
                streamable_http_client(f"https://{mcp_upstream.target}/mcp", http_client=client))
            session = await stack.enter_async_context(ClientSession(streams[0], streams[1]))
            await session.initialize()
            listed = await session.list_tools()
            allowed = await session.call_tool("search_issues", {"query": "bug"})
            with pytest.raises(Exception, match="claude-bottle policy"):
                await session.call_tool("delete_issue", {"number": 1})
    assert [t.name for t in listed.tools] == ["search_issues", "get_issue"]
    assert "found: bug" in str(allowed.content)
    assert "delete_issue" not in mcp_upstream.calls()
