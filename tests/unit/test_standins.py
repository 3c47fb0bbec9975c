"""verify's stand-ins and its probe through the engine seam: what the engine is asked for (on the in-memory
engine), and how the Docker and Podman implementations pass on what those containers need."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import docker
import pytest
import requests
from docker.models.containers import ContainerCollection

from claude_bottle.agent.schema import parse_agent
from claude_bottle.credentials import Credential
from claude_bottle.errors import DockerError, GateError
from claude_bottle.launch import Launch, interrupt, on_stop_signals, run_spec
from claude_bottle.runtime import podman_engine
from claude_bottle.runtime.docker_engine import DockerEngine
from claude_bottle.runtime.docker_values import create_options
from claude_bottle.runtime.podman_engine import PodmanEngine
from claude_bottle.runtime.removal import remove_run
from claude_bottle.runtime.run import Run
from claude_bottle.runtime.seam import ContainerSpec, NetworkSpec
from claude_bottle.verify import standins
from claude_bottle.verify.standins import (
    MCP_STAND_IN,
    StandIn,
    Verification,
    engine_view,
    in_bottle,
    run_probe,
    stand_ins,
    stub_container,
)
from tests.fake_engine import FakeEngine
from tests.helpers import make_token

STUB_ENTRYPOINT = ("/opt/gate/bin/python", "-m", "claude_bottle", "stub-upstream")


class StubEngine(FakeEngine):
    """Its containers write what a stand-in writes once it listens, and then one request, when started;
    ``exits`` names those that exit at once instead."""

    def __init__(self) -> None:
        super().__init__()
        self.exits: set[str] = set()

    def start(self, name: str) -> None:
        super().start(name)
        if name in self.exits:
            self.containers_by_name[name] = dataclasses.replace(self.containers_by_name[name], status="exited")
            self.output[name] = b"Traceback: no such file\n"
        else:
            self.output[name] = b'stub upstream on http://stub:8000\n{"target": "/v1/messages", "headers": []}\n'


@pytest.fixture
def engine() -> StubEngine:
    engine = StubEngine()
    engine.create_network(NetworkSpec("outside", {"claude-bottle": "1"}, internal=True, bridge="stand-1"))
    return engine


def test_a_stand_in_is_started_from_the_gate_image_known_by_its_alias(engine: StubEngine, tmp_path: Path) -> None:
    stub = stub_container(engine, "gate:1", "outside", "stub", "verify-stub", {"claude-bottle": "1"})
    spec = engine.specs["verify-stub"]
    assert spec.entrypoint[:4] == STUB_ENTRYPOINT and spec.entrypoint[4:] == ("--listen", "stub:8000", "--log")
    assert (spec.network, spec.aliases, spec.read_only, spec.binds) == ("outside", ("stub",), True, ())
    assert stub == StandIn(engine, "verify-stub", engine.address("verify-stub", "outside")) and stub.address
    assert stub.requests() == [{"target": "/v1/messages", "headers": []}]
    chain = tmp_path / "leaf.pem"
    stub_container(engine, "gate:1", "outside", "inspected", "verify-inspected", {}, chain)
    tls = engine.specs["verify-inspected"]
    assert tls.entrypoint[4:] == ("--listen", "inspected:8443", "--log", "--tls", "/opt/stub/tls.pem")
    assert tls.binds == ((str(chain), "/opt/stub/tls.pem", True),)
    stub_container(engine, "gate:1", "outside", "tracker", "verify-tracker", {}, chain, MCP_STAND_IN)
    assert engine.specs["verify-tracker"].entrypoint == (
        "/opt/gate/bin/python", "-m", "claude_bottle.verify.mcp_server", "--listen", "tracker:8443", "--log", "--tls",
        "/opt/stub/tls.pem")


def test_a_stand_in_that_exits_before_it_listens_says_what_it_wrote(engine: StubEngine) -> None:
    engine.exits.add("verify-canary")
    with pytest.raises(GateError, match="the canary container did not start: Traceback: no such file"):
        stub_container(engine, "gate:1", "outside", "canary", "verify-canary", {})


class ProbeEngine(StubEngine):
    """The bottle's commands and the probe as the engine runs them: the probe prints one outcome."""

    def __init__(self) -> None:
        super().__init__()
        self.waited: list[tuple[str, float | None]] = []
        self.on_exec = lambda name, argv: (0, f"{name}: {argv[-1]}".encode())

    def wait(self, name: str, timeout: float | None = None) -> int:
        self.waited.append((name, timeout))
        self.output[name] = b'{"group": "g", "attack": "a", "expected": "e", "actual": "x", "blocked": true}\n'
        return super().wait(name, timeout)


def verification(engine: FakeEngine, workspace: Path) -> Verification:
    agent = parse_agent("dev", {"version": 1}, "dev.toml")
    spec = run_spec(Launch(agent, workspace, Credential.parse(make_token(), "t")), "bottle:1", "gate:1", "1000:1000")
    target = Verification.__new__(Verification)
    target.run, target.gate_image = Run(spec, engine), "gate:1"
    return target


def test_the_probe_joins_the_bottles_network_namespace_as_its_user_and_is_removed(tmp_path: Path) -> None:
    engine = ProbeEngine()
    target = verification(engine, tmp_path)
    run = target.run
    engine.add_container(run.names.bottle, run.labels)
    output = run_probe(target, {"gate": "10.0.0.2"})
    probe = run.names.container("probe")
    spec = engine.specs[probe]
    assert spec.entrypoint[:3] == ("/opt/gate/bin/python", "-m", "claude_bottle.verify.probe")
    assert json.loads(spec.entrypoint[3]) == {"gate": "10.0.0.2"}
    assert (spec.network_of, spec.network, spec.user, spec.read_only) == (run.names.bottle, "", "1000:1000", True)
    assert spec.labels == run.labels
    assert engine.waited == [(probe, 120)] and '"attack": "a"' in output
    assert engine.container(probe) is None, "removed once it has run"


def test_commands_run_in_the_bottle_by_its_name_and_the_engine_view_shows_both_containers(tmp_path: Path) -> None:
    engine = ProbeEngine()
    run = verification(engine, tmp_path).run
    for name in (run.names.bottle, run.names.gate):
        engine.add_container(name, run.labels)
    assert in_bottle(run, "cat", stdin="x") == (0, f"{run.names.bottle}: cat <<'__CLAUDE_BOTTLE_END__'\nx\n"
                                                   "__CLAUDE_BOTTLE_END__")
    shown = engine_view(run)
    assert f'"/{run.names.bottle}"' in shown and f'"/{run.names.gate}"' in shown


def test_an_engine_refusing_the_probe_is_said_as_verifys(tmp_path: Path) -> None:
    engine = ProbeEngine()
    target = verification(engine, tmp_path)
    engine.fail.add("create_container")
    with pytest.raises(DockerError, match=r"^verify: create_container failed"):
        run_probe(target, {})

class DaemonEngine(ProbeEngine):
    """Ctrl-C reaches the CLI while the engine creates a container, and the engine finishes the create
    anyway, some time later, as a daemon does."""

    def __init__(self) -> None:
        super().__init__()
        self.creating: list[threading.Thread] = []

    def create_container(self, spec: ContainerSpec) -> Any:
        creating = threading.Thread(target=lambda: (time.sleep(0.2), ProbeEngine.create_container(self, spec)))
        self.creating.append(creating)
        creating.start()
        os.kill(os.getpid(), signal.SIGINT)
        creating.join()
        return self.container(spec.name)


@pytest.mark.parametrize("created", ["probe", "stand-in"])
def test_a_ctrl_c_while_the_engine_creates_leaves_nothing_once_removed(created: str, tmp_path: Path) -> None:
    """The removal on the way out lists the run's containers: one the engine was still creating then would
    outlive it."""
    engine = DaemonEngine()
    target = verification(engine, tmp_path)
    run = target.run
    engine.add_container(run.names.bottle, run.labels)
    with pytest.raises(KeyboardInterrupt), on_stop_signals(interrupt):  # as verify (Ctrl-C may be ignored here)
        if created == "probe":
            run_probe(target, {})
        else:
            stub_container(engine, "gate:1", "", "stub", run.names.container("stub"), run.labels)
    remove_run(engine, run.id)
    for creating in engine.creating:
        creating.join()
    assert engine.containers() == []


def test_a_network_the_engine_will_not_remove_is_named_and_the_report_still_comes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Docker 20.10 now and then keeps counting an endpoint it cannot name: verify's findings are not lost to it."""
    engine = StubEngine()
    said: list[str] = []
    monkeypatch.setattr(standins, "open_engine", lambda: engine)
    monkeypatch.setattr(standins, "build_images", lambda *args: ("bottle:1", "gate:1"))
    with stand_ins(parse_agent("dev", {"version": 1}, "dev.toml"), said.append) as env:  # ends without raising
        engine.stale[env.outside] = {"a gone container it cannot name"}
    assert engine.containers() == []
    assert [n.name for n in engine.networks("claude-bottle")] == [env.outside]
    assert said[-1] == f"verify could not remove all it started: network {env.outside} has active endpoints"


# ---- the Docker and Podman implementations -------------------------------------------------------------------


def test_an_entrypoint_aliases_and_another_containers_network_become_the_sdks_arguments() -> None:
    stub = create_options(ContainerSpec("gate:1", "s", {}, entrypoint=("python", "-m", "x"), network="outside",
                                        aliases=("stub",)))
    assert (stub["entrypoint"], stub["network"]) == (["python", "-m", "x"], "outside")
    assert stub["networking_config"] == {"outside": {"Aliases": ["stub"]}}
    probe = create_options(ContainerSpec("gate:1", "p", {}, network_of="claude-bottle-dev-1-bottle"))
    assert probe["network_mode"] == "container:claude-bottle-dev-1-bottle"
    assert "network" not in probe and "networking_config" not in probe


def offline_client() -> docker.DockerClient:
    """An SDK client that never connects (its API version given): its calls are replaced by the tests."""
    return docker.DockerClient(base_url="unix:///nonexistent/docker.sock", version="1.41")


class Made:
    """What the SDK hands back for a container it created."""

    def __init__(self) -> None:
        self.id, self.name, self.status = "c1", "p", "created"
        self.labels: dict[str, str] = {}
        self.attrs: dict[str, Any] = {}


@pytest.mark.parametrize(("rootless", "spec", "userns"), [
    (True, ContainerSpec("gate:1", "p", {}, network_of="bottle"), "container:bottle"),  # the bottle's mapping
    (False, ContainerSpec("gate:1", "p", {}, network_of="bottle"), ""),
    (True, ContainerSpec("bottle:1", "b", {}, host_user=True), "keep-id"),
    (True, ContainerSpec("gate:1", "s", {}, network="outside"), ""),
])
def test_on_rootless_podman_the_probe_joins_the_bottles_user_namespace_too(
    rootless: bool, spec: ContainerSpec, userns: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    client, modes = offline_client(), []

    def in_userns(client: docker.DockerClient, image: str, mode: str, options: dict[str, Any]) -> Made:
        modes.append(mode)
        return Made()

    monkeypatch.setattr(podman_engine, "create_in_userns", in_userns)
    def create(self: ContainerCollection, image: str, **options: Any) -> Made:
        modes.append("")
        return Made()

    monkeypatch.setattr(ContainerCollection, "create", create)  # the client makes a collection at each use
    PodmanEngine(client, rootless=rootless).create_container(spec)
    assert modes == [userns]


def test_a_wait_that_times_out_is_an_engine_error_naming_the_container(monkeypatch: pytest.MonkeyPatch) -> None:
    client = offline_client()

    def wait(name: str, timeout: float | None = None) -> dict[str, int]:
        raise requests.exceptions.ReadTimeout("read timed out")

    monkeypatch.setattr(client.api, "wait", wait)
    with pytest.raises(DockerError, match="probe did not exit within 120 s"):
        DockerEngine(client).wait("probe", timeout=120)
    with pytest.raises(requests.exceptions.ReadTimeout):  # no timeout asked for: the engine went away
        DockerEngine(client).wait("probe")

