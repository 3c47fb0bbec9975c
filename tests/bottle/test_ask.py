"""Ask mode with a real bottle: one bottle, its questions answered by ``approve`` on a pseudo-terminal, by the
agent's hook, or by nobody (the timeout), and a flood of 200 destinations at once.

One stand-in container on the tests' network answers for every destination (its aliases); the bottle's agent
allows that network's addresses (so the address guard lets them through to the question), asks with a short
timeout, and has a hook that answers by the destination's name (``HOOK``) and leaves the others to
``approve``. The run is started as the CLI starts it (``launch.started``), so its watcher, which runs the hook,
is this process's.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import docker
import pexpect
import pytest

from claude_bottle.agent.load import load_agent
from claude_bottle.commands.approve import ANSWER_DELAY
from claude_bottle.credentials import Credential
from claude_bottle.gate.settings import parse_upstream
from claude_bottle.launch import Launch, started
from claude_bottle.paths import agents_dir
from claude_bottle.runtime.ask_watch import GateChannel
from claude_bottle.runtime.engines import open_engine
from claude_bottle.runtime.run import Run
from claude_bottle.runtime.seam import ContainerSpec
from claude_bottle.stub import DEFAULT_TEXT
from claude_bottle.verify.standins import in_bottle
from tests.bottle.conftest import TEST_LABEL, Upstream, gate_datagrams, write_agent

pytestmark = pytest.mark.docker
PORT = 8000
TIMEOUT = 8  # the agent's ask_timeout: long enough for approve's keys, short enough to wait out
FLOOD = 200
NAMES = ("term-once", "term-deny", "term-always", "term-second", "nobody", "hook-allow", "hook-deny", "hook-hang", "hook-crash")
HOOK = """\
import json, os, signal, sys, time
host = json.load(sys.stdin)["host"]
if host.startswith("leak-"):
    sys.exit(1)
if host == "hook-allow":
    sys.exit(0)
if host == "hook-deny":
    sys.exit(1)
if host == "hook-hang":
    time.sleep(600)
if host == "hook-crash":
    os.kill(os.getpid(), signal.SIGKILL)
print(json.dumps({"answer": "pass"}))
"""


@pytest.fixture
def destinations(client: docker.DockerClient, upstream: Upstream, built_images: tuple[str, str]) -> Iterator[str]:
    """A stub on the tests' network known by every name the test asks about (NAMES, flood-0 ...)."""
    engine, name = open_engine(client), f"claude-bottle-test-asked-{secrets.token_hex(3)}"
    aliases = (*NAMES, *(f"flood-{i}" for i in range(FLOOD)))
    engine.create_container(ContainerSpec(
        built_images[1], name, {TEST_LABEL: "1"},
        entrypoint=("/opt/gate/bin/python", "-m", "claude_bottle", "stub-upstream", "--listen",
                    f"{NAMES[0]}:{PORT}"),
        network=upstream.network, aliases=aliases, read_only=True))
    try:
        engine.start(name)
        deadline = time.monotonic() + 30
        while b"stub upstream on" not in b"".join(engine.logs(name)) and time.monotonic() < deadline:
            time.sleep(0.2)
        yield name
    finally:
        engine.remove_container(name)


def fetch(run: Run, host: str, wait: bool = True) -> str:
    """A plain-HTTP GET of ``host`` through the bottle's proxy: its status line's code and reason, one line;
    with ``wait`` False, started in the background (``result(run, host)`` reads it later)."""
    command = (f"curl -s -i -m 60 http://{host}:{PORT}/v1/models -o /tmp/{host}.out -w '%{{http_code}}' "
               f"> /tmp/{host}.code")
    if not wait:
        in_bottle(run, f"({command}) >/dev/null 2>&1 &")
        return ""
    in_bottle(run, command)
    return result(run, host)


def result(run: Run, host: str, seconds: float = 60) -> str:
    """The status (and the deny reason, if any) of a background ``fetch``, once it has ended."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        code = in_bottle(run, f"cat /tmp/{host}.code 2>/dev/null")[1].strip()
        if len(code) == 3:
            reason = in_bottle(run, f"grep -i '^x-deny-reason' /tmp/{host}.out")[1].strip()
            return f"{code} {reason}".strip()
        time.sleep(0.3)
    raise AssertionError(f"the request to {host} did not end within {seconds}s")


def approver(workspace: Path, agent: str, run: str | None) -> pexpect.spawn:
    """``approve`` as the run's start line names it (by its run), or for every run of the agent (``run`` None)."""
    child = pexpect.spawn(sys.executable, ["-P", "-m", "claude_bottle", "approve", agent,
                                           *(["--run", run] if run else [])], cwd=str(workspace),
                          env=dict(os.environ), timeout=30, dimensions=(40, 140), encoding="utf-8",
                          codec_errors="replace")
    child.expect("claude-bottle approve: ")
    return child


def test_held_requests_are_answered_by_the_terminal_the_hook_or_the_timeout(
    client: docker.DockerClient, built_images: tuple[str, str], upstream: Upstream, destinations: str, token: str,
    workspace: Path, tmp_path: Path,
) -> None:
    name = f"asker-{secrets.token_hex(3)}"
    hook = tmp_path / "hook.py"
    hook.write_text(HOOK)
    write_agent(name, f'allow_private = ["{upstream.subnet}"]\nask = true\nask_timeout = {TIMEOUT}\n'
                      f'ask_command = ["{sys.executable}", "{hook}"]\n')
    said: list[str] = []
    launch = Launch(load_agent(name, workspace), workspace, Credential.parse(token, "test"),
                    parse_upstream(upstream.url), (upstream.network,), ask=True)
    with contextlib.ExitStack() as stack:
        run = stack.enter_context(started(launch, lambda line: None, notice=said.append))
        run.create_bottle(["sleep", "900"], tty=False)
        run.engine.start(run.names.bottle)
        assert any(line.startswith("ask mode:") and f"`claude-bottle approve {name} --run {run.id}`" in line
                   for line in said)

        # approve on a terminal: allow once; the held request completes, no restart
        child = stack.enter_context(contextlib.closing(approver(workspace, name, run.id)))
        fetch(run, "term-once", wait=False)
        child.expect(f"term-once:{PORT} GET /v1/models")
        time.sleep(ANSWER_DELAY + 0.2)  # a key answers only what was on the screen that long
        child.send("a")
        assert result(run, "term-once") == "200"
        assert fetch(run, "term-once") == "200"  # once is this run: not asked again

        # deny once: refused, with a reason
        fetch(run, "term-deny", wait=False)
        child.expect(f"term-deny:{PORT} GET /v1/models")
        time.sleep(ANSWER_DELAY + 0.2)
        child.send("d")
        assert result(run, "term-deny").startswith("403")

        # allow always: the diff, confirmed, written to the agent's file
        fetch(run, "term-always", wait=False)
        child.expect(f"term-always:{PORT} GET /v1/models")
        time.sleep(ANSWER_DELAY + 0.2)
        child.send("A")
        child.expect(r"Write .*\?")
        child.send("y")
        child.sendline("")
        assert result(run, "term-always") == "200"
        assert f'host = "term-always:{PORT}"' in (agents_dir() / f"{name}.toml").read_text()
        child.send("q")
        child.expect(pexpect.EOF)

        # a second run of the agent on the workspace at once (parallel SDK queries): approve without --run
        # answers both, each question on its own run's gate
        with started(launch, lambda line: None) as second:
            second.create_bottle(["sleep", "900"], tty=False)
            second.engine.start(second.names.bottle)
            board = stack.enter_context(contextlib.closing(approver(workspace, name, None)))
            board.expect(r"2 runs \(")
            fetch(second, "term-second", wait=False)
            board.expect(f"{second.id}  term-second:{PORT} GET /v1/models")
            time.sleep(ANSWER_DELAY + 0.2)
            board.send("a")
            assert result(second, "term-second") == "200"
            assert fetch(run, "term-second").startswith("403"), "allowed once in the second run only"
            board.send("q")
            board.expect(pexpect.EOF)

        # nobody answers: refused at the timeout, saying so
        began = time.monotonic()
        assert "the approval timed out" in fetch(run, "nobody")
        assert TIMEOUT - 1 < time.monotonic() - began < TIMEOUT + 15

        # the hook: allows, denies; a hook that hangs or crashes denies. And a name is looked up only once
        # allowed: the names the hook denies (by HTTP and by CONNECT) never show in a datagram of the gate's,
        # else the bottle would exfiltrate in them, through the DNS servers the lookup reaches; the name it
        # allows does (the capture's control)
        leak = f"leak-{secrets.token_hex(4)}"
        with gate_datagrams(client, run, built_images[1]) as datagrams:
            for host in ("hook-allow", "hook-deny", "hook-hang", "hook-crash", f"{leak}.exfil.invalid"):
                fetch(run, host, wait=False)
            connect = in_bottle(run, f"curl -s -m 60 -o /dev/null -w '%{{http_connect}}' https://{leak}.tls.invalid/")
            assert connect[1].strip() == "403", connect
            assert result(run, "hook-allow") == "200", said
            assert result(run, "hook-deny").startswith("403")
            assert result(run, "hook-crash").startswith("403")
            assert result(run, "hook-hang").startswith("403")
            assert "refused by the user when asked" in result(run, f"{leak}.exfil.invalid")
            deadline = time.monotonic() + 10
            while not datagrams.carrying("hook-allow") and time.monotonic() < deadline:
                time.sleep(0.3)
            assert datagrams.carrying("hook-allow"), "the capture saw the allowed name's lookup"
            assert datagrams.carrying(leak) == 0, "a name the user denied was looked up"

        # a flood: at most 16 questions wait, the rest refused at once with a reason; the API route answers
        script = (f"for i in $(seq 0 {FLOOD - 1}); do (curl -s -i -m 60 http://flood-$i:{PORT}/ -o /tmp/flood-$i "
                  "-w '%{http_code}' > /tmp/flood-$i.code) >/dev/null 2>&1 & done")
        in_bottle(run, script)
        time.sleep(2)
        assert len(GateChannel(run.engine, run.engine.container(run.names.gate)).pending()) <= 16  # type: ignore[arg-type]
        began = time.monotonic()
        code, answer = in_bottle(run, "timeout 60 claude -p 'say hi'")
        assert code == 0 and DEFAULT_TEXT in answer
        assert time.monotonic() - began < TIMEOUT + 30
        deadline = time.monotonic() + 90  # the held ones end at the timeout; a late one may be asked anew
        while time.monotonic() < deadline:
            codes = in_bottle(run, "cat /tmp/flood-*.code 2>/dev/null")[1]
            if codes.count("403") + codes.count("200") + codes.count("000") >= FLOOD:
                break
            time.sleep(1)
        assert codes.count("403") == FLOOD, codes
        limited = in_bottle(run, "grep -li '^x-deny-reason:.*ask limit' /tmp/flood-? /tmp/flood-?? /tmp/flood-??? "
                                 "| wc -l")[1].strip()
        timed_out = in_bottle(run, "grep -li '^x-deny-reason:.*approval timed out' /tmp/flood-? /tmp/flood-?? "
                                   "/tmp/flood-??? | wc -l")[1].strip()
        assert int(limited) + int(timed_out) == FLOOD and int(limited) >= FLOOD // 2, (limited, timed_out)
