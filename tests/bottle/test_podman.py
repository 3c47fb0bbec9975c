"""Bottles on Podman through its Docker-compatible API (DOCKER_HOST at `podman system service`): images,
networks, the gate with its token over the attached stdin, labels and removal. scripts/podman sets it up.

Podman 4's internal networks give their bridge an address on the host, which a bottle reaches: the attacks on
that address are the known gap docs/engines.md describes, and every other attack must stay blocked."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

pytestmark = [pytest.mark.docker, pytest.mark.podman]
CLI = [sys.executable, "-m", "claude_bottle"]
SOCKET = os.environ.get("CLAUDE_BOTTLE_TEST_PODMAN", "unix:///run/podman/podman.sock")
# docs/engines.md, "Podman": the host's address on an internal network's bridge
HOST_BRIDGE_ATTACKS = ("TCP to the Docker host at", "anything at a listener on the Docker host")


@pytest.fixture(scope="module")
def podman() -> Iterator[docker.DockerClient]:
    try:
        client = docker.DockerClient(base_url=SOCKET, timeout=120)
        client.ping()
    except docker.errors.DockerException as exc:
        if os.environ.get("CI"):
            pytest.fail(f"no Podman service at {SOCKET}: {exc}")
        pytest.skip(f"no Podman service at {SOCKET} (scripts/podman starts one): {exc}")
    yield client
    client.close()


def on_podman(*args: str, cwd: Path, home: Path, timeout: float = 1500) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DOCKER_HOST": SOCKET, "XDG_CONFIG_HOME": str(home / "config"),
           "XDG_STATE_HOME": str(home / "state")}
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout, cwd=cwd, env=env)


def test_doctor_names_podman(podman: docker.DockerClient, tmp_path: Path) -> None:
    result = on_podman("doctor", cwd=tmp_path, home=tmp_path)
    assert f"ok  engine: Podman {podman.version()['Version']}" in result.stdout, result.stdout
    assert "ok  OCI runtimes: " in result.stdout


def test_verify_on_podman_blocks_all_but_the_host_bridge_and_leaves_nothing(
    podman: docker.DockerClient, tmp_path: Path,
) -> None:
    result = on_podman("verify", "--json", cwd=tmp_path, home=tmp_path)
    assert result.stdout, result.stderr
    report = json.loads(result.stdout)
    leaks = [r["attack"] for r in report["results"] if not r["blocked"]]
    assert [a for a in leaks if not a.startswith(HOST_BRIDGE_ATTACKS)] == []
    assert report["attacks"] >= 60
    records = list((tmp_path / "state" / "claude-bottle" / "runs").glob("*/audit.jsonl"))
    assert records and records[0].stat().st_size > 0, "the gate's audit was not kept"
    flt = {"label": "claude-bottle.agent=default"}
    assert [c.name for c in podman.containers.list(all=True, filters=flt)] == []
    assert [n.name for n in podman.networks.list(filters=flt)] == []
