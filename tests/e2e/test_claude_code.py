"""End to end with the real Claude Code binary: `claude -p` through the gate to the stub Messages API.

A recording tap sits between Claude Code and the gate, so the test compares what Claude Code sent with what
the upstream received, header by header.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import h11
import pytest

from claude_bottle.gate.settings import Endpoint
from claude_bottle.stub import DEFAULT_TEXT, StubUpstream
from tests.conftest import GateFactory
from tests.helpers import make_token

pytestmark = [pytest.mark.asyncio, pytest.mark.e2e]

# What the gate may change on the way: the credential, Host, the encoding it asks for, and framing.
GATE_OWNED = {"authorization", "x-api-key", "host", "accept-encoding", "connection", "content-length",
              "transfer-encoding", "keep-alive"}


@contextlib.asynccontextmanager
async def recording_tap(target: Endpoint) -> AsyncIterator[tuple[Endpoint, list[bytes]]]:
    """A TCP relay to ``target`` that keeps every byte the client sent, one entry per connection."""
    sent: list[bytes] = []

    async def relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        index = len(sent)
        sent.append(b"")
        up_reader, up_writer = await asyncio.open_connection(target.host, target.port)

        async def upward() -> None:
            while data := await reader.read(65536):
                sent[index] += data
                up_writer.write(data)
                await up_writer.drain()
            up_writer.write_eof()

        async def downward() -> None:
            while data := await up_reader.read(65536):
                writer.write(data)
                await writer.drain()
            writer.close()

        with contextlib.suppress(ConnectionError):
            async with asyncio.TaskGroup() as tg:
                tg.create_task(upward())
                tg.create_task(downward())

    server = await asyncio.start_server(relay, "127.0.0.1", 0)
    try:
        yield Endpoint("127.0.0.1", server.sockets[0].getsockname()[1]), sent
    finally:
        server.close()


def request_heads(raw: bytes) -> list[h11.Request]:
    conn = h11.Connection(h11.SERVER)
    conn.receive_data(raw)
    heads = []
    while True:
        event = conn.next_event()
        if isinstance(event, h11.Request):
            heads.append(event)
        elif isinstance(event, h11.EndOfMessage):  # answer, so the parser moves on to the next request
            conn.send(h11.Response(status_code=204, headers=[]))
            conn.send(h11.EndOfMessage())
            conn.start_next_cycle()
        elif event in (h11.NEED_DATA, h11.PAUSED) or isinstance(event, h11.ConnectionClosed):
            return heads


async def run_claude(binary: Path, home: Path, env: dict[str, str], prompt: str,
                     args: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    environment = {"PATH": os.environ["PATH"], "HOME": str(home), "LANG": "C.UTF-8", "TERM": "dumb",
                   "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_AUTOUPDATER": "1",
                   "DISABLE_TELEMETRY": "1", "DISABLE_ERROR_REPORTING": "1", **env}
    return await asyncio.to_thread(
        subprocess.run, [str(binary), *args, "-p", prompt], capture_output=True, text=True, timeout=180,
        env=environment, cwd=home, stdin=subprocess.DEVNULL,
    )


@pytest.mark.parametrize(("kind", "client_variable"), [("oat", "CLAUDE_CODE_OAUTH_TOKEN"),
                                                       ("api", "ANTHROPIC_API_KEY")])
async def test_claude_p_answers_through_the_gate_with_the_real_credential_injected(
    claude_binary: Path, make_gate: GateFactory, stub: StubUpstream, tmp_path: Path, kind: str, client_variable: str
) -> None:
    real = make_token(kind)
    placeholder = make_token(kind)
    async with make_gate(token=real) as gate, recording_tap(gate.api) as (tap, sent):
        result = await run_claude(claude_binary, tmp_path, {
            "ANTHROPIC_BASE_URL": f"http://{tap}",
            client_variable: placeholder,
            "HTTPS_PROXY": f"http://{gate.proxy}", "HTTP_PROXY": f"http://{gate.proxy}",
            "NO_PROXY": "127.0.0.1",
        }, "say hi")
        records = gate.records()

    assert result.returncode == 0, result.stderr
    assert DEFAULT_TEXT in result.stdout

    messages = [r for r in stub.requests if r.target.split("?")[0] == "/v1/messages"]
    assert messages, f"the stub saw no /v1/messages call: {[r.target for r in stub.requests]}"
    credential_header = "authorization" if kind == "oat" else "x-api-key"
    for request in stub.requests:
        expected = f"Bearer {real}" if kind == "oat" else real
        assert request.header(credential_header) == [expected]
        assert placeholder not in str(request.headers) and placeholder.encode() not in request.body

    sent_heads = [head for raw in sent for head in request_heads(raw)]
    assert len(sent_heads) == len(stub.requests)
    for head, received in zip(sent_heads, stub.requests, strict=True):
        assert head.target.decode() == received.target
        claude_sent = [(n.decode(), v.decode()) for n, v in head.headers if n.decode() not in GATE_OWNED]
        upstream_got = [(n.decode().lower(), v.decode()) for n, v in received.headers
                        if n.decode().lower() not in GATE_OWNED]
        assert upstream_got == claude_sent, "end-to-end headers must pass untouched and in order"
    message_headers = {n.decode() for n, _ in sent_heads[[r.target for r in stub.requests].index(messages[0].target)]
                       .headers}
    assert {"anthropic-version", "user-agent", "x-claude-code-session-id"} <= message_headers
    if kind == "oat":
        assert any("oauth-2025-04-20" in v for v in messages[0].header("anthropic-beta"))

    assert all(r["decision"] == "allow" for r in records if r["listener"] == "api")
    assert real not in result.stdout + result.stderr
