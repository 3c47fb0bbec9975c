"""Learn mode, the control channel and the refusals' text, on a gate on loopback.

Targets live on 127.0.0.2 (the stub Messages API holds 127.0.0.1, which the gate protects as its credential
route's host) under a name the gate resolves with a static resolver.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import ssl
import stat
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trustme

from claude_bottle.gate import control
from claude_bottle.gate.ca import RunCA
from claude_bottle.gate.failures import POLICY_FILE
from claude_bottle.gate.resolver import StaticResolver
from claude_bottle.policy.hosts import parse_pattern
from claude_bottle.stub import StubUpstream
from tests.conftest import GateFactory, RunningGate
from tests.helpers import connect_via, eventually, exchange, parse_head

pytestmark = pytest.mark.asyncio
LOOPBACK = ("127.0.0.0/8",)
HOST = "learn.example.test"
RESOLVER = StaticResolver({HOST: [ipaddress.ip_address("127.0.0.2")],
                           "metadata.example.test": [ipaddress.ip_address("169.254.169.254")]})


@pytest.fixture
async def target() -> AsyncIterator[StubUpstream]:
    async with StubUpstream("127.0.0.2") as server:
        yield server


def get(host: str, port: int, path: str = "/v1/models", method: str = "GET", body: bytes = b"") -> bytes:
    return (f"{method} http://{host}:{port}{path} HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: close\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body


def status_line(response: bytes) -> str:
    return response.split(b"\r\n", 1)[0].decode("latin-1")


def body(response: bytes) -> str:
    return response.split(b"\r\n\r\n", 1)[1].decode()


async def proxied(gate: RunningGate, request: bytes) -> bytes:
    return await exchange(gate.proxy, request, 3)


# ---- learn mode ------------------------------------------------------------------------------------------

async def test_learn_mode_lets_an_unlisted_destination_through_recorded_as_would_deny(
        make_gate: GateFactory, target: StubUpstream) -> None:
    async with make_gate(learn=True, allow_private=LOOPBACK, resolver=RESOLVER) as gate:
        response = await proxied(gate, get(HOST, target.port))
    assert parse_head(response)[0] == 200
    (record,) = gate.records()
    assert record["decision"] == "allow" and record["would_deny"] is True
    assert record["reason"].startswith(f"learn mode: {HOST}:{target.port} is not in the allowlist (would deny)")
    assert record["path"] == "/v1/models"


async def test_without_learn_mode_the_same_request_is_refused_and_no_line_says_would_deny(
        make_gate: GateFactory, target: StubUpstream) -> None:
    async with make_gate(allow_private=LOOPBACK, resolver=RESOLVER) as gate:
        response = await proxied(gate, get(HOST, target.port))
    assert parse_head(response)[0] == 403
    assert all("would_deny" not in r for r in gate.records())
    assert target.requests == []


@pytest.mark.parametrize(("host", "words"), [(HOST, "loopback"), ("metadata.example.test", "metadata")])
async def test_learn_mode_still_refuses_what_the_address_guard_refuses(
        make_gate: GateFactory, target: StubUpstream, host: str, words: str) -> None:
    async with make_gate(learn=True, resolver=RESOLVER) as gate:  # no allow_private
        response = await proxied(gate, get(host, target.port))
        status, headers, _, writer = await connect_via(gate.proxy, f"{host}:443")
        writer.close()
    for code, reason in ((parse_head(response)[0], parse_head(response)[1]["x-deny-reason"]),
                         (status, headers["x-deny-reason"])):
        assert code == 403 and words in reason and "not in the allowlist" not in reason
    assert target.requests == []


async def test_learn_mode_never_opens_the_api_host_to_the_proxy(make_gate: GateFactory, stub: StubUpstream) -> None:
    async with make_gate(learn=True, allow_private=LOOPBACK) as gate:
        status, headers, _, writer = await connect_via(gate.proxy, f"127.0.0.1:{stub.port}")
        writer.close()
        response = await proxied(gate, get("127.0.0.1", stub.port))
    assert status == 403 and "credential route" in headers["x-deny-reason"]
    assert parse_head(response)[0] == 403
    assert stub.requests == []


async def test_learn_mode_still_refuses_a_request_carrying_the_gate_s_credential(
        make_gate: GateFactory, target: StubUpstream) -> None:
    async with make_gate(learn=True, allow_private=LOOPBACK, resolver=RESOLVER) as gate:
        response = await proxied(gate, get(HOST, target.port, "/upload", "POST", f"token={gate.token}".encode()))
    assert parse_head(response)[0] == 403 and "[dlp]" in json.dumps(gate.records())
    assert gate.token.encode() not in response
    assert all(gate.token not in json.dumps(r) for r in target.requests)


async def test_a_learning_gate_s_ca_certifies_every_name_but_the_api_upstream() -> None:
    ca = RunCA.generate((), ("api.anthropic.com",), every_name=True)
    ca.context_for("registry.npmjs.org")
    ca.context_for("deep.below.example.org")
    with pytest.raises(ValueError, match="not among the names"):
        ca.context_for("api.anthropic.com")
    with pytest.raises(ValueError, match="not among the names"):
        ca.context_for("10.0.0.1")
    strict = RunCA.generate((parse_pattern("pypi.org"),), ("api.anthropic.com",))
    with pytest.raises(ValueError, match="not among the names"):
        strict.context_for("registry.npmjs.org")


# ---- the control channel ---------------------------------------------------------------------------------

async def ask(path: Path, op: str, entry: str = "") -> dict[str, object]:
    return await asyncio.to_thread(control.request, path, op, entry)


async def test_allow_then_deny_change_a_running_gate_at_once(make_gate: GateFactory, target: StubUpstream,
                                                           tmp_path: Path) -> None:
    socket_path = tmp_path / "control.sock"
    entry = f"{HOST}:{target.port}"
    async with make_gate(allow_private=LOOPBACK, resolver=RESOLVER, control_socket=socket_path) as gate:
        assert stat.S_IMODE(socket_path.stat().st_mode) == 0o600
        assert parse_head(await proxied(gate, get(HOST, target.port)))[0] == 403
        reply = await ask(socket_path, "allow", entry)
        assert reply["ok"] is True and reply["message"] == f"allowed {entry}"
        assert entry in reply["policy"]["allow"]  # type: ignore[index]
        assert parse_head(await proxied(gate, get(HOST, target.port)))[0] == 200
        reply = await ask(socket_path, "deny", entry)
        assert reply["ok"] is True and reply["policy"]["deny"] == [entry]  # type: ignore[index]
        refused = await proxied(gate, get(HOST, target.port))
        shown = await ask(socket_path, "show")
    assert parse_head(refused)[0] == 403 and "denied by the user" in parse_head(refused)[1]["x-deny-reason"]
    assert shown["policy"] == {"learn": False, "ask": False, "allow": [], "allow_tcp": [], "deny": [entry], "rules": []}
    assert len(target.requests) == 1
    changes = [r for r in gate.records() if r["listener"] == "control"]
    assert [(r["method"], r["target"], r["decision"]) for r in changes] == [("ALLOW", entry, "allow"),
                                                                          ("DENY", entry, "deny")]


async def test_deny_refuses_what_learn_mode_and_a_wider_pattern_would_let_through(
        make_gate: GateFactory, target: StubUpstream, tmp_path: Path) -> None:
    socket_path = tmp_path / "control.sock"
    async with make_gate(learn=True, allow=("*.example.test",), allow_private=LOOPBACK, resolver=RESOLVER,
                         control_socket=socket_path) as gate:
        assert (await ask(socket_path, "deny", f"{HOST}:{target.port}"))["ok"] is True
        response = await proxied(gate, get(HOST, target.port))
    assert parse_head(response)[0] == 403
    assert target.requests == []


@pytest.mark.parametrize(("op", "entry", "words"), [
    ("allow", "127.0.0.1", "API upstream"), ("allow", "*", "matches every host"), ("allow", "*.com", "public suffix"),
    ("allow", "http://x.example/", "not a URL"), ("drop", "x.example", "unknown operation"),
])
async def test_the_control_channel_refuses_what_the_allowlist_would_and_the_api_host(
        make_gate: GateFactory, tmp_path: Path, op: str, entry: str, words: str) -> None:
    socket_path = tmp_path / "control.sock"
    async with make_gate(control_socket=socket_path) as gate:
        reply = await ask(socket_path, op, entry)
        shown = await ask(socket_path, "show")
    assert reply["ok"] is False and words in str(reply["error"])
    assert shown["policy"]["allow"] == []  # type: ignore[index]
    assert [r for r in gate.records() if r["listener"] == "control"] == []


@pytest.mark.parametrize("line", [b"allow example.com", b"[" * 4000], ids=["not-json", "nested-too-deep"])
async def test_the_control_channel_answers_a_broken_request_with_an_error(make_gate: GateFactory,
                                                                         tmp_path: Path, line: bytes) -> None:
    socket_path = tmp_path / "control.sock"
    async with make_gate(control_socket=socket_path):
        reader, writer = await asyncio.open_unix_connection(str(socket_path))
        writer.write(line + b"\n")
        reply = json.loads(await asyncio.wait_for(reader.readline(), 5))
        writer.close()
    assert reply == {"ok": False, "error": "a request is one JSON object on one line"}


async def test_a_host_allowed_while_running_outside_the_ca_s_names_is_tunnelled_uninspected(
        make_gate: GateFactory, tmp_path: Path) -> None:
    upstream_ca = trustme.CA()
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    upstream_ca.issue_cert(HOST).configure_cert(server)
    ca = RunCA.generate((parse_pattern("pypi.org"),), ("127.0.0.1",))
    socket_path = tmp_path / "control.sock"
    async with StubUpstream("127.0.0.2", tls=server) as tls_target, \
            make_gate(allow=("pypi.org",), allow_private=LOOPBACK, resolver=RESOLVER, ca=ca,
                      control_socket=socket_path) as gate:
        assert (await ask(socket_path, "allow", f"{HOST}:{tls_target.port}"))["ok"] is True
        status, _, reader, writer = await connect_via(gate.proxy, f"{HOST}:{tls_target.port}")
        client = ssl.create_default_context()
        upstream_ca.configure_trust(client)  # the real server's certificate: the gate did not terminate
        await writer.start_tls(client, server_hostname=HOST)
        writer.write(f"GET /v1/models HTTP/1.1\r\nHost: {HOST}\r\nConnection: close\r\n\r\n".encode())
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        writer.close()
        await eventually(lambda: [r for r in gate.records() if r["method"] == "CONNECT"], what="the tunnel's line")
    assert status == 200 and parse_head(head)[0] == 200
    (line,) = [r for r in gate.records() if r["method"] == "CONNECT"]
    assert "not inspected: outside the names of the gate's CA" in line["reason"]


# ---- what a refusal says ---------------------------------------------------------------------------------

def assert_explained(reason: str, text: str, allow_hint: str | None) -> None:
    assert text.startswith(f"Blocked by the user's claude-bottle policy, not by the network: {reason}.")
    assert "ask the user" in text and POLICY_FILE in text
    if allow_hint:
        assert f"run `claude-bottle allow {allow_hint}` on the host" in text


async def test_a_refused_connect_says_why_in_its_status_phrase_header_and_body(
        make_gate: GateFactory, target: StubUpstream) -> None:
    async with make_gate(allow=("pypi.org",), allow_private=LOOPBACK, resolver=RESOLVER) as gate:
        response = await proxied(gate, f"CONNECT {HOST}:8443 HTTP/1.1\r\nHost: {HOST}:8443\r\n\r\n".encode())
    status, headers = parse_head(response)
    reason = f"{HOST}:8443 is not in the allowlist"
    assert status == 403 and headers["x-deny-reason"] == reason
    assert status_line(response) == f"HTTP/1.1 403 {reason}"
    assert_explained(reason, body(response), f"{HOST}:8443")
    assert gate.token not in response.decode("latin-1")


async def test_a_refused_plain_http_request_says_the_same(make_gate: GateFactory, target: StubUpstream) -> None:
    async with make_gate(allow=("pypi.org",), allow_private=LOOPBACK, resolver=RESOLVER) as gate:
        response = await proxied(gate, get(HOST, target.port))
    reason = f"{HOST}:{target.port} is not in the allowlist"
    assert parse_head(response)[1]["x-deny-reason"] == reason and status_line(response) == f"HTTP/1.1 403 {reason}"
    assert_explained(reason, body(response), f"{HOST}:{target.port}")


async def test_an_address_guard_refusal_says_what_the_user_can_change(make_gate: GateFactory,
                                                                     target: StubUpstream) -> None:
    async with make_gate(allow=(f"{HOST}:{target.port}",), resolver=RESOLVER) as gate:
        response = await proxied(gate, get(HOST, target.port))
    reason = parse_head(response)[1]["x-deny-reason"]
    assert "loopback" in reason and status_line(response) == f"HTTP/1.1 403 {reason}"
    assert_explained(reason, body(response), None)
    assert "allow_private in the agent file" in body(response)


async def test_a_refusal_on_the_api_listener_says_the_same_in_an_api_error(make_gate: GateFactory) -> None:
    async with make_gate() as gate:
        response = await exchange(gate.api, b"GET /v1/files HTTP/1.1\r\nHost: gate\r\nConnection: close\r\n\r\n", 3)
    status, headers = parse_head(response)
    reason = "/v1/files is not an allowed API path (add it with --allow-api-path)"
    assert status == 403 and headers["x-deny-reason"] == reason
    error = json.loads(body(response))["error"]
    assert error["type"] == "permission_error"
    assert_explained(reason, error["message"], None)
    assert gate.token not in response.decode("latin-1")


async def test_a_broken_request_is_not_called_a_policy_refusal(make_gate: GateFactory) -> None:
    async with make_gate() as gate:
        response = await proxied(gate, b"GET https://x.example/ HTTP/1.1\r\nHost: x.example\r\n\r\n")
    assert parse_head(response)[0] == 400
    assert body(response).strip() == "use CONNECT for https:// URLs"


async def test_the_control_socket_never_replaces_a_file_that_is_not_a_socket(make_gate: GateFactory,
                                                                           tmp_path: Path) -> None:
    from claude_bottle.errors import GateError

    precious = tmp_path / "notes.txt"
    precious.write_text("keep me")
    with pytest.raises(GateError, match="not a socket"):
        async with make_gate(control_socket=precious):
            pass
    assert precious.read_text() == "keep me"


async def test_requests_read_in_a_learned_tunnel_are_each_recorded_as_would_deny(make_gate: GateFactory,
                                                                                tmp_path: Path) -> None:
    upstream_ca = trustme.CA()
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    upstream_ca.issue_cert(HOST).configure_cert(server)
    upstream_ca.cert_pem.write_to_path(str(tmp_path / "upstream.pem"))
    ca = RunCA.generate((), ("127.0.0.1",), every_name=True)  # as a learning gate makes it
    async with StubUpstream("127.0.0.2", tls=server) as tls_target, \
            make_gate(learn=True, allow_private=LOOPBACK, resolver=RESOLVER, ca=ca,
                      extra_ca=(str(tmp_path / "upstream.pem"),)) as gate:
        status, _, reader, writer = await connect_via(gate.proxy, f"{HOST}:{tls_target.port}")
        client = ssl.create_default_context(cadata=ca.certificate_pem.decode())  # the gate's CA, not the server's
        await writer.start_tls(client, server_hostname=HOST)
        writer.write(f"GET /v1/models?limit=2 HTTP/1.1\r\nHost: {HOST}:{tls_target.port}\r\nConnection: close\r\n\r\n"
                     .encode())
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        writer.close()
        await eventually(lambda: len(gate.records()) == 2, what="the tunnel's and the request's lines")
    assert status == 200 and parse_head(head)[0] == 200
    inner, tunnel = sorted(gate.records(), key=lambda r: r["method"] == "CONNECT")
    assert inner["method"] == "GET" and inner["path"] == "/v1/models" and inner["would_deny"] is True
    assert tunnel["would_deny"] is True and "TLS terminated by the gate" in tunnel["reason"]
    assert inner["unlisted"] is True and tunnel["unlisted"] is True and tunnel["tunnel"] == "terminated"
