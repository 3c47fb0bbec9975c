"""Learn, suggest, approve while running, and the control channel, with real bottles.

Two bottles in all: one in learn mode whose audit becomes the agent's allowlist (`policy suggest --write`),
then a strict bottle of that agent, in which the learned requests pass and nothing else does, the refusals
say why from inside, the control channel is attacked from inside (every port of the gate, the proxy, the
socket's path), and the host allows and denies a destination while the bottle runs, keeping it in the
agent's file or taking it out (--save).
"""

from __future__ import annotations

import contextlib
import json
import secrets
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

from claude_bottle import records
from claude_bottle.agent.load import load_agent
from claude_bottle.credentials import Credential
from claude_bottle.gate.settings import parse_upstream
from claude_bottle.launch import Launch, started
from claude_bottle.paths import agents_dir
from claude_bottle.runtime.engines import open_engine
from claude_bottle.runtime.gate import CONTROL_SOCKET, control_gate
from claude_bottle.runtime.run import Run
from claude_bottle.runtime.spec import API_PORT, PROXY_PORT
from claude_bottle.verify.standins import StandIn, in_bottle, stub_container
from tests.bottle.conftest import TEST_LABEL, Upstream, write_agent

pytestmark = pytest.mark.docker
CLI = [sys.executable, "-P", "-m", "claude_bottle"]
PORT = 8000  # the stand-ins' port (verify.STUB_PORT)


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=120, cwd=cwd, stdin=subprocess.DEVNULL)


@pytest.fixture
def other(client: docker.DockerClient, upstream: Upstream, built_images: tuple[str, str]) -> Iterator[StandIn]:
    """A second destination on the tests' network, known there as ``other``."""
    engine, name = open_engine(client), f"claude-bottle-test-other-{secrets.token_hex(3)}"
    try:
        yield stub_container(engine, built_images[1], upstream.network, "other", name, {TEST_LABEL: "1"})
    finally:
        engine.remove_container(name)


def status(run: Run, url: str, method: str = "GET") -> str:
    """The HTTP status curl gets for ``url`` through the bottle's proxy (000: no response)."""
    return in_bottle(run, f"curl -s -o /dev/null -m 10 -X {method} -w '%{{http_code}}' {url}")[1].strip()


def bottle_of(launch: Launch, stack: contextlib.ExitStack) -> Run:
    run = stack.enter_context(started(launch, lambda line: None))
    run.create_bottle(["sleep", "600"], tty=False)
    run.engine.start(run.names.bottle)
    return run


def scan_gate(run: Run) -> set[int]:
    """Every TCP port of the gate that accepts a connection from inside the bottle (1 to 65535)."""
    script = (f"for p in $(seq 1 65535); do (exec 3<>/dev/tcp/{run.gate_ip}/$p) 2>/dev/null && echo open $p; "
              "done; echo scanned")
    code, output = in_bottle(run, f"timeout 300 bash -c '{script}'")
    assert code == 0 and output.rstrip().endswith("scanned"), output[-500:]
    return {int(line.split()[1]) for line in output.splitlines() if line.startswith("open ")}


def test_learn_then_suggest_then_a_strict_run_with_approval_while_running(
    client: docker.DockerClient, upstream: Upstream, other: StandIn, token: str, workspace: Path,
) -> None:
    name = f"learner-{secrets.token_hex(3)}"
    write_agent(name, f'allow_private = ["{upstream.subnet}"]\n')
    credential = Credential.parse(token, "test")
    target = f"http://target:{PORT}"

    # 1. learn: the requests the task makes pass, recorded as would_deny; the bottle sees the policy read-only
    with contextlib.ExitStack() as stack:
        learning = bottle_of(Launch(load_agent(name, workspace), workspace, credential, parse_upstream(upstream.url),
                                    (upstream.network,), learn=True), stack)
        assert status(learning, f"{target}/v1/models") == "200"
        assert status(learning, f"{target}/v1/models?limit=5") == "200"
        shown = in_bottle(learning, "cat /etc/claude-bottle/policy.toml")[1]
        assert tomllib.loads(shown)["learn"] is True
        code, _ = in_bottle(learning, "echo 'learn = false' > /etc/claude-bottle/policy.toml")
        assert code != 0, "the bottle must not write its policy file"
        learned_run = learning.id
    audit = [json.loads(line) for line in records.audit_lines(records.find(learned_run))]
    assert [e["path"] for e in audit if e.get("would_deny")] == ["/v1/models", "/v1/models"]

    # 2. suggest, written into the agent after showing the diff
    shown_suggestion = cli("policy", "suggest", "--run", learned_run, cwd=workspace)
    assert shown_suggestion.returncode == 0, shown_suggestion.stderr
    assert f'host = "target:{PORT}"' in shown_suggestion.stdout
    written = cli("policy", "suggest", "--run", learned_run, "--write", name, "--yes", cwd=workspace)
    assert written.returncode == 0, written.stderr
    assert "+[[egress]]" in written.stdout and f"wrote {agents_dir() / name}.toml" in written.stdout
    agent = load_agent(name, workspace)
    assert agent.egress_allowlist.texts() == (f"target:{PORT}",)

    # 3. a strict run of the agent: what was learned passes, nothing else
    with contextlib.ExitStack() as stack:
        strict = bottle_of(Launch(agent, workspace, credential, parse_upstream(upstream.url), (upstream.network,)),
                           stack)
        assert status(strict, f"{target}/v1/models?limit=1") == "200"
        assert status(strict, f"{target}/v1/messages", "POST") == "403"  # a method and path never seen
        assert status(strict, f"http://other:{PORT}/v1/models") == "403"

        # what a refused request tells the agent, on both kinds of proxy request
        plain = in_bottle(strict, f"curl -s -i -m 10 http://other:{PORT}/v1/models")[1]
        reason = f"other:{PORT} is not in the allowlist"
        assert plain.startswith(f"HTTP/1.1 403 {reason}") and f"x-deny-reason: {reason}" in plain
        assert "Blocked by the user's claude-bottle policy, not by the network" in plain
        assert f"claude-bottle allow other:{PORT}" in plain and token not in plain
        tunnel = in_bottle(strict, f"curl -s -v -m 10 https://other:{PORT}/ 2>&1")[1]
        assert f"< HTTP/1.1 403 {reason}" in tunnel

        # the control channel, attacked from inside: every port of the gate, and the socket's path
        assert scan_gate(strict) == {API_PORT, PROXY_PORT}, "the gate must listen for the bottle on its two ports only"
        forged = json.dumps({"op": "allow", "entry": f"other:{PORT}"})
        for port in (API_PORT, PROXY_PORT):
            in_bottle(strict, f"printf '%s\\n' '{forged}' | timeout 5 bash -c "
                              f"'cat > /dev/tcp/{strict.gate_ip}/{port}'")
            in_bottle(strict, f"curl -s -m 5 -X POST --data-raw '{forged}' http://{strict.gate_ip}:{port}/control")
        for authority in (f"gate:{API_PORT}", f"gate:{PROXY_PORT}", "127.0.0.1:1", "localhost:22"):
            assert status(strict, f"http://{authority}/") == "403", authority
        missing = in_bottle(strict, f"curl -s -m 5 --unix-socket {CONTROL_SOCKET} http://x/; echo code=$?; "
                                    f"ls -la {CONTROL_SOCKET} 2>&1")[1]
        assert "code=7" in missing and "No such file" in missing
        assert status(strict, f"http://other:{PORT}/v1/models") == "403"
        gate = strict.engine.container(strict.names.gate)
        assert gate is not None
        assert control_gate(strict.engine, gate, "show")["policy"]["allow"] == \
            [f"target:{PORT}"], "nothing from the bottle changed the gate's policy"

        # approve while running: no restart, the bottle's policy file follows
        bottle = client.containers.get(strict.names.bottle)
        started_at = bottle.attrs["State"]["StartedAt"]
        allowed = cli("allow", name, f"other:{PORT}", cwd=workspace)
        assert allowed.returncode == 0 and f"allowed other:{PORT}" in allowed.stdout, allowed.stderr
        assert status(strict, f"http://other:{PORT}/v1/models") == "200"
        assert f'"other:{PORT}"' in in_bottle(strict, "cat /etc/claude-bottle/policy.toml")[1]
        denied = cli("deny", name, f"target:{PORT}", cwd=workspace)
        assert denied.returncode == 0, denied.stderr
        refused = in_bottle(strict, f"curl -s -i -m 10 {target}/v1/models")[1]
        assert refused.startswith(f"HTTP/1.1 403 target:{PORT} matches target:{PORT}, denied by the user")
        bottle.reload()
        assert bottle.attrs["State"]["StartedAt"] == started_at and bottle.status == "running"
        bad = cli("allow", name, "*", cwd=workspace)
        assert bad.returncode == 2 and "matches every host" in bad.stderr

        # --save keeps an approval in the agent's file
        saved = cli("allow", name, f"other:{PORT}", "--save", "--yes", cwd=workspace)
        assert saved.returncode == 0, saved.stderr
        assert f"other:{PORT}" in load_agent(name, workspace).egress_allowlist.texts()
        unsaved = cli("deny", name, f"other:{PORT}", "--save", "--yes", cwd=workspace)
        assert unsaved.returncode == 0 and f"-host = \"other:{PORT}\"" in unsaved.stdout, unsaved.stderr
        assert load_agent(name, workspace).egress_allowlist.texts() == (f"target:{PORT}",)
        assert status(strict, f"http://other:{PORT}/v1/models") == "403"
        strict_run = strict.id
    kept = [json.loads(line) for line in records.audit_lines(records.find(strict_run))]
    assert [(e["method"], e["target"]) for e in kept if e["listener"] == "control"] == [
        ("ALLOW", f"other:{PORT}"), ("DENY", f"target:{PORT}"), ("ALLOW", f"other:{PORT}"), ("DENY", f"other:{PORT}")]
