"""Bottles on gVisor: an agent's ``runtime = "runsc"`` puts its bottle (not its gate) on gVisor's own kernel,
and every verify attack stays blocked there. Needs runsc registered with the engine (scripts/gvisor)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import docker
import pytest

from claude_bottle.agent.load import load_agent
from claude_bottle.agent.schema import AgentConfig
from claude_bottle.credentials import Credential
from claude_bottle.gate.settings import parse_upstream
from claude_bottle.launch import Launch, started
from claude_bottle.runtime.engines import open_engine
from claude_bottle.stub import DEFAULT_TEXT
from claude_bottle.verify.standins import in_bottle, verification
from claude_bottle.verify.suite import attack
from tests.bottle.conftest import Upstream, leftovers, write_agent
from tests.prerequisites import require

pytestmark = [pytest.mark.docker, pytest.mark.gvisor]
CLI = [sys.executable, "-P", "-m", "claude_bottle"]


@pytest.fixture(scope="module")
def runsc(client: docker.DockerClient) -> str:
    require("runsc" in open_engine(client).describe().runtimes, "the engine has no runsc runtime",
            "scripts/gvisor installs and registers gVisor")
    return "runsc"


def test_the_bottle_runs_on_gvisor_and_the_gate_on_the_default_runtime(
    client: docker.DockerClient, runsc: str, upstream: Upstream, token: str, workspace: Path,
) -> None:
    write_agent("sandboxed", f'runtime = "{runsc}"\n')
    launch = Launch(load_agent("sandboxed", workspace), workspace, Credential.parse(token, "test"),
                    parse_upstream(upstream.url), (upstream.network,))
    with started(launch, lambda line: None) as run:
        run.create_bottle(["sleep", "600"], tty=False)
        run.engine.start(run.names.bottle)
        assert client.api.inspect_container(run.names.bottle)["HostConfig"]["Runtime"] == runsc
        assert client.api.inspect_container(run.names.gate)["HostConfig"]["Runtime"] != runsc
        _, kernel = in_bottle(run, "dmesg 2>&1 | head -3")
        assert "gVisor" in kernel, kernel
        _, answer = in_bottle(run, f"curl -s -m 10 http://{run.gate_ip}:8080/v1/messages -o /dev/null "
                                   "-w '%{http_code}' -d '{}'")
        assert answer.strip() not in ("", "000"), "the gate is out of the gVisor bottle's reach"
    assert leftovers(client, "sandboxed") == []


def test_verify_blocks_every_attack_on_a_gvisor_bottle(
    client: docker.DockerClient, runsc: str, built_images: tuple[str, str], tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    with verification(AgentConfig(name="gvisor-verify", runtime=runsc), lambda line: None) as target:
        assert client.api.inspect_container(target.run.names.bottle)["HostConfig"]["Runtime"] == runsc
        outcomes = attack(target)
    assert [o for o in outcomes if not o.blocked] == []
    assert len(outcomes) >= 60
    assert leftovers(client, "gvisor-verify") == []


def test_run_p_on_gvisor_answers_through_the_gate(
    client: docker.DockerClient, runsc: str, upstream: Upstream, token: str, workspace: Path,
) -> None:
    write_agent("headless-gvisor", "")
    result = subprocess.run([*CLI, "run", "headless-gvisor", "-p", "say hi", "--runtime", runsc, "--upstream",
                             upstream.url, "--upstream-network", upstream.network],
                            capture_output=True, text=True, timeout=240, cwd=workspace)
    assert result.returncode == 0, result.stderr
    assert DEFAULT_TEXT in result.stdout
    assert leftovers(client, "headless-gvisor") == []


def test_a_runtime_the_engine_lacks_is_refused_before_anything_starts(
    client: docker.DockerClient, token: str, workspace: Path,
) -> None:
    write_agent("no-such", 'runtime = "no-such-runtime"\n')
    result = subprocess.run([*CLI, "run", "no-such", "-p", "hi"], capture_output=True, text=True, timeout=120,
                            cwd=workspace)
    assert result.returncode == 3, result.stderr
    assert "no OCI runtime 'no-such-runtime'" in result.stderr and "scripts/gvisor" in result.stderr
    assert leftovers(client, "no-such") == []
