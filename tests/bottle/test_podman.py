"""Bottles on Podman through its Docker-compatible API (DOCKER_HOST at `podman system service`): images,
networks, the gate with its token over the attached stdin, labels and removal. scripts/podman sets it up,
with the firewall rules docs/engines.md gives for the address Podman's internal bridges have on the host."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import docker
import pytest

from claude_bottle.agent.load import load_agent
from claude_bottle.credentials import Credential
from claude_bottle.display import printable
from claude_bottle.errors import ConfigError, DockerError
from claude_bottle.gate.settings import parse_upstream
from claude_bottle.launch import Launch, started
from claude_bottle.runtime import podman_engine
from claude_bottle.runtime import run as run_module
from tests.bottle.conftest import PODMAN_SOCKET as SOCKET
from tests.bottle.conftest import write_agent

pytestmark = [pytest.mark.docker, pytest.mark.podman]
CLI = [sys.executable, "-P", "-m", "claude_bottle"]


def on_podman(*args: str, cwd: Path, home: Path, timeout: float = 1500) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DOCKER_HOST": SOCKET, "XDG_CONFIG_HOME": str(home / "config"),
           "XDG_STATE_HOME": str(home / "state")}
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout, cwd=cwd, env=env)


def test_doctor_names_podman(podman: docker.DockerClient, tmp_path: Path) -> None:
    result = on_podman("doctor", cwd=tmp_path, home=tmp_path)
    assert f"ok  engine: Podman {podman.version()['Version']}" in result.stdout, result.stdout
    assert "ok  OCI runtimes: " in result.stdout


def test_verify_on_podman_blocks_every_attack_and_leaves_nothing(
    podman: docker.DockerClient, tmp_path: Path,
) -> None:
    result = on_podman("verify", "--json", cwd=tmp_path, home=tmp_path)
    assert result.stdout, result.stderr
    report = json.loads(result.stdout)
    assert [r["attack"] for r in report["results"] if not r["blocked"]] == []
    assert result.returncode == 0, result.stderr
    assert report["attacks"] >= 60
    records = list((tmp_path / "state" / "claude-bottle" / "runs").glob("*/audit.jsonl"))
    assert records and any(r.stat().st_size > 0 for r in records), "no gate's audit was kept"
    flt = {"label": "claude-bottle.agent=default"}
    assert [c.name for c in podman.containers.list(all=True, filters=flt)] == []
    assert [n.name for n in podman.networks.list(filters=flt)] == []


def test_start_is_refused_while_the_host_answers_on_the_bottles_bridge(
    podman: docker.DockerClient, token: str, workspace: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The attack: the bottle's bridge gets an address on the host after all (as with the resolver Podman's
    Docker-compatible API always gives a network) and is named outside the firewall rule, so the host answers
    there, as on a Podman host without the rule. Start must refuse before any bottle exists, and leave
    nothing."""
    monkeypatch.setenv("DOCKER_HOST", SOCKET)
    monkeypatch.setattr(run_module, "BRIDGE_PREFIX", "exposd-")
    made = podman_engine.libpod

    def with_a_resolver(client: docker.DockerClient, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        return made(client, method, path, {**body, "dns_enabled": True} if path == "/networks/create" and body else body)

    monkeypatch.setattr(podman_engine, "libpod", with_a_resolver)
    write_agent("exposed", "")
    launch = Launch(load_agent("exposed", workspace), workspace, Credential.parse(token, "test"),
                    parse_upstream("http://stub.invalid:8000"))
    refused = (r"address on this host \(10\.[0-9.]+, bridge exposd-[0-9a-f]{8}\) and the host answers there.*"
               r"`iptables -I INPUT -i exposd-\+ -j DROP`.*docs/engines.md")
    with pytest.raises(DockerError, match=refused), started(launch, lambda line: None) as run:
        run.create_bottle(["true"], tty=False)
    flt = {"label": "claude-bottle.agent=exposed"}
    assert [c.name for c in podman.containers.list(all=True, filters=flt)] == []
    assert [n.name for n in podman.networks.list(filters=flt)] == []


@pytest.mark.parametrize("folder", ["x,src=/etc,consistency=", "notes\n  (nothing else changed)", 'a"b'])
def test_a_nested_git_whose_path_podman_would_misread_is_refused_leaving_nothing(
    podman: docker.DockerClient, token: str, workspace: Path, monkeypatch: pytest.MonkeyPatch, folder: str,
) -> None:
    """The attack: a bottle leaves a ``.git`` in a folder whose name, written into the text of a ``--mount``
    option by Podman's Docker-compatible API, reads as more options. The next bottle gets that ``.git``
    read-only by its path, so ``x,src=/etc,consistency=`` would mount the host's /etc into it (which Podman
    does, given such a mount). The start must refuse, naming the path, and leave nothing behind."""
    monkeypatch.setenv("DOCKER_HOST", SOCKET)
    (workspace / folder / ".git").mkdir(parents=True)
    write_agent("nested", "")
    launch = Launch(load_agent("nested", workspace), workspace, Credential.parse(token, "test"),
                    parse_upstream("http://stub.invalid:8000"))
    with pytest.raises(ConfigError, match="Podman cannot mount a path holding") as refused, \
            started(launch, lambda line: None) as run:
        run.create_bottle(["true"], tty=False)
    assert printable(folder) in str(refused.value) and "\n" not in str(refused.value)
    flt = {"label": "claude-bottle.agent=nested"}
    assert [c.name for c in podman.containers.list(all=True, filters=flt)] == []
    assert [n.name for n in podman.networks.list(filters=flt)] == []
