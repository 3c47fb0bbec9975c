"""`claude-bottle verify` on a real engine: every attack blocked on a default bottle, and leaks reported
when an invariant is broken on purpose."""

from __future__ import annotations

import contextlib
import json
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import docker
import pytest

from claude_bottle import persistence, records, trust
from claude_bottle.agent import project as project_module
from claude_bottle.agent.project import read_project_file
from claude_bottle.agent.schema import AgentConfig
from claude_bottle.credentials import Credential
from claude_bottle.gate.dlp import DlpPolicy
from claude_bottle.policy.addresses import parse_network
from claude_bottle.policy.hosts import Allowlist, parse_pattern
from claude_bottle.policy.rules import HostRules
from claude_bottle.runtime import run as run_module
from claude_bottle.runtime.files import Protection
from claude_bottle.runtime.spec import HOME
from claude_bottle.verify import inspected, mcp_attacks, standins, suite
from claude_bottle.verify.attack import Outcome
from claude_bottle.verify.sentinels import SENTINELS
from claude_bottle.verify.standins import Verification, verification
from claude_bottle.verify.suite import attack
from tests.bottle.conftest import bottle_runtime, leftovers

pytestmark = pytest.mark.docker
CLI = [sys.executable, "-P", "-m", "claude_bottle"]
GROUPS = {"direct egress", "egress proxy", "API route", "credential discovery", "privilege and persistence",
          persistence.GROUP, inspected.INSPECTION, mcp_attacks.MCP, SENTINELS}


def quiet(line: str) -> None:
    pass


def leaked(outcomes: list[Outcome]) -> set[str]:
    return {o.attack for o in outcomes if not o.blocked}


def test_verify_blocks_every_attack_on_a_default_bottle(
    client: docker.DockerClient, built_images: tuple[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    runtime = ["--runtime", bottle_runtime()] if bottle_runtime() else []
    result = subprocess.run([*CLI, "verify", "--json", *runtime], capture_output=True, text=True, timeout=300,
                            cwd=tmp_path)
    assert result.stdout, result.stderr
    report = json.loads(result.stdout)
    assert [r for r in report["results"] if not r["blocked"]] == []
    assert result.returncode == 0, result.stderr
    assert report["leaks"] == 0 and report["attacks"] == len(report["results"]) >= 60
    assert {r["group"] for r in report["results"]} == GROUPS
    assert leftovers(client, "default") == [], result.stderr


def test_verify_prints_a_table(client: docker.DockerClient, built_images: tuple[str, str], tmp_path: Path,
                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    agents = tmp_path / "config" / "claude-bottle" / "agents"
    agents.mkdir(parents=True)
    (agents / "tabled.toml").write_text('version = 1\nallow = ["registry.npmjs.org"]\n')
    result = subprocess.run([*CLI, "verify", "tabled"], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "CREDENTIAL DISCOVERY" in result.stdout and "EGRESS PROXY" in result.stdout
    assert result.stdout.rstrip().endswith("attacks: every one blocked")
    assert "blocked  CONNECT to an unlisted host (exfiltrate.example:443)" in result.stdout
    assert leftovers(client, "tabled") == []


def outside_network(client: docker.DockerClient, target: Verification) -> docker.models.networks.Network:
    canary = client.containers.get(target.canary.name)
    return client.networks.get(next(iter(canary.attrs["NetworkSettings"]["Networks"])))


def test_a_bottle_that_bypasses_the_gate_fails_verify(
    client: docker.DockerClient, built_images: tuple[str, str],
) -> None:
    with verification(AgentConfig(name="bypassed"), quiet) as target:
        outside_network(client, target).connect(target.run.names.bottle)  # a direct route around the gate
        outcomes = attack(target)
    canary = [o for o in outcomes if o.group == "direct egress" and "outside the bottle" in o.attack]
    assert canary and all(not o.blocked for o in canary), canary
    assert leftovers(client, "bypassed") == []


def test_a_credential_inside_the_bottle_fails_verify(
    client: docker.DockerClient, built_images: tuple[str, str],
) -> None:
    secret = "sk-ant-oat01-planted-" + secrets.token_urlsafe(40)
    agent = AgentConfig(name="planted", env={"ANTHROPIC_AUTH_TOKEN": secret})  # a config that hands it over
    with verification(agent, quiet, credential=Credential.parse(secret, "test")) as target:
        outcomes = attack(target)
    assert {"environment variables", "every readable /proc/*/environ and cmdline",
            "docker inspect of the bottle and the gate (from the host)"} <= leaked(outcomes)
    assert leftovers(client, "planted") == []


def test_private_addresses_opened_to_the_proxy_fail_verify(
    client: docker.DockerClient, built_images: tuple[str, str],
) -> None:
    agent = AgentConfig(name="opened",
                        allow_private=tuple(map(parse_network, ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"))))
    with verification(agent, quiet) as target:
        outcomes = attack(target)
    assert leaked(outcomes) == {"CONNECT to an allowlisted name on a private address (canary:8000)"}
    assert leftovers(client, "opened") == []


def test_raw_tcp_allowed_to_an_allowed_host_fails_verify(
    client: docker.DockerClient, built_images: tuple[str, str],
) -> None:
    """allow_tcp lifts the first-flight check for that target: fronting and plain bytes get through, and
    verify says so (the attacks reach the real gate and the host behind it, and are judged on what came back)."""
    agent = AgentConfig(name="rawfront", allow_tcp=Allowlist.parse(["front:8000"]))
    with verification(agent, quiet) as target:
        outcomes = attack(target)
    assert leaked(outcomes) == {"TLS hello naming exfiltrate.example in a tunnel to front:8000 (domain fronting)",
                                "plain HTTP for exfiltrate.example in a tunnel to front:8000"}
    assert leftovers(client, "rawfront") == []


def test_server_tools_opened_to_the_provider_fail_verify(
    client: docker.DockerClient, built_images: tuple[str, str],
) -> None:
    agent = AgentConfig(name="provider", server_tools=("web_fetch", "code_execution"))
    with verification(agent, quiet) as target:
        outcomes = attack(target)
    assert leaked(outcomes) == {"the provider fetches a URL for the bottle: web_fetch_20250910",
                                "the provider runs code for the bottle: code_execution_20250825"}
    assert leftovers(client, "provider") == []


def test_tunnels_the_gate_does_not_inspect_fail_verify(
    client: docker.DockerClient, built_images: tuple[str, str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Inspection taken away from the HTTPS stand-ins (their tunnels opaque, as with inspect = false): every
    attack inside TLS reaches them, and verify says so; the controls still pass."""
    def opaque() -> tuple[HostRules, ...]:
        return tuple(HostRules(parse_pattern(f"{host}:{standins.TLS_PORT}"), inspect=False)
                     for host in (standins.INSPECTED, standins.READ_ONLY))

    monkeypatch.setattr(standins, "inspected_rules", opaque)
    with verification(AgentConfig(name="unseen"), quiet) as target:
        outcomes = inspected.inspection_attacks(target)
    assert leaked(outcomes) == {a.name for a in inspected.INSPECTED_ATTACKS}
    assert all("the stand-in got it" in o.actual for o in outcomes if not o.blocked)
    assert leftovers(client, "unseen") == []


def test_a_dlp_rule_turned_off_fails_verify(client: docker.DockerClient, built_images: tuple[str, str]) -> None:
    agent = AgentConfig(name="undetected", dlp=DlpPolicy(disabled=frozenset({"github-token"})))
    with verification(agent, quiet) as target:
        outcomes = inspected.inspection_attacks(target)
    assert leaked(outcomes) == {"a GitHub token (ghp_...) in a request header inside TLS"}
    assert leftovers(client, "undetected") == []


def test_interrupted_verify_leaves_nothing_behind(
    client: docker.DockerClient, built_images: tuple[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    agents = tmp_path / "config" / "claude-bottle" / "agents"
    agents.mkdir(parents=True)
    name = f"cut-{secrets.token_hex(3)}"
    (agents / f"{name}.toml").write_text("version = 1\n")
    process = subprocess.Popen([*CLI, "verify", name], cwd=tmp_path, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True)
    assert process.stderr is not None
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        line = process.stderr.readline()
        if not line or "starting gate" in line:
            break
    time.sleep(1)
    process.send_signal(signal.SIGINT)
    assert process.wait(60) != 0
    assert leftovers(client, name) == []


def test_a_host_that_trusts_what_bottles_write_fails_verify(
    client: docker.DockerClient, built_images: tuple[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every protection of the persistence group taken away at once: each of its checks reports the leak."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))

    def per_agent(agent: str, workspace: Path) -> str:
        return f"claude-bottle-{agent}-state"

    def following_symlinks(workspace: Path, paths: tuple[str, ...] = ()) -> list[Protection]:
        """Mounts what protected paths lead to, as claude-bottle once did for .git/config, and nothing else."""
        return [Protection(f"/workspace/{path}", workspace / path) for path in paths
                if (workspace / path).is_symlink() and (workspace / path).exists()]

    monkeypatch.setattr(run_module, "protective_mounts", following_symlinks)
    monkeypatch.setattr(run_module, "state_volume", per_agent)
    monkeypatch.setattr(standins, "state_volume", per_agent)
    monkeypatch.setattr(run_module, "claude_state_mounts",
                        lambda volume: {volume: {"bind": f"{HOME}/.claude", "mode": "rw"}})
    monkeypatch.setattr(project_module, "PROJECT_FORBIDDEN", {})
    monkeypatch.setattr(trust, "approved_digest", lambda workspace: getattr(read_project_file(workspace), "digest",
                                                                            None))
    monkeypatch.setattr(trust, "check", lambda workspace: None)
    monkeypatch.setattr(records, "save", lambda *args, **kwargs: None)
    name = f"trusting-{secrets.token_hex(3)}"
    try:
        outcomes = suite.verify(AgentConfig(name=name), quiet)
    finally:
        with contextlib.suppress(docker.errors.APIError):
            client.volumes.get(per_agent(name, tmp_path)).remove(force=True)
    group = [o for o in outcomes if o.group == persistence.GROUP]
    assert len(group) >= 13 and [o.attack for o in group if o.blocked] == []
    assert leftovers(client, name) == []
