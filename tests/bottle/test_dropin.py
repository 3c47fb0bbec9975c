"""The drop-in `claude-bottle-claude`, driven as programs drive `claude`, with the real Claude Code: standard
streams both ways byte for byte, nothing of the caller's environment inside, signals passed on, its exit code
Claude Code's, and nothing left however it ends."""

from __future__ import annotations

import contextlib
import json
import os
import pty
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import docker
import pexpect
import pytest

from claude_bottle.commands.start import AGENT_VARIABLE, UPSTREAM_NETWORK_VARIABLE, UPSTREAM_VARIABLE
from tests.bottle.conftest import Upstream, in_terminal, leftovers, write_agent

pytestmark = pytest.mark.docker
DROP_IN = Path(sys.executable).with_name("claude-bottle-claude")  # the console script the package installs
AGENT = "drop-in"
GONE_SECONDS = 10


@pytest.fixture
def environ(token: str, upstream: Upstream) -> dict[str, str]:
    """The caller's environment: the agent and the stub chosen by the drop-in's variables."""
    write_agent(AGENT, "")
    return {**os.environ, AGENT_VARIABLE: AGENT, UPSTREAM_VARIABLE: upstream.url,
            UPSTREAM_NETWORK_VARIABLE: upstream.network}


def test_stream_json_both_ways_and_none_of_the_callers_environment(
        client: docker.DockerClient, environ: dict[str, str], workspace: Path) -> None:
    canary = f"canary-{secrets.token_hex(8)}"
    message = {"type": "user", "message": {"role": "user", "content": "run: env > /workspace/env.txt"}}
    result = subprocess.run(
        [str(DROP_IN), "-p", "--input-format", "stream-json", "--output-format", "stream-json", "--verbose"],
        input=json.dumps(message) + "\n", capture_output=True, text=True, timeout=240, cwd=workspace,
        env={**environ, "CALLER_SECRET": canary, "ANTHROPIC_BASE_URL": f"http://{canary}.invalid"})
    assert result.returncode == 0, result.stderr
    messages = [json.loads(line) for line in result.stdout.splitlines()]  # standard output is Claude Code's only
    assert messages[0]["type"] == "system" and messages[0]["subtype"] == "init"
    assert messages[-1]["type"] == "result" and messages[-1]["subtype"] == "success"
    assert any(m["type"] == "assistant" and m["message"]["content"][0].get("name") == "Bash" for m in messages)
    inside = (workspace / "env.txt").read_text()
    assert "HOME=/home/agent" in inside, "the tool ran in the bottle"
    assert canary not in inside and canary not in result.stdout
    assert leftovers(client, AGENT) == []


def test_on_a_terminal_claude_code_gets_one(client: docker.DockerClient, environ: dict[str, str],
                                            workspace: Path) -> None:
    """Standard input and output terminals: the bottle gets a TTY, as `claude` would have one; a SIGTERM to the
    drop-in reaches Claude Code, whose exit code is the drop-in's."""
    child = in_terminal([str(DROP_IN)], workspace, environ)
    try:
        child.kill(signal.SIGTERM)
        child.expect(pexpect.EOF, timeout=60)
    finally:
        child.close(force=not child.isalive())
    assert child.exitstatus == 128 + signal.SIGTERM
    assert leftovers(client, AGENT) == []


def sleeping_drop_in(client: docker.DockerClient, environ: dict[str, str], workspace: Path,
                     stdout: int = subprocess.PIPE, before: str = "") -> subprocess.Popen[bytes]:
    """The drop-in with Claude Code mid-run: its Bash tool running ``sleep 600`` in the bottle (after
    ``before``)."""
    process = subprocess.Popen([str(DROP_IN), "-p", f"run: {before}sleep 600"], cwd=workspace, env=environ,
                               stdin=subprocess.DEVNULL, stdout=stdout, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and process.poll() is None:
        bottles = client.containers.list(filters={"label": f"claude-bottle.agent={AGENT}", "name": "-bottle"})
        try:
            if bottles and any("sleep 600" in " ".join(p) for p in bottles[0].top()["Processes"]):
                # Claude Code can lose a signal that comes while it starts a tool (its process is up, the
                # handler that stops it not yet set): the run then goes on, the tool sleeping. A person would
                # press Ctrl-C again; the test waits until the tool is well under way.
                time.sleep(2)
                return process
        except docker.errors.APIError:  # exited between the two calls
            pass
        time.sleep(0.3)
    process.kill()
    _, stderr = process.communicate(timeout=60)
    raise AssertionError(f"Claude Code never ran its tool: {stderr.decode()}")


# SIGTERM ends Claude Code: 128 + 15, passed through. SIGINT in ``-p`` interrupts the running tool and Claude
# Code ends the turn as it sees fit (0, 1 or 130 with 2.1.x): the sleep is cut short, the run ends at once.
@pytest.mark.parametrize(("sent", "codes"), [(signal.SIGTERM, {128 + signal.SIGTERM}), (signal.SIGINT, {0, 1, 130})])
def test_a_signal_reaches_claude_code_and_its_exit_is_the_drop_ins(
        client: docker.DockerClient, environ: dict[str, str], workspace: Path, sent: signal.Signals,
        codes: set[int]) -> None:
    process = sleeping_drop_in(client, environ, workspace)
    try:
        # Under load Claude Code can still lose a SIGINT (see sleeping_drop_in): as a person would, it is sent
        # again while the run goes on. A SIGTERM is sent once.
        for _ in range(3 if sent == signal.SIGINT else 1):
            process.send_signal(sent)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(15)
                break
        _, stderr = process.communicate(timeout=GONE_SECONDS + 20)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode in codes, stderr.decode()
    assert leftovers(client, AGENT) == []


def test_a_claude_code_stopped_by_its_agent_does_not_keep_the_run_past_a_sigterm(
        client: docker.DockerClient, environ: dict[str, str], workspace: Path) -> None:
    """The attack: the agent, Claude Code's own user, stops it (SIGSTOP), so the SIGTERM passed on never acts,
    and the bottle, its gate and the credential stay for as long as the caller waits (a script's `timeout`, a
    CI job's cancel that sends SIGTERM and waits). The run ends all the same, soon after the SIGTERM."""
    process = sleeping_drop_in(client, environ, workspace, before="kill -STOP $(pgrep -x claude); ")
    process.send_signal(signal.SIGTERM)
    assert ended_within(process, 10 + GONE_SECONDS), "the run outlived the SIGTERM"  # launch.END_SECONDS, then removal
    assert leftovers(client, AGENT) == []


def test_the_program_driving_the_drop_in_killed_outright_leaves_no_container(
        client: docker.DockerClient, environ: dict[str, str], workspace: Path) -> None:
    """The program that reads the drop-in's output (an SDK's) is killed mid-run, and the drop-in lives on: its
    bottle writes nothing while its tool runs (a hijacked one may never write again), so nothing it writes
    fails. The run ends all the same, within seconds."""
    driver = subprocess.Popen([sys.executable, "-c", "import sys, time\n"
                               "print(sys.stdin.readline(), end='', flush=True)\ntime.sleep(600)"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert driver.stdin is not None and driver.stdout is not None
    process = sleeping_drop_in(client, environ, workspace, stdout=driver.stdin.fileno())
    driver.stdin.close()  # the drop-in's output has the driver alone for its reader
    driver.kill()
    driver.wait(30)
    assert ended_within(process, GONE_SECONDS + 10), "the drop-in outlived the program reading it"
    assert leftovers(client, AGENT) == []


def ended_within(process: subprocess.Popen[bytes], seconds: float) -> bool:
    """Whether ``process`` ended within ``seconds``; killed if it did not."""
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.communicate(timeout=seconds)
    if process.poll() is not None:
        return True
    process.kill()
    process.wait(30)
    return False


@pytest.mark.parametrize("terminal", [False, True], ids=["piped", "output-on-a-terminal"])
def test_the_drop_in_killed_outright_leaves_no_container(
        client: docker.DockerClient, environ: dict[str, str], workspace: Path, terminal: bool) -> None:
    """Also with its output on a terminal, which it copies through a thread of its own."""
    leader, follower = pty.openpty() if terminal else (-1, subprocess.PIPE)
    try:
        process = sleeping_drop_in(client, environ, workspace, follower)
        os.kill(process.pid, signal.SIGKILL)
        process.wait(30)
    finally:
        if terminal:
            os.close(leader)
            os.close(follower)
    deadline = time.monotonic() + GONE_SECONDS
    while leftovers(client, AGENT) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert leftovers(client, AGENT) == [], "the run outlived the drop-in"
