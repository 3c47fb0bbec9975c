"""Fixtures for bottles on a real Docker engine: images built once, and a stub Messages API in a container
on a network of the tests' own that only a gate joins."""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import time
import tomllib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker
import docker.errors
import pexpect
import pytest

from claude_bottle import tokens
from claude_bottle.agent.schema import AgentConfig, parse_agent
from claude_bottle.credentials import Credential
from claude_bottle.errors import DockerError
from claude_bottle.gate.settings import parse_upstream
from claude_bottle.launch import Launch, build_images, started
from claude_bottle.runtime.docker_api import connect
from claude_bottle.runtime.engines import open_engine
from claude_bottle.runtime.names import WORKSPACE_LABEL
from claude_bottle.runtime.run import Run
from claude_bottle.stub import DEFAULT_TEXT
from claude_bottle.verify.standins import stub_container
from tests.helpers import make_token
from tests.prerequisites import missing

TEST_LABEL = "claude-bottle.test"


@pytest.fixture(scope="session")
def client() -> docker.DockerClient:
    """The engine; without one the tests are skipped visibly, and under CI (CI=true) they fail."""
    try:
        return connect()
    except DockerError as exc:
        missing(f"no Docker engine: {exc}", "scripts/test installs and starts one")


def claude_version() -> str:
    """The Claude Code release in the tests' bottles: $CLAUDE_BOTTLE_TEST_CLAUDE_VERSION (scripts/test runs a
    share of the tests again on the newest release), else the default."""
    return os.environ.get("CLAUDE_BOTTLE_TEST_CLAUDE_VERSION") or AgentConfig().claude_version


def build_test_images(client: docker.DockerClient, packages: tuple[str, ...] = ()) -> tuple[str, str]:
    """The tests' (bottle image, gate image) on ``client``'s engine, built where missing: Claude Code
    ``claude_version()``, and ``packages`` (Debian's) added to the bottle image."""
    agent = AgentConfig(claude_version=claude_version(), extra_packages=packages)
    return build_images(open_engine(client), agent, lambda line: None)


ImagesFor = Callable[..., tuple[str, str]]


@pytest.fixture(scope="session")
def images_for(client: docker.DockerClient) -> ImagesFor:
    """``images_for(*packages)``: the tests' images with ``packages`` in the bottle image (none: the default
    images), built once a session for each set; every bottle test gets its images here."""
    built: dict[tuple[str, ...], tuple[str, str]] = {}

    def images(*packages: str) -> tuple[str, str]:
        if packages not in built:
            built[packages] = build_test_images(client, packages)
        return built[packages]

    return images


@pytest.fixture(scope="session")
def built_images(images_for: ImagesFor) -> tuple[str, str]:
    """The default (bottle image, gate image): ``images_for()``."""
    return images_for()


@dataclass
class Upstream:
    """The stub Messages API and a second stub as an egress target, on the tests' own network."""

    network: str
    url: str
    stub: Any
    target_ip: str
    subnet: str

    def requests(self) -> list[dict[str, Any]]:
        lines = self.stub.logs(stdout=True, stderr=False).decode().splitlines()
        return [json.loads(line) for line in lines if line.startswith("{")]


@pytest.fixture(scope="session")
def upstream(client: docker.DockerClient, built_images: tuple[str, str]) -> Iterator[Upstream]:
    _, gate_image = built_images
    name = f"claude-bottle-test-{secrets.token_hex(3)}"
    network = client.networks.create(name, driver="bridge", labels={TEST_LABEL: "1"})
    containers = []
    try:
        for alias in ("stub", "target"):
            stub_container(open_engine(client), gate_image, name, alias, f"{name}-{alias}", {TEST_LABEL: "1"})
            containers.append(client.containers.get(f"{name}-{alias}"))
        network.reload()
        target = containers[1]
        target.reload()
        yield Upstream(name, "http://stub:8000", containers[0],
                       target.attrs["NetworkSettings"]["Networks"][name]["IPAddress"],
                       network.attrs["IPAM"]["Config"][0]["Subnet"])
    finally:
        for container in containers:
            container.remove(force=True)
        network.remove()


@pytest.fixture(autouse=True)
def forget_state_volumes(client: docker.DockerClient, tmp_path: Path) -> Iterator[None]:
    """State volumes outlive runs by design; a test's own (those of workspaces in its tmp_path) are removed
    after it, and no other: on an engine shared with other test runs, theirs are in use or about to be."""
    yield
    for volume in client.volumes.list(filters={"label": WORKSPACE_LABEL}):
        if Path(volume.attrs["Labels"][WORKSPACE_LABEL]).is_relative_to(tmp_path):
            with contextlib.suppress(docker.errors.APIError):
                volume.remove(force=True)


@pytest.fixture
def token(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> str:
    """A fresh OAuth token in the environment, and config and state homes of the test's own."""
    value = "sk-ant-oat01-" + secrets.token_urlsafe(60)
    monkeypatch.setenv("CLAUDE_BOTTLE_OAUTH_TOKEN", value)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    return value


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    path = tmp_path / "project"
    (path / ".git" / "hooks").mkdir(parents=True)
    (path / ".git" / "config").write_text("[core]\n")
    path.chmod(0o777)  # the agent user (uid 1000) writes here
    return path


def bottle_runtime() -> str:
    """The OCI runtime the bottle tests give their agents: $CLAUDE_BOTTLE_TEST_RUNTIME (scripts/test runs a
    share of them again with runsc, gVisor), else the engine's default."""
    return os.environ.get("CLAUDE_BOTTLE_TEST_RUNTIME", "")


def write_agent(name: str, body: str) -> None:
    """An agent of the test's own, on ``bottle_runtime()`` unless the body names a runtime."""
    agents = Path(os.environ["XDG_CONFIG_HOME"], "claude-bottle", "agents")
    agents.mkdir(parents=True, exist_ok=True)
    runtime = f'runtime = "{bottle_runtime()}"\n' if bottle_runtime() and "runtime =" not in body else ""
    claude = f'\n[claude]\nversion = "{claude_version()}"\n' if "[claude]" not in body else ""
    (agents / f"{name}.toml").write_text("version = 1\n" + runtime + body + claude)


def on_screen(text: str) -> str:
    """A pattern for ``text`` as a terminal program draws it: spaces may be cursor moves, relative (ESC [ n C)
    or to a column (ESC [ n G, as Claude Code draws from about 2.1.190)."""
    return r"(?:\s|\x1b\[\d*[CG])+".join(re.escape(word) for word in text.split())


def in_terminal(command: list[str], cwd: Path, env: dict[str, str]) -> pexpect.spawn:
    """``command`` on a pseudo-terminal, once interactive Claude Code in it has answered a prompt."""
    child = pexpect.spawn(command[0], command[1:], cwd=str(cwd), env=env, timeout=120, dimensions=(40, 140),
                          encoding="utf-8", codec_errors="replace")
    child.expect(on_screen("bypass permissions on"))
    child.send("say hi")
    time.sleep(0.5)
    child.send("\r")
    child.expect(on_screen(DEFAULT_TEXT))
    return child


def leftovers(client: docker.DockerClient, agent: str) -> list[str]:
    """Containers and networks of an agent's runs still present. A container removed between the engine's list
    and its inspection (what the callers wait for) is not one."""
    flt = {"label": f"claude-bottle.agent={agent}"}
    return [c.name for c in client.containers.list(all=True, filters=flt, ignore_removed=True)] + \
        [n.name for n in client.networks.list(filters=flt)]


@contextlib.contextmanager
def bottle_against(client: docker.DockerClient, upstream: Upstream, name: str, agent_toml: str, home: Path,
                   upstream_ca_files: tuple[Path, ...], env: dict[str, str] | None = None) -> Iterator[Run]:
    """A sleeping bottle of agent ``name`` (``agent_toml``) on a workspace of its own under ``home``, its gate
    trusting ``upstream_ca_files`` toward the tests' servers on ``upstream``'s network; its credential routes
    read with ``env`` set. Removed on the way out, leaving nothing."""
    workspace = home / "project"
    (workspace / ".git").mkdir(parents=True)
    workspace.chmod(0o777)
    with pytest.MonkeyPatch.context() as patch:
        for variable, value in {"XDG_CONFIG_HOME": str(home / "config"), "XDG_STATE_HOME": str(home / "state"),
                                **(env or {})}.items():
            patch.setenv(variable, value)
        agent = parse_agent(name, tomllib.loads(agent_toml), "test")
        launch = Launch(agent, workspace, Credential.parse(make_token(), "test"), parse_upstream(upstream.url),
                        (upstream.network,), upstream_ca_files=upstream_ca_files, routes=tokens.routes_for(agent.credentials))
        with started(launch, lambda line: None) as run:
            run.create_bottle(["sleep", "900"], tty=False)
            run.engine.start(run.names.bottle)
            yield run
    assert leftovers(client, name) == []


def podman_client(socket: str, name: str, setup: str) -> docker.DockerClient:
    """A client of ``name`` (a Podman service) at ``socket``; without it the test is skipped visibly (``setup``
    says what starts it), and under CI (CI=true) it fails."""
    try:
        client = docker.DockerClient(base_url=socket, timeout=120)
        client.ping()
    except docker.errors.DockerException as exc:
        missing(f"no {name} service at {socket}: {exc}", f"{setup} starts one")
    return client


PODMAN_SOCKET = os.environ.get("CLAUDE_BOTTLE_TEST_PODMAN", "unix:///run/podman/podman.sock")  # rootful Podman


@pytest.fixture(scope="module")
def podman() -> Iterator[docker.DockerClient]:
    """A client of the rootful Podman service (scripts/podman sets it up)."""
    client = podman_client(PODMAN_SOCKET, "Podman", "scripts/podman")
    yield client
    client.close()


def gate_log(run: Run, stdout: bool = True, stderr: bool = True) -> str:
    """What the run's gate has written so far: its messages on standard output, its audit on standard error."""
    return b"".join(run.engine.logs(run.names.gate, stdout=stdout, stderr=stderr)).decode("utf-8", "replace")


def gate_audit(run: Run) -> list[dict[str, Any]]:
    """The audit lines the run's gate has written so far."""
    return [json.loads(line) for line in gate_log(run, stdout=False).splitlines() if line.startswith("{")]


# Runs as root in a container sharing the gate's network namespace: prints every UDP datagram (DNS, whether to
# the engine's resolver on loopback or past it) seen on any of the gate's interfaces, as hex, one per line.
_SNIFF = """
import socket
sniffer = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0003))
print("listening", flush=True)
while True:
    frame = sniffer.recv(65535)
    kind = frame[12:14]
    if (kind == b"\\x08\\x00" and frame[23] == 17) or (kind == b"\\x86\\xdd" and frame[20] == 17):
        print(frame.hex(), flush=True)
"""


class GateDatagrams:
    """The UDP datagrams a run's gate sends or receives: where its name lookups would show."""

    def __init__(self, container: Any) -> None:
        self.container = container

    def carrying(self, text: str) -> int:
        """How many of the datagrams seen so far hold ``text``."""
        lines = self.container.logs(stderr=False).decode().split()
        return sum(text.encode() in bytes.fromhex(line) for line in lines if line != "listening")


@contextlib.contextmanager
def gate_datagrams(client: docker.DockerClient, run: Run, image: str) -> Iterator[GateDatagrams]:
    """A packet capture in the gate's network namespace, from a container of ``image`` (the gate image: its
    Python) beside it, for as long as the context lasts."""
    gate = client.containers.get(run.names.gate)
    sniffer = client.containers.run(image, entrypoint=["/opt/gate/bin/python", "-c", _SNIFF], user="0",
                                    network_mode=f"container:{gate.id}", cap_add=["NET_RAW"], detach=True,
                                    labels={TEST_LABEL: "1"}, name=f"{run.names.gate}-sniffer")
    try:
        deadline = time.monotonic() + 30
        while b"listening" not in sniffer.logs() and time.monotonic() < deadline:
            time.sleep(0.2)
        yield GateDatagrams(sniffer)
    finally:
        sniffer.remove(force=True)
