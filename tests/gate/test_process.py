"""``claude-bottle gate`` as a real process: start-up errors, where the token is (not), SIGTERM."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from claude_bottle.gate.ready import parse_ready
from claude_bottle.gate.settings import Endpoint
from claude_bottle.stub import StubUpstream
from tests.helpers import exchange, make_token, messages_request, parse_head, read_head

CLI = [sys.executable, "-m", "claude_bottle"]


def token_file(tmp_path: Path, text: str, mode: int = 0o600) -> Path:
    path = tmp_path / "token"
    path.write_text(text)
    path.chmod(mode)
    return path


def gate_args(token: Path | str, *extra: str) -> list[str]:
    return [*CLI, "gate", "--api-listen", "127.0.0.1:0", "--proxy-listen", "127.0.0.1:0",
            "--token-file", str(token), *extra]


@contextlib.contextmanager
def gate_process(args: list[str], stdin: bytes | None = None,
                 close_stdin: bool = True) -> Iterator[tuple[subprocess.Popen[bytes], Endpoint, Endpoint]]:
    proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        if stdin is not None:
            assert proc.stdin is not None
            proc.stdin.write(stdin)
            proc.stdin.flush()
            if close_stdin:
                proc.stdin.close()
        assert proc.stderr is not None
        lines = [proc.stderr.readline().decode()]  # its ready line, after a warning or two at most
        while (ready := parse_ready(lines[-1])) is None and len(lines) < 4 and lines[-1]:
            lines.append(proc.stderr.readline().decode())
        assert ready, f"gate did not start: {''.join(lines)}" + (proc.stderr.read().decode() if proc.poll() is not None else "")
        yield proc, ready.api, ready.proxy
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)


@pytest.mark.parametrize(("content", "mode", "words"), [
    ("", 0o600, "is empty"),
    ("not-a-token\n", 0o600, "does not hold an Anthropic token"),
    (make_token(), 0o644, "chmod 600"),
    (make_token(), 0o640, "chmod 600"),
], ids=["empty", "not a token", "world-readable", "group-readable"])
def test_bad_token_files_are_refused_at_start(tmp_path: Path, content: str, mode: int, words: str) -> None:
    result = subprocess.run(gate_args(token_file(tmp_path, content, mode)), capture_output=True, timeout=30)
    assert result.returncode == 2
    assert words in result.stderr.decode()
    assert result.stderr.decode().count("\n") == 1, "one line, no traceback"


@pytest.mark.parametrize(("extra", "words"), [
    (["--allow", "*"], "matches every host"),
    (["--allow", "*.com"], "public suffix"),
    (["--allow", "https://example.com/"], "not a URL"),
    (["--allow-private", "10.0.0.1/8"], "--allow-private"),
    (["--upstream", "ftp://x"], "--upstream"),
    (["--api-listen", "0.0.0.0:8080"], "every interface"),
    (["--proxy-listen", "localhost"], "--proxy-listen"),
    (["--extra-ca", "/nonexistent/ca.pem"], "--extra-ca"),
    (["--allow-server-tool", "web_fetch_20250910"], "--allow-server-tool 'web_fetch_20250910': name the family"),
    (["--allow-server-tool", "mcp_servers"], "--allow-server-tool 'mcp_servers' is not a server tool"),
])
def test_bad_flags_are_refused_naming_the_flag(tmp_path: Path, extra: list[str], words: str) -> None:
    result = subprocess.run(gate_args(token_file(tmp_path, make_token()), *extra), capture_output=True, timeout=30)
    assert result.returncode == 2, result.stderr
    assert words in result.stderr.decode()


def test_missing_token_file_and_busy_port_are_clear_errors(tmp_path: Path) -> None:
    missing = subprocess.run(gate_args(tmp_path / "nope"), capture_output=True, timeout=30)
    assert missing.returncode == 2 and "does not exist" in missing.stderr.decode()
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        args = gate_args(token_file(tmp_path, make_token()))
        args[args.index("--api-listen") + 1] = f"127.0.0.1:{port}"
        result = subprocess.run(args, capture_output=True, timeout=30)
    assert result.returncode == 4 and f"cannot listen on 127.0.0.1:{port}" in result.stderr.decode()


def test_token_is_not_on_argv_nor_in_the_environment(tmp_path: Path) -> None:
    token = make_token()
    with gate_process(gate_args("-"), stdin=token.encode()) as (proc, _, _):
        cmdline = Path(f"/proc/{proc.pid}/cmdline").read_bytes()
        environ = Path(f"/proc/{proc.pid}/environ").read_bytes()
    assert token.encode() not in cmdline
    assert token.encode() not in environ


@pytest.mark.asyncio
async def test_sigterm_lets_streams_finish_then_exits_zero(tmp_path: Path, stub: StubUpstream) -> None:
    token = token_file(tmp_path, make_token())
    audit = tmp_path / "audit.jsonl"
    args = gate_args(token, "--upstream", stub.url, "--audit-log", str(audit), "--drain-seconds", "10")
    with gate_process(args) as (proc, api, _):
        payload = {"model": "m", "stream": True, "stub": {"events": 8, "interval": 0.15}}
        reader, writer = await asyncio.open_connection(api.host, api.port)
        writer.write(messages_request(payload))
        assert (await read_head(reader))[0] == 200
        proc.send_signal(signal.SIGTERM)
        await asyncio.sleep(0.2)
        with pytest.raises(OSError):  # no longer accepting
            await exchange(api, messages_request({"model": "m"}), 1)
        rest = await asyncio.wait_for(reader.read(-1), 10)
        writer.close()
        assert b"message_stop" in rest, "the in-flight stream was cut"
        assert await asyncio.to_thread(proc.wait, 10) == 0
    records = [json.loads(line) for line in audit.read_text().splitlines()]
    assert [r["status"] for r in records] == [200]
    assert token.read_text() not in audit.read_text()


@pytest.mark.asyncio
async def test_sigterm_with_nothing_in_flight_exits_promptly(tmp_path: Path, stub: StubUpstream) -> None:
    args = gate_args(token_file(tmp_path, make_token()), "--upstream", stub.url)
    with gate_process(args) as (proc, api, _):
        # an idle keep-alive client must not hold the shutdown up
        reader, writer = await asyncio.open_connection(api.host, api.port)
        writer.write(messages_request({"model": "m"}, keep_alive=True))
        assert (await read_head(reader))[0] == 200
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(proc.wait, 10) == 0
        assert time.monotonic() - started < 5
        writer.close()


@pytest.mark.asyncio
async def test_with_exit_with_stdin_it_serves_while_its_stdin_is_open_and_exits_when_it_closes(
        tmp_path: Path, stub: StubUpstream) -> None:
    """The host holds the gate's standard input open for the run's life: its end (the host killed outright
    closes it too) stops the gate as SIGTERM does, whatever its clients keep open."""
    args = gate_args("-", "--upstream", stub.url, "--exit-with-stdin")
    with gate_process(args, f"{make_token()}\n".encode(), close_stdin=False) as (proc, api, _):
        reader, writer = await asyncio.open_connection(api.host, api.port)
        writer.write(messages_request({"model": "m"}, keep_alive=True))
        assert (await read_head(reader))[0] == 200
        await asyncio.sleep(0.5)
        assert proc.poll() is None, "it serves while its stdin is open"
        started = time.monotonic()
        assert proc.stdin is not None
        proc.stdin.close()
        assert await asyncio.to_thread(proc.wait, 10) == 0
        assert time.monotonic() - started < 5
        writer.close()


@pytest.mark.asyncio
async def test_with_a_stdin_heartbeat_it_serves_while_beats_come_and_exits_when_they_stop(
        tmp_path: Path, stub: StubUpstream) -> None:
    """An engine that keeps the gate's standard input open after the host is gone (Podman): the host beats on
    it, and silence for ``--stdin-heartbeat`` seconds stops the gate though the stream stays open."""
    args = gate_args("-", "--upstream", stub.url, "--exit-with-stdin", "--stdin-heartbeat", "1")
    with gate_process(args, f"{make_token()}\n".encode(), close_stdin=False) as (proc, api, _):
        assert proc.stdin is not None
        for _ in range(4):  # two seconds of beats, twice its silence
            proc.stdin.write(b"\n")
            proc.stdin.flush()
            await asyncio.sleep(0.5)
        assert proc.poll() is None, "it serves while the beats come"
        reader, writer = await asyncio.open_connection(api.host, api.port)
        writer.write(messages_request({"model": "m"}, keep_alive=True))
        assert (await read_head(reader))[0] == 200
        started = time.monotonic()
        assert await asyncio.to_thread(proc.wait, 10) == 0
        assert time.monotonic() - started < 5
        writer.close()


def test_audit_log_to_stderr_is_json_lines(tmp_path: Path) -> None:
    args = gate_args(token_file(tmp_path, make_token()), "--audit-log", "-")
    with gate_process(args) as (proc, _, proxy):
        response = asyncio.run(exchange(proxy, b"CONNECT blocked.example:443 HTTP/1.1\r\nHost: x\r\n"
                                               b"Connection: close\r\n\r\n", 2))
        assert parse_head(response)[0] == 403
        proc.send_signal(signal.SIGTERM)
        proc.wait(10)
        assert proc.stderr is not None
        record = json.loads(proc.stderr.readline())
    assert record["listener"] == "proxy" and record["target"] == "blocked.example:443"
    assert record["decision"] == "deny" and record["status"] == 403


def test_help_describes_every_flag() -> None:
    result = subprocess.run([*CLI, "gate", "--help"], capture_output=True, text=True, timeout=30, check=True,
                            env={**os.environ, "COLUMNS": "200"})
    for flag in ("--api-listen", "--proxy-listen", "--upstream", "--token-file", "--allow", "--allow-private",
                 "--audit-log", "--extra-ca", "--allow-api-path", "--allow-server-tool", "--ca-cert-out"):
        assert flag in result.stdout


@pytest.mark.asyncio
async def test_allow_server_tool_lets_that_family_through(tmp_path: Path, stub: StubUpstream) -> None:
    fetch = {"model": "m", "max_tokens": 1, "messages": [], "tools": [{"type": "web_fetch_20250910", "name": "f"}]}
    code = {**fetch, "tools": [{"type": "code_execution_20250825", "name": "c"}]}
    args = gate_args(token_file(tmp_path, make_token()), "--upstream", stub.url, "--allow-server-tool", "web_fetch")
    with gate_process(args) as (_, api, _):
        assert parse_head(await exchange(api, messages_request(fetch), 2))[0] == 200
        assert parse_head(await exchange(api, messages_request(code), 2))[0] == 403
    assert [r.json()["tools"][0]["type"] for r in stub.requests] == ["web_fetch_20250910"]


def test_ca_cert_out_writes_the_certificate_the_gate_announces(tmp_path: Path) -> None:
    out = tmp_path / "gate-ca.pem"
    args = gate_args(token_file(tmp_path, make_token()), "--allow", "example.com", "--ca-cert-out", str(out))
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        said = [proc.stderr.readline() for _ in range(2)]  # the DLP engine's line, then the ready line
        ready = parse_ready("".join(said))
        assert ready is not None, said
        assert out.read_bytes() == ready.ca_pem()
        assert out.stat().st_mode & 0o777 == 0o644
        assert b"PRIVATE KEY" not in out.read_bytes()
    finally:
        proc.kill()
        proc.wait(10)


def test_ca_cert_out_that_cannot_be_written_stops_the_start(tmp_path: Path) -> None:
    out = tmp_path / "missing" / "gate-ca.pem"
    result = subprocess.run(gate_args(token_file(tmp_path, make_token()), "--ca-cert-out", str(out)),
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 2
    assert f"--ca-cert-out {out}: No such file or directory" in result.stderr
    assert result.stderr.count("\n") == 1, "one line, no traceback"
    assert not (tmp_path / "missing").exists()
