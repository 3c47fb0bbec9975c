"""Ask mode on a gate on loopback: held requests, the host's answers on the control channel, the timeout, the
limit, shared questions, and the API route beside them.

Targets live on 127.0.0.2 under names the gate resolves with a static resolver (the stub Messages API holds
127.0.0.1, which the gate protects as its credential route's host).
"""

from __future__ import annotations

import asyncio
import io
import ipaddress
import json
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from claude_bottle.credentials import Credential
from claude_bottle.gate import control
from claude_bottle.gate.options import GateOptions
from claude_bottle.gate.resolver import StaticResolver
from claude_bottle.gate.server import run_ca
from claude_bottle.gate.settings import Endpoint
from claude_bottle.stub import StubUpstream
from tests.conftest import GateFactory, RunningGate
from tests.helpers import connect_via, eventually, exchange, make_token, parse_head

pytestmark = pytest.mark.asyncio
LOOPBACK = ("127.0.0.0/8",)
HOSTS = [f"h{n}.ask.test" for n in range(20)]
HOST = HOSTS[0]
RESOLVER = StaticResolver({**{host: [ipaddress.ip_address("127.0.0.2")] for host in HOSTS},
                           "metadata.ask.test": [ipaddress.ip_address("169.254.169.254")]})


@pytest.fixture
async def target() -> AsyncIterator[StubUpstream]:
    async with StubUpstream("127.0.0.2") as server:
        yield server


@pytest.fixture
def socket_path(tmp_path: Path) -> Path:
    return tmp_path / "control.sock"


def get(host: str, port: int, path: str = "/v1/models", body: bytes = b"") -> bytes:
    method = "POST" if body else "GET"
    return (f"{method} http://{host}:{port}{path} HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: close\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body


async def ask(path: Path, op: str, **fields: str) -> dict[str, Any]:
    return await asyncio.to_thread(control.request, path, op, **fields)


async def pending(path: Path, count: int = 1, timeout: float = 5.0) -> list[dict[str, Any]]:
    """The pending questions once there are ``count`` of them."""
    deadline = time.monotonic() + timeout
    while True:
        reply = await ask(path, "pending")
        assert reply["ok"], reply
        if len(reply["pending"]) >= count or time.monotonic() > deadline:
            return list(reply["pending"])
        await asyncio.sleep(0.02)


def asking(make_gate: GateFactory, socket_path: Path, **options: Any) -> Any:
    return make_gate(ask=True, control_socket=socket_path, allow_private=LOOPBACK, resolver=RESOLVER, **options)


def lines(gate: RunningGate, listener: str) -> list[dict[str, Any]]:
    return [r for r in gate.records() if r["listener"] == listener]


async def test_a_held_request_goes_on_once_the_host_allows_it_and_the_target_stays_allowed_for_the_run(
        make_gate: GateFactory, target: StubUpstream, socket_path: Path) -> None:
    async with asking(make_gate, socket_path) as gate:
        held = asyncio.ensure_future(exchange(gate.proxy, get(HOST, target.port, "/v1/models?token=q"), 10))
        (question,) = await pending(socket_path)
        assert not held.done() and target.requests == []
        assert {k: question[k] for k in ("host", "port", "kind", "method", "path", "waiting")} == {
            "host": HOST, "port": target.port, "kind": "http", "method": "GET", "path": "/v1/models", "waiting": 1}
        reply = await ask(socket_path, "decide", id=question["id"], answer="allow-once", by="terminal")
        assert {k: reply[k] for k in ("ok", "message", "entry")} == {
            "ok": True, "message": f"allow-once {HOST}:{target.port}", "entry": f"{HOST}:{target.port}"}
        assert f"{HOST}:{target.port}" in reply["policy"]["allow"] and reply["policy"]["ask"] is True
        assert parse_head(await held)[0] == 200
        again = await exchange(gate.proxy, get(HOST, target.port), 3)  # allowed for the run: not asked again
        assert parse_head(again)[0] == 200 and (await pending(socket_path, 0)) == []
    asked, answered = lines(gate, "ask")
    assert (asked["decision"], asked["method"], asked["ask"]) == ("ask", "ASK", question["id"])
    assert (answered["decision"], answered["answer"], answered["by"]) == ("allow", "allow-once", "terminal")
    first = lines(gate, "proxy")[0]
    assert first["decision"] == "allow" and first["status"] == 200
    assert (first["ask"], first["answer"], first["by"]) == (question["id"], "allow-once", "terminal")
    assert "approved by the user (allow-once by terminal" in first["reason"]


async def test_a_denied_target_is_refused_with_the_reason_and_stays_refused_for_the_run(
        make_gate: GateFactory, target: StubUpstream, socket_path: Path) -> None:
    async with asking(make_gate, socket_path) as gate:
        held = asyncio.ensure_future(connect_via(gate.proxy, f"{HOST}:443"))
        (question,) = await pending(socket_path)
        assert question["kind"] == "connect" and question["method"] is None and question["path"] is None
        await ask(socket_path, "decide", id=question["id"], answer="deny-always", by="hook")
        status, headers, _, writer = await held
        writer.close()
        assert status == 403 and "refused by the user when asked (deny-always by hook)" in headers["x-deny-reason"]
        response = await exchange(gate.proxy, get(HOST, 443), 3)
        assert parse_head(response)[0] == 403 and "denied by the user" in parse_head(response)[1]["x-deny-reason"]
        assert await pending(socket_path, 0) == []
    assert target.requests == []
    assert [r["by"] for r in lines(gate, "ask") if "by" in r] == ["hook"]


async def test_a_held_connect_gets_its_200_once_allowed_and_port_80_stays_refused(
        make_gate: GateFactory, target: StubUpstream, socket_path: Path) -> None:
    async with asking(make_gate, socket_path) as gate:
        for authority, expected in ((f"{HOST}:{target.port}", 200), (f"{HOSTS[1]}:80", 403)):
            held = asyncio.ensure_future(connect_via(gate.proxy, authority))
            (question,) = await pending(socket_path)
            await ask(socket_path, "decide", id=question["id"], answer="allow-once", by="terminal")
            status, headers, _, writer = await held
            writer.close()
            assert status == expected, headers
        assert "CONNECT to port 80 is refused" in headers["x-deny-reason"]


async def test_no_answer_within_the_timeout_refuses_saying_so_and_a_later_request_asks_again(
        make_gate: GateFactory, target: StubUpstream, socket_path: Path) -> None:
    async with asking(make_gate, socket_path, ask_timeout=1.0) as gate:
        started = time.monotonic()
        response = await exchange(gate.proxy, get(HOST, target.port), 5)
        assert 0.9 < time.monotonic() - started < 3
        status, headers = parse_head(response)
        assert status == 403 and "the approval timed out: nobody answered within 1s" in headers["x-deny-reason"]
        later = asyncio.ensure_future(exchange(gate.proxy, get(HOST, target.port), 5))
        assert len(await pending(socket_path)) == 1
        await later
    assert target.requests == []
    timed_out = [r for r in lines(gate, "ask") if r.get("by") == "timeout"]
    assert len(timed_out) == 2 and all(r["decision"] == "deny" for r in timed_out)
    assert lines(gate, "proxy")[0]["by"] == "timeout"


async def test_identical_targets_share_one_question_and_one_answer_releases_them_all(
        make_gate: GateFactory, target: StubUpstream, socket_path: Path) -> None:
    async with asking(make_gate, socket_path) as gate:
        held = [asyncio.ensure_future(exchange(gate.proxy, get(HOST, target.port, f"/v1/models?n={n}"), 10))
                for n in range(3)]
        deadline = time.monotonic() + 5
        while True:
            questions = await pending(socket_path)
            if questions[0]["waiting"] == 3 or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.02)
        assert len(questions) == 1 and questions[0]["waiting"] == 3
        await ask(socket_path, "decide", id=questions[0]["id"], answer="allow-once", by="terminal")
        assert [parse_head(r)[0] for r in await asyncio.gather(*held)] == [200, 200, 200]
    assert len([r for r in lines(gate, "ask") if r["decision"] == "ask"]) == 1


async def test_over_the_limit_a_new_target_is_refused_at_once_and_the_api_route_is_not_slowed(
        make_gate: GateFactory, target: StubUpstream, socket_path: Path) -> None:
    async with asking(make_gate, socket_path, ask_limit=16) as gate:
        held = [asyncio.ensure_future(exchange(gate.proxy, get(host, target.port), 10)) for host in HOSTS[:16]]
        assert len(await pending(socket_path, 16)) == 16
        started = time.monotonic()
        response = await exchange(gate.proxy, get(HOSTS[16], target.port), 3)
        assert time.monotonic() - started < 1
        assert parse_head(response)[0] == 403
        assert "16 destinations already wait for the user's approval" in parse_head(response)[1]["x-deny-reason"]
        api = (f"GET /v1/models HTTP/1.1\r\nHost: {gate.api.host}\r\nConnection: close\r\n\r\n").encode()
        started = time.monotonic()
        assert parse_head(await exchange(gate.api, api, 3))[0] == 200
        assert time.monotonic() - started < 0.5
        for question in await pending(socket_path, 16):
            await ask(socket_path, "decide", id=question["id"], answer="deny-once", by="terminal")
        await asyncio.gather(*held)
    limited = [r for r in lines(gate, "proxy") if r.get("by") == "limit"]
    assert len(limited) == 1 and limited[0]["answer"] == "deny-once" and "ask" not in limited[0]


@pytest.mark.parametrize("host", ["169.254.169.254", "127.0.0.1"])
async def test_an_address_the_guard_refuses_is_never_asked(
        make_gate: GateFactory, target: StubUpstream, stub: StubUpstream, socket_path: Path, host: str) -> None:
    async with make_gate(ask=True, control_socket=socket_path, resolver=RESOLVER) as gate:  # no allow_private
        port = stub.port if host == "127.0.0.1" else target.port
        response = await exchange(gate.proxy, get(host, port), 3)
        assert parse_head(response)[0] == 403
        assert await pending(socket_path, 0) == []
    assert lines(gate, "ask") == []


async def test_a_name_is_looked_up_only_once_the_user_allows_it(
        make_gate: GateFactory, target: StubUpstream, socket_path: Path) -> None:
    """The lookup alone would carry the name to its domain's DNS server, so a name waiting for an answer, or
    denied, is never looked up: else a bottle naming ``<data>.attacker.example`` exfiltrates by being asked
    about it. So a name is asked about before the address guard sees it, which then still refuses it."""
    resolver = StaticResolver(dict(RESOLVER.table))
    async with make_gate(ask=True, control_socket=socket_path, resolver=resolver) as gate:  # no allow_private
        denied = asyncio.ensure_future(exchange(gate.proxy, get(HOSTS[2], target.port), 10))
        allowed = asyncio.ensure_future(connect_via(gate.proxy, f"metadata.ask.test:{target.port}"))
        questions = {q["host"]: q for q in await pending(socket_path, 2)}
        assert set(questions) == {HOSTS[2], "metadata.ask.test"}
        assert resolver.calls == [], "nothing is looked up while the user is asked"
        await ask(socket_path, "decide", id=questions[HOSTS[2]]["id"], answer="deny-once", by="terminal")
        assert parse_head(await denied)[0] == 403
        assert resolver.calls == [], "nor once the user denied it"
        await ask(socket_path, "decide", id=questions["metadata.ask.test"]["id"], answer="allow-once", by="terminal")
        status, headers, _, writer = await allowed
        writer.close()
    assert resolver.calls == ["metadata.ask.test"]
    assert status == 403 and "169.254.169.254" in headers["x-deny-reason"], "the guard still refuses"
    assert target.requests == []


async def test_a_target_denied_while_the_gate_runs_is_refused_never_asked(
        make_gate: GateFactory, target: StubUpstream, socket_path: Path) -> None:
    async with asking(make_gate, socket_path) as gate:
        await ask(socket_path, "deny", entry=HOST)
        response = await exchange(gate.proxy, get(HOST, 80), 3)
        assert parse_head(response)[0] == 403
        assert await pending(socket_path, 0) == []


async def test_after_an_allow_dlp_still_applies(make_gate: GateFactory, target: StubUpstream,
                                                socket_path: Path) -> None:
    async with asking(make_gate, socket_path) as gate:
        held = asyncio.ensure_future(exchange(gate.proxy, get(HOST, target.port, "/up", f"t={gate.token}".encode()),
                                              10))
        (question,) = await pending(socket_path)
        await ask(socket_path, "decide", id=question["id"], answer="allow-always", by="terminal")
        response = await held
    assert parse_head(response)[0] == 403 and "[dlp]" in json.dumps(lines(gate, "proxy"))
    assert target.requests == []


async def test_a_watcher_sees_the_pending_questions_then_each_ask_and_answer(
        make_gate: GateFactory, target: StubUpstream, socket_path: Path) -> None:
    async with asking(make_gate, socket_path) as gate:
        first = asyncio.ensure_future(exchange(gate.proxy, get(HOSTS[1], target.port), 10))
        (question,) = await pending(socket_path)
        reader, writer = await asyncio.open_unix_connection(str(socket_path))
        writer.write(b'{"op": "watch"}\n')
        event = json.loads(await reader.readline())
        assert event["event"] == "asked" and event["id"] == question["id"] and event["host"] == HOSTS[1]
        second = asyncio.ensure_future(exchange(gate.proxy, get(HOSTS[2], target.port), 10))
        event = json.loads(await reader.readline())
        assert (event["event"], event["host"], event["kind"]) == ("asked", HOSTS[2], "http")
        await ask(socket_path, "decide", id=event["id"], answer="allow-once", by="notification")
        assert json.loads(await reader.readline()) == {"event": "decided", "id": event["id"],
                                                       "answer": "allow-once", "by": "notification"}
        await ask(socket_path, "decide", id=question["id"], answer="deny-once", by="terminal")
        assert json.loads(await reader.readline())["answer"] == "deny-once"
        writer.close()
        assert [parse_head(r)[0] for r in await asyncio.gather(first, second)] == [403, 200]


async def test_the_control_command_streams_events_until_its_standard_input_closes(
        make_gate: GateFactory, target: StubUpstream, socket_path: Path) -> None:
    async with asking(make_gate, socket_path) as gate:
        held = asyncio.ensure_future(exchange(gate.proxy, get(HOST, target.port), 10))
        (question,) = await pending(socket_path)
        read_end, write_end = os.pipe()
        out = io.StringIO()
        watching = asyncio.ensure_future(asyncio.to_thread(control.watch, socket_path, out, read_end))
        await eventually(out.getvalue, what="the first event")
        os.close(write_end)
        assert await asyncio.wait_for(watching, 5) == 0
        os.close(read_end)
        assert json.loads(out.getvalue().splitlines()[0])["id"] == question["id"]
        reply = await asyncio.to_thread(control.main, [str(socket_path), "decide", question["id"], "allow-once",
                                                       "terminal"])
        assert reply == 0 and parse_head(await held)[0] == 200
        # an empty ENTRY, as runtime/gate.py's control_gate always passes one, is no argument
        assert await asyncio.to_thread(control.main, [str(socket_path), "pending", ""]) == 0


async def test_a_stopping_gate_ends_its_watches(make_gate: GateFactory, socket_path: Path) -> None:
    async with asking(make_gate, socket_path):
        reader, writer = await asyncio.open_unix_connection(str(socket_path))
        writer.write(b'{"op": "watch"}\n')
        await asyncio.sleep(0.1)
        started = time.monotonic()
    assert await asyncio.wait_for(reader.read(), 1) == b""
    assert time.monotonic() - started < 1
    writer.close()


async def test_an_asking_gate_s_ca_certifies_the_names_it_may_be_asked_about() -> None:
    options = GateOptions(api_listen=Endpoint("127.0.0.1", 1), proxy_listen=Endpoint("127.0.0.1", 2),
                          credential=Credential.parse(make_token(), "t"), ask=True)
    ca = run_ca(options.settings())
    ca.context_for("pypi.org")  # an approved host's tunnel is terminated, so rules and DLP read it
    with pytest.raises(ValueError, match="not among the names"):
        ca.context_for("api.anthropic.com")


@pytest.mark.parametrize(("fields", "words"), [
    ({"id": "999", "answer": "allow-once", "by": "terminal"}, "no pending question '999'"),
    ({"id": "1", "answer": "maybe", "by": "terminal"}, "unknown answer 'maybe'"),
    ({"id": "1", "answer": "allow-once", "by": ""}, '"by" names who decided'),
])
async def test_a_decision_the_gate_cannot_take_is_an_error(make_gate: GateFactory, socket_path: Path,
                                                          fields: dict[str, str], words: str) -> None:
    async with asking(make_gate, socket_path):
        reply = await ask(socket_path, "decide", **fields)
    assert reply["ok"] is False and words in reply["error"]


async def test_a_gate_without_ask_mode_answers_its_operations_with_an_error(
        make_gate: GateFactory, socket_path: Path) -> None:
    async with make_gate(control_socket=socket_path):
        for op in ("pending", "watch", "decide"):
            reply = await ask(socket_path, op)
            assert reply["ok"] is False and "started without --ask" in reply["error"]
