"""A run bound to its parts on Podman, whose Docker-compatible API keeps a container's standard input open
when its client goes away: the CLI killed outright leaves nothing (its reaper removes the run), and with the
reaper killed too the gate, which holds the credential, still stops within seconds (the host's beats on its
stream stop: runtime/lifeline.py), and then the bottle (its entrypoint watches the gate). The gate killed
ends the command with its error, as on Docker."""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

from claude_bottle import records
from claude_bottle.errors import EXIT_GATE
from claude_bottle.runtime.engines import open_engine
from claude_bottle.runtime.names import WORKSPACE_LABEL
from claude_bottle.verify.standins import stub_container
from tests.bottle.conftest import PODMAN_SOCKET as SOCKET
from tests.bottle.conftest import TEST_LABEL, Upstream, build_test_images
from tests.bottle.test_bound_run import (
    BOTTLE_GONE_SECONDS,
    GONE_SECONDS,
    exited_within,
    gone_within,
    mid_run,
    reaper_of,
)

pytestmark = [pytest.mark.docker, pytest.mark.podman]


@pytest.fixture(autouse=True)
def forget_state_volumes(podman: docker.DockerClient, tmp_path: Path) -> Iterator[None]:
    """The Claude state volumes of this test's workspaces, on this engine (the conftest's are Docker's)."""
    yield
    for volume in podman.volumes.list(filters={"label": WORKSPACE_LABEL}):
        if Path(volume.attrs["Labels"][WORKSPACE_LABEL]).is_relative_to(tmp_path):
            with contextlib.suppress(docker.errors.APIError):
                volume.remove(force=True)


@pytest.fixture(scope="module")
def stub(podman: docker.DockerClient) -> Iterator[Upstream]:
    """The stub Messages API on a network of the tests' own on Podman, which only gates join; the images built
    first (with Podman's builder), as a first start would."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DOCKER_HOST", SOCKET)
        _, gate_image = build_test_images(podman)
    name = f"claude-bottle-test-{secrets.token_hex(3)}"
    network = podman.networks.create(name, driver="bridge", labels={TEST_LABEL: "1"})
    try:
        stub_container(open_engine(podman), gate_image, name, "stub", f"{name}-stub", {TEST_LABEL: "1"})
        network.reload()
        yield Upstream(name, "http://stub:8000", podman.containers.get(f"{name}-stub"), "",
                       network.attrs["IPAM"]["Config"][0]["Subnet"])
    finally:
        with contextlib.suppress(docker.errors.APIError):
            podman.containers.get(f"{name}-stub").remove(force=True)
        network.remove()


def test_the_cli_killed_outright_leaves_no_container_of_its_run_on_podman(
        podman: docker.DockerClient, stub: Upstream, token: str, workspace: Path) -> None:
    with mid_run(podman, stub, "podman-killed", workspace, engine=SOCKET) as (process, run_id):
        os.kill(process.pid, signal.SIGKILL)
        killed = time.monotonic()
        assert gone_within(podman, "podman-killed", GONE_SECONDS) == [], "the run's containers outlived the CLI"
        assert time.monotonic() - killed < GONE_SECONDS
    assert records.find(run_id).run == run_id, "its audit is kept on the host"


def test_the_gate_stops_on_podman_when_the_host_is_gone_with_its_reaper(
        podman: docker.DockerClient, stub: Upstream, token: str, workspace: Path) -> None:
    """Podman keeps the gate's standard input open: the beats' end stops it (``--stdin-heartbeat``)."""
    with mid_run(podman, stub, "podman-killed-all", workspace, engine=SOCKET) as (process, run_id):
        gate = podman.containers.get(f"claude-bottle-{run_id}-gate")
        os.kill(reaper_of(run_id), signal.SIGKILL)
        os.kill(process.pid, signal.SIGKILL)
        killed = time.monotonic()
        assert exited_within(gate, GONE_SECONDS) == "exited", "the gate outlived the host that started it"
        assert time.monotonic() - killed < GONE_SECONDS
        bottle = podman.containers.get(f"claude-bottle-{run_id}-bottle")
        # "stopped": Podman's word for an exited container whose clean-up is still under way
        assert exited_within(bottle, BOTTLE_GONE_SECONDS) in ("exited", "stopped"), "the bottle outlived its gate"


def test_the_gate_killed_mid_run_ends_the_command_with_its_error_on_podman(
        podman: docker.DockerClient, stub: Upstream, token: str, workspace: Path) -> None:
    """The gate's attached stream ends with it on Podman too: the run does not wait on a bottle with no peer."""
    with mid_run(podman, stub, "podman-gate-killed", workspace, engine=SOCKET) as (process, run_id):
        podman.containers.get(f"claude-bottle-{run_id}-gate").kill()
        ended = time.monotonic()
        _, stderr = process.communicate(timeout=GONE_SECONDS + 30)
        assert time.monotonic() - ended < GONE_SECONDS, "the command hung on"
        assert process.returncode == EXIT_GATE
        assert "the gate stopped while the run went on" in stderr.decode()
        assert gone_within(podman, "podman-gate-killed", 1) == [], "the bottle is removed, and the rest of the run"
    assert records.find(run_id).run == run_id, "its audit is kept on the host"
