"""Bottles on rootless Podman, run by the ordinary user who owns it, against that user's socket
(``podman system service`` at ``$XDG_RUNTIME_DIR/podman/podman.sock``; ``scripts/podman --rootless USER`` sets
it up, and scripts/test-as-user runs these tests as that user).

Rootless Podman keeps its networks in a network namespace of its own, reached from outside through
slirp4netns, with aardvark-dns as the resolver on its bridges. The attacks: verify's whole set (which looks
up names straight at every resolver in reach and tries slirp4netns's way to the host's loopback), the bottle's
bridge without an address in that namespace, the gate asked for the host's loopback by an agent that allows
it, and whose files the bottle's are on the host."""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import docker
import docker.errors
import pytest

from claude_bottle.agent.load import load_agent
from claude_bottle.credentials import Credential
from claude_bottle.gate.settings import parse_upstream
from claude_bottle.launch import Launch, started
from claude_bottle.runtime.engines import open_engine
from claude_bottle.runtime.names import WORKSPACE_LABEL
from claude_bottle.runtime.pool import BRIDGE_PREFIX
from claude_bottle.runtime.run import Run
from claude_bottle.verify.network import SLIRP_HOST
from claude_bottle.verify.standins import in_bottle as inside
from claude_bottle.verify.standins import stub_container
from tests.bottle.conftest import TEST_LABEL, Upstream, build_test_images, leftovers, podman_client, write_agent

pytestmark = [pytest.mark.docker, pytest.mark.podman, pytest.mark.rootless]
CLI = [sys.executable, "-P", "-m", "claude_bottle"]
RUNTIME_DIR = os.environ.get("XDG_RUNTIME_DIR") or f"/run/user/{os.getuid()}"
SOCKET = os.environ.get("CLAUDE_BOTTLE_TEST_PODMAN_ROOTLESS", f"unix://{RUNTIME_DIR}/podman/podman.sock")


@pytest.fixture(scope="module")
def rootless() -> Iterator[docker.DockerClient]:
    """The user's rootless Podman. As root there is none to test (root's Podman is rootful: test_podman.py);
    without its socket the tests are skipped visibly, and under CI (CI=true) they fail."""
    if os.geteuid() == 0:
        pytest.skip("rootless Podman is an ordinary user's engine: scripts/test-as-user runs these tests as that user")
    client = podman_client(SOCKET, "rootless Podman", "scripts/podman --rootless USER")
    yield client
    client.close()


@pytest.fixture(autouse=True)
def forget_state_volumes(rootless: docker.DockerClient, tmp_path: Path) -> Iterator[None]:
    """The Claude state volumes of this test's workspaces, on this engine (the conftest's are Docker's)."""
    yield
    for volume in rootless.volumes.list(filters={"label": WORKSPACE_LABEL}):
        if Path(volume.attrs["Labels"][WORKSPACE_LABEL]).is_relative_to(tmp_path):
            with contextlib.suppress(docker.errors.APIError):
                volume.remove(force=True)


@pytest.fixture(scope="module")
def stub(rootless: docker.DockerClient) -> Iterator[Upstream]:
    """The stub Messages API on a network of the tests' own on this engine, which only gates join; the images
    are built first (with this engine's builder), as a first start would."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DOCKER_HOST", SOCKET)
        _, gate_image = build_test_images(rootless)
    name = f"claude-bottle-test-{secrets.token_hex(3)}"
    network = rootless.networks.create(name, driver="bridge", labels={TEST_LABEL: "1"})
    containers = []
    try:
        stub_container(open_engine(rootless), gate_image, name, "stub", f"{name}-stub", {TEST_LABEL: "1"})
        containers.append(rootless.containers.get(f"{name}-stub"))
        network.reload()
        yield Upstream(name, "http://stub:8000", containers[0], "", network.attrs["IPAM"]["Config"][0]["Subnet"])
    finally:
        for container in containers:
            container.remove(force=True)
        network.remove()


def on_rootless(*args: str, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """The CLI against the rootless socket, with the test's config and state homes (the ``token`` fixture's)."""
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout, cwd=cwd,
                          env={**os.environ, "DOCKER_HOST": SOCKET})


def headless(*args: str, upstream: Upstream) -> list[str]:
    return [*CLI, "run", *args, "--upstream", upstream.url, "--upstream-network", upstream.network]


def test_doctor_says_rootless_and_names_the_limits_it_cannot_enforce(
    rootless: docker.DockerClient, token: str, tmp_path: Path,
) -> None:
    result = on_rootless("doctor", cwd=tmp_path)
    assert f"ok  engine: Podman {rootless.version()['Version']}, rootless ({SOCKET})" in result.stdout, result.stdout
    info = rootless.api.get(f"{rootless.api.base_url}/v4.0.0/libpod/info").json()["host"]
    delegated = set(info["cgroupControllers"] or []) if info["cgroupVersion"] == "v2" else set()
    unenforced = [name for name, controller in (("memory", "memory"), ("CPU", "cpu"), ("process", "pids"))
                  if controller not in delegated]
    limits = [line for line in result.stdout.splitlines() if "does not enforce the bottle's" in line]
    if unenforced:  # on cgroup v1 (as on the test machine) rootless Podman ignores every limit: said, not hidden
        assert len(limits) == 1 and limits[0].startswith("NO  ") and all(n in limits[0] for n in unenforced)
    else:
        assert limits == []


def test_verify_blocks_every_attack_on_rootless_podman_and_leaves_nothing(
    rootless: docker.DockerClient, stub: Upstream, token: str, tmp_path: Path,
) -> None:
    def volumes() -> set[str]:
        return {v.name for v in rootless.volumes.list(filters={"label": "claude-bottle.agent=default"})}

    before = volumes()
    result = on_rootless("verify", "--json", cwd=tmp_path)
    assert result.stdout, result.stderr
    report = json.loads(result.stdout)
    assert [r["attack"] for r in report["results"] if not r["blocked"]] == []
    assert result.returncode == 0, result.stderr
    assert report["attacks"] >= 100
    attacks = [r["attack"] for r in report["results"]]
    # What rootless Podman adds to the ways out, each attacked: its resolver, slirp4netns, IPv6 on the link.
    assert any(a.startswith("a lookup of ") for a in attacks)
    assert sum(a.startswith("DNS for ") and "straight to" in a for a in attacks) >= 3
    assert any(a.startswith(f"TCP to {SLIRP_HOST}:") for a in attacks)
    assert "IPv6 on the link (all-nodes multicast)" in attacks
    records = list((tmp_path / "state" / "claude-bottle" / "runs").glob("*/audit.jsonl"))
    assert records and any(r.stat().st_size > 0 for r in records), "no gate's audit was kept"
    assert leftovers(rootless, "default") == []
    assert volumes() <= before, "verify's scratch projects' Claude state is removed"


def test_run_p_answers_through_the_gate_and_what_the_bottle_writes_is_the_users(
    rootless: docker.DockerClient, stub: Upstream, token: str, workspace: Path,
) -> None:
    """The bottle runs as the user's own uid on the host (keep-id): the workspace is writable, and what it
    writes there the user owns and can remove; the gate got the real token."""
    write_agent("rootless-headless", "")
    result = subprocess.run(headless("rootless-headless", "-p", "run: id -u > /workspace/uid", upstream=stub),
                            capture_output=True, text=True, timeout=600, cwd=workspace,
                            env={**os.environ, "DOCKER_HOST": SOCKET})
    assert result.returncode == 0, result.stderr
    assert "Tool said: (Bash completed with no output)" in result.stdout  # the stub's model ran the command
    written = workspace / "uid"
    assert written.read_text() == f"{os.getuid()}\n" and written.stat().st_uid == os.getuid()
    written.unlink()
    seen = [r for r in stub.requests() if r["target"].startswith("/v1/messages")]
    assert seen and all(["authorization", f"Bearer {token}"] in [[n.lower(), v] for n, v in r["headers"]]
                        for r in seen)
    assert leftovers(rootless, "rootless-headless") == []


@pytest.mark.parametrize("after", [1.0, 4.0])
def test_ctrl_c_during_run_p_leaves_nothing_behind(
    rootless: docker.DockerClient, stub: Upstream, token: str, workspace: Path, after: float,
) -> None:
    agent = f"rootless-interrupted-{secrets.token_hex(3)}"
    write_agent(agent, "")
    process = subprocess.Popen(headless(agent, "-p", "say hi", upstream=stub), cwd=workspace,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               env={**os.environ, "DOCKER_HOST": SOCKET})
    time.sleep(after)
    process.send_signal(signal.SIGINT)
    process.wait(120)
    assert leftovers(rootless, agent) == []


@contextlib.contextmanager
def sleeping_bottle(rootless: docker.DockerClient, stub: Upstream, agent: str, body: str, token: str,
                    workspace: Path, keep: bool = False) -> Iterator[Run]:
    write_agent(agent, body)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DOCKER_HOST", SOCKET)
        launch = Launch(load_agent(agent, workspace), workspace, Credential.parse(token, "test"),
                        parse_upstream(stub.url), (stub.network,))
        with started(launch, lambda line: None, keep=keep) as run:
            run.create_bottle(["sleep", "600"], tty=False)
            run.engine.start(run.names.bottle)
            yield run


def test_stop_removes_a_kept_bottle_and_keeps_its_audit(
    rootless: docker.DockerClient, stub: Upstream, token: str, workspace: Path,
) -> None:
    with sleeping_bottle(rootless, stub, "rootless-kept", "", token, workspace, keep=True) as run:
        run_id = run.id
    assert leftovers(rootless, "rootless-kept"), "start --keep leaves the run up"
    stopped = on_rootless("stop", "rootless-kept", cwd=workspace)
    assert stopped.returncode == 0 and run_id in stopped.stdout, stopped.stderr
    assert leftovers(rootless, "rootless-kept") == []
    assert Path(os.environ["XDG_STATE_HOME"], "claude-bottle", "runs", run_id, "audit.jsonl").is_file()


def in_rootless_namespace(*command: str) -> str:
    """``command`` in rootless Podman's network namespace (where its bridges are), as this user."""
    return subprocess.run(["podman", "unshare", "--rootless-netns", *command], capture_output=True, text=True,
                          check=True, timeout=60).stdout


@pytest.fixture
def host_loopback() -> Iterator[socket.socket]:
    """A listener on this host's loopback only: what slirp4netns's host address would lead to."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        listener.setblocking(False)
        yield listener


def test_the_bottle_reaches_nothing_of_podmans_namespace_and_the_gate_not_the_hosts_loopback(
    rootless: docker.DockerClient, stub: Upstream, token: str, workspace: Path, host_loopback: socket.socket,
) -> None:
    """The agent allows the host's loopback as slirp4netns would offer it (10.0.2.2, private on purpose). The
    bottle's bridge has no address in rootless Podman's namespace and no resolver listens for it there; the
    gate, asked through its proxy, cannot reach the host's loopback (slirp4netns runs with its host loopback
    off, Podman's default); nothing arrives at a listener there."""
    port = host_loopback.getsockname()[1]
    body = (f'allow = ["{SLIRP_HOST}:{port}"]\nallow_tcp = ["{SLIRP_HOST}:{port}"]\n'
            f'allow_private = ["{SLIRP_HOST}/32"]\n')
    with sleeping_bottle(rootless, stub, "rootless-netns", body, token, workspace) as run:
        bridge = f"{BRIDGE_PREFIX}{run.hex}"
        addresses = in_rootless_namespace("ip", "-o", "addr", "show", "dev", bridge)
        assert bridge in addresses and " inet " not in addresses, addresses
        assert run.internal is not None
        subnet = ipaddress.ip_network(run.internal.subnets[0])
        resolvers = [line.split()[3].rsplit(":", 1)[0]
                     for line in in_rootless_namespace("ss", "-Hlnu", "sport", "=", "53").splitlines()]
        assert resolvers, "aardvark-dns answers the gate's other networks"
        assert [a for a in resolvers if a != "*" and ipaddress.ip_address(a.strip("[]")) in subnet] == []
        code, answer = inside(run, f"curl -sS -m 20 -o /dev/null -w '%{{http_code}}' http://{SLIRP_HOST}:{port}/")
        assert answer.strip() == "502", answer  # the gate dialled and got nowhere
        code, answer = inside(run, f"curl -sS -m 10 --noproxy '*' http://{SLIRP_HOST}:{port}/")
        assert code != 0, answer
        code, names = inside(run, "cat /etc/resolv.conf")
        assert f"nameserver {run.gate_ip}" in names and names.count("nameserver") == 1, names
    with pytest.raises(BlockingIOError):
        host_loopback.accept()
    assert leftovers(rootless, "rootless-netns") == []
