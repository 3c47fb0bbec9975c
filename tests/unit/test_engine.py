"""What the engine says about itself: Docker or Podman, rootless or not, and the limits it cannot enforce."""

from __future__ import annotations

from typing import Any

import pytest

from claude_bottle.errors import DockerError
from claude_bottle.runtime import engine
from claude_bottle.runtime.docker_engine import LOG_CONFIG, create_options, network_info
from claude_bottle.runtime.seam import ContainerSpec
from claude_bottle.runtime.users import userns_for

PODMAN_VERSION = {"Version": "4.3.1", "Components": [{"Name": "Podman Engine", "Version": "4.3.1"}]}


class Answer:
    def __init__(self, status: int, body: Any) -> None:
        self.status_code, self.body = status, body

    def json(self) -> Any:
        return self.body


class FakeApi:
    """The SDK's APIClient as ``engine.libpod`` uses it: one canned answer per path."""

    base_url, timeout = "http+docker://localhost", 5

    def __init__(self, answers: dict[str, Answer]) -> None:
        self.answers, self.requests = answers, []

    def request(self, method: str, url: str, json: Any = None, timeout: float = 0) -> Answer:
        self.requests.append((method, url, json))
        return self.answers[url.split("/libpod", 1)[1]]


class FakeClient:
    def __init__(self, version: dict[str, Any], info: dict[str, Any], answers: dict[str, Answer] | None = None):
        self._version, self._info, self.api = version, info, FakeApi(answers or {})

    def version(self) -> dict[str, Any]:
        return self._version

    def info(self) -> dict[str, Any]:
        return self._info


def podman_info(rootless: bool, cgroups: str = "v2", controllers: tuple[str, ...] = ()) -> Answer:
    return Answer(200, {"host": {"security": {"rootless": rootless}, "cgroupVersion": cgroups,
                                 "cgroupControllers": list(controllers)}})


def test_docker_is_rootful_unless_its_security_options_say_so() -> None:
    info = {"Runtimes": {"runc": {}}, "DefaultRuntime": "runc", "SecurityOptions": ["name=seccomp"]}
    about = engine.describe(FakeClient({"Version": "20.10.24"}, info))  # type: ignore[arg-type]
    assert (about.kind, about.rootless, about.unenforced, about.describe()) == ("Docker", False, (), "Docker 20.10.24")
    rootless = engine.describe(FakeClient({"Version": "27.1"}, {**info, "SecurityOptions": ["name=rootless"]}))  # type: ignore[arg-type]
    assert rootless.describe() == "Docker 27.1, rootless"


@pytest.mark.parametrize(("answer", "rootless", "unenforced"), [
    (podman_info(False, "v1"), False, ()),  # rootful: cgroups are the engine's own
    (podman_info(True, "v2", ("cpuset", "cpu", "io", "memory", "pids")), True, ()),
    (podman_info(True, "v2", ("memory", "pids")), True, ("CPU",)),
    (podman_info(True, "v1", ("memory", "pids", "cpu")), True, ("memory", "CPU", "process")),  # v1: none at all
])
def test_podman_says_whether_it_is_rootless_and_which_limits_it_cannot_enforce_in_its_own_info(
    answer: Answer, rootless: bool, unenforced: tuple[str, ...],
) -> None:
    """Podman 4.3's Docker-compatible info does not say it runs rootless: its own info endpoint does."""
    client = FakeClient(PODMAN_VERSION, {"SecurityOptions": ["name=seccomp,profile=default"]}, {"/info": answer})
    about = engine.describe(client)  # type: ignore[arg-type]
    assert (about.podman, about.rootless, about.unenforced) == (True, rootless, unenforced)
    assert about.describe() == ("Podman 4.3.1, rootless" if rootless else "Podman 4.3.1")
    assert client.api.requests == [("GET", f"http+docker://localhost/{engine.LIBPOD_API}/libpod/info", None)]
    warning = engine.unenforced_limits(about)
    assert bool(warning) == bool(unenforced)
    assert all(name in warning for name in unenforced)


def test_the_warning_names_each_limit_and_its_controller() -> None:
    about = engine.EngineInfo("Podman", (4, 3, 1), ("runc",), "runc", True, ("memory", "CPU", "process"))
    assert engine.unenforced_limits(about).startswith(
        "this engine does not enforce the bottle's memory, CPU and process limits: ")
    assert "(memory, cpu, pids" in engine.unenforced_limits(about)


def test_podman_refusing_a_request_is_an_error_with_its_message() -> None:
    client = FakeClient(PODMAN_VERSION, {}, {"/networks/create": Answer(500, {"message": "subnet in use"})})
    with pytest.raises(DockerError, match="Podman refused /networks/create: subnet in use"):
        engine.libpod(client, "POST", "/networks/create", {"name": "x"})  # type: ignore[arg-type]


@pytest.mark.parametrize(("podman", "rootless", "mode"), [
    (False, False, ""), (False, True, ""),  # Docker, rootless or not: its own default
    (True, False, ""),  # rootful Podman: uids are the host's
    (True, True, "keep-id"),  # rootless Podman: the user's uid is the same inside and out
])
def test_the_bottle_keeps_the_users_id_on_rootless_podman_only(podman: bool, rootless: bool, mode: str) -> None:
    assert userns_for(podman, rootless) == mode


def gateways(pools: list[dict[str, str]]) -> list[str]:
    return list(network_info({"Id": "n1", "Name": "net", "IPAM": {"Config": pools}}).gateways)


def test_gateways_are_addresses_and_podmans_missing_one_is_none() -> None:
    assert gateways([{"Subnet": "10.89.0.0/24", "Gateway": "<nil>"}]) == []
    assert gateways([{"Subnet": "10.89.0.0/24"}]) == []
    assert gateways([{"Subnet": "172.18.0.0/16", "Gateway": "172.18.0.1"},
                     {"Subnet": "fd00::/64", "Gateway": "fd00::1"}]) == ["172.18.0.1", "fd00::1"]
    assert network_info({"IPAM": {"Config": [{"Subnet": "10.89.0.0/24"}]}}).subnets == ("10.89.0.0/24",)


def test_a_container_spec_becomes_the_sdks_arguments_with_only_what_it_sets() -> None:
    """The gate's, as the runtime asks for it: hardened whatever the spec says, and nothing it leaves unset."""
    spec = ContainerSpec("gate:1", "claude-bottle-dev-1-gate", {"claude-bottle": "1"}, command=("--x",),
                         stdin_open=True, network="n1", read_only=True, tmpfs={"/tmp": "size=16m"}, pids_limit=256,
                         memory="256m", bounded_logs=True, binds=(("/ca.pem", "/opt/gate/upstream-ca/0.pem", True),))
    assert create_options(spec) == {
        "name": "claude-bottle-dev-1-gate", "labels": {"claude-bottle": "1"}, "command": ["--x"],
        "cap_drop": ["ALL"], "security_opt": ["no-new-privileges"], "stdin_open": True, "network": "n1",
        "read_only": True, "tmpfs": {"/tmp": "size=16m"}, "pids_limit": 256, "mem_limit": "256m",
        "log_config": LOG_CONFIG, "volumes": {"/ca.pem": {"bind": "/opt/gate/upstream-ca/0.pem", "mode": "ro"}}}
    bare = create_options(ContainerSpec("img", "name", {}))
    assert bare == {"name": "name", "labels": {}, "cap_drop": ["ALL"], "security_opt": ["no-new-privileges"]}
