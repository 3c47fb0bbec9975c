"""What the engine says about itself (Docker or Podman, rootless or not, and the limits it cannot enforce), and
what the seam's Docker implementation makes of the engine's answers."""

from __future__ import annotations

import io
import tarfile
import threading
import time
from pathlib import Path
from typing import Any

import docker
import docker.models.containers
import pytest
import requests

from claude_bottle.errors import DockerError
from claude_bottle.runtime import docker_api, docker_engine, engine, engines, podman_engine
from claude_bottle.runtime.docker_api import libpod_answer
from claude_bottle.runtime.docker_engine import DockerEngine
from claude_bottle.runtime.docker_values import LOG_CONFIG, create_options, file_in_archive, network_info
from claude_bottle.runtime.seam import ContainerSpec

PODMAN_VERSION = {"Version": "4.3.1", "Components": [{"Name": "Podman Engine", "Version": "4.3.1"}]}


def podman_info(rootless: bool, cgroups: str = "v2", controllers: tuple[str, ...] = ()) -> dict[str, Any]:
    return {"host": {"security": {"rootless": rootless}, "cgroupVersion": cgroups,
                     "cgroupControllers": list(controllers)}}


def test_docker_is_rootful_unless_its_security_options_say_so() -> None:
    info = {"Runtimes": {"runc": {}}, "DefaultRuntime": "runc", "SecurityOptions": ["name=seccomp"]}
    about = engine.engine_info({"Version": "20.10.24"}, info)
    assert (about.kind, about.rootless, about.unenforced, about.describe()) == ("Docker", False, (), "Docker 20.10.24")
    rootless = engine.engine_info({"Version": "27.1"}, {**info, "SecurityOptions": ["name=rootless"]})
    assert rootless.describe() == "Docker 27.1, rootless"


@pytest.mark.parametrize(("answer", "rootless", "unenforced"), [
    (podman_info(False, "v1"), False, ()),  # rootful: cgroups are the engine's own
    (podman_info(True, "v2", ("cpuset", "cpu", "io", "memory", "pids")), True, ()),
    (podman_info(True, "v2", ("memory", "pids")), True, ("CPU",)),
    (podman_info(True, "v1", ("memory", "pids", "cpu")), True, ("memory", "CPU", "process")),  # v1: none at all
])
def test_podman_says_whether_it_is_rootless_and_which_limits_it_cannot_enforce_in_its_own_info(
    answer: dict[str, Any], rootless: bool, unenforced: tuple[str, ...],
) -> None:
    """Podman 4.3's Docker-compatible info does not say it runs rootless: its own info endpoint does."""
    assert engine.is_podman(PODMAN_VERSION) and not engine.is_podman({"Version": "27.1"})
    about = engine.engine_info(PODMAN_VERSION, {"SecurityOptions": ["name=seccomp,profile=default"]}, answer)
    assert (about.podman, about.rootless, about.unenforced) == (True, rootless, unenforced)
    assert about.describe() == ("Podman 4.3.1, rootless" if rootless else "Podman 4.3.1")
    warning = engine.unenforced_limits(about)
    assert bool(warning) == bool(unenforced)
    assert all(name in warning for name in unenforced)


def test_podman_lists_only_the_runtimes_installed_and_versions_read_as_numbers() -> None:
    runtimes = {"crun": {"path": "/usr/bin/crun"}, "runsc": {"path": "/usr/local/bin/runsc"}, "kata": {}}
    about = engine.engine_info({**PODMAN_VERSION, "Version": "4.3.1-dev"}, {"Runtimes": runtimes},
                               podman_info(False), exists=lambda path: path == Path("/usr/bin/crun"))
    assert (about.runtimes, about.version) == (("crun",), (4, 3, 1))
    assert engine.version_numbers("20.10.24+dfsg1") == (20, 10, 24)
    assert engine.version_numbers("25.0.5~rc1") == (25, 0, 5) >= engine.DNS_FIXED_VERSION


def test_the_warning_names_each_limit_and_its_controller() -> None:
    about = engine.EngineInfo("Podman", (4, 3, 1), ("runc",), "runc", True, ("memory", "CPU", "process"))
    assert engine.unenforced_limits(about).startswith(
        "this engine does not enforce the bottle's memory, CPU and process limits: ")
    assert "(memory, cpu, pids" in engine.unenforced_limits(about)


def test_podman_refusing_a_request_is_an_error_with_its_message() -> None:
    with pytest.raises(DockerError, match="Podman refused /networks/create: subnet in use"):
        libpod_answer("/networks/create", 500, {"message": "subnet in use"})
    with pytest.raises(DockerError, match="Podman refused /info: 404"):
        libpod_answer("/info", 404, "not found")
    assert libpod_answer("/info", 200, {"host": {}}) == {"host": {}}


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


def archive(member: tarfile.TarInfo, data: bytes = b"") -> bytes:
    """The engine's archive of one path (``GET /containers/{id}/archive``), holding ``member``."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        member.size = len(data)
        tar.addfile(member, io.BytesIO(data) if data else None)
    return buffer.getvalue()


def test_a_file_read_from_a_container_is_its_content_and_anything_else_is_empty() -> None:
    """What the bottle could have put at a path the host reads: a regular file is read; a symlink (which the
    host must not follow), a folder, a device are empty, never their target's content."""
    assert file_in_archive(archive(tarfile.TarInfo("settings.json"), b'{"x": 1}\n')) == b'{"x": 1}\n'
    assert file_in_archive(archive(tarfile.TarInfo("empty"))) == b""
    link = tarfile.TarInfo("settings.json")
    link.type, link.linkname = tarfile.SYMTYPE, "/etc/shadow"
    assert file_in_archive(archive(link)) == b""
    hard = tarfile.TarInfo("settings.json")
    hard.type, hard.linkname = tarfile.LNKTYPE, "other"
    assert file_in_archive(archive(hard)) == b""
    folder = tarfile.TarInfo("projects")
    folder.type = tarfile.DIRTYPE
    assert file_in_archive(archive(folder)) == b""
    fifo = tarfile.TarInfo("pipe")
    fifo.type = tarfile.FIFOTYPE
    assert file_in_archive(archive(fifo)) == b""


def test_the_terminal_commands_attach_the_engines_own_client(monkeypatch: pytest.MonkeyPatch) -> None:
    """``exec`` runs as the container's own user (no -u: the one the bottle was started as)."""
    monkeypatch.setattr(docker_engine, "docker_cli", lambda: "/usr/bin/docker")
    seam = DockerEngine(docker_client())
    assert seam.exec_command("b", ["id", "-u"], tty=False) == ["/usr/bin/docker", "exec", "-i", "b", "id", "-u"]
    assert seam.exec_command("b", ["sh"], tty=True) == ["/usr/bin/docker", "exec", "-it", "b", "sh"]
    assert seam.attach_command("b", interactive=True) == ["/usr/bin/docker", "start", "--attach", "--interactive", "b"]
    assert seam.attach_command("b", interactive=False) == ["/usr/bin/docker", "start", "--attach", "b"]


def test_without_the_docker_command_a_terminal_cannot_be_attached(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(docker_api.shutil, "which", lambda name: None)
    with pytest.raises(DockerError, match="the docker command is needed to attach a terminal"):
        DockerEngine(docker_client()).exec_command("b", ["id"], tty=False)


def docker_client() -> docker.DockerClient:
    """A client that never connects (its API version given, it asks the engine nothing until used)."""
    return docker.DockerClient(base_url="unix:///nonexistent/docker.sock", version="1.41")


class AnsweringClient(docker.DockerClient):
    """The SDK's client answering its version and info endpoints with canned answers, connecting nowhere."""

    def __init__(self, version: dict[str, Any], info: dict[str, Any]) -> None:
        super().__init__(base_url="unix:///nonexistent/docker.sock", version="1.41")
        self.answers = version, info

    def version(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        return self.answers[0]

    def info(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        return self.answers[1]


def test_the_engine_is_asked_its_version_and_info_and_podman_its_own_info(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[tuple[str, str]] = []

    def libpod(client: docker.DockerClient, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        asked.append((method, path))
        return podman_info(True, "v2", ("memory", "pids", "cpu"))

    monkeypatch.setattr(docker_api, "libpod", libpod)
    info = {"Runtimes": {"runc": {}}, "SecurityOptions": []}
    docker_seam = DockerEngine(AnsweringClient({"Version": "27.1"}, info))
    assert docker_seam.describe().describe() == "Docker 27.1" and asked == []
    podman = engines.open_engine(AnsweringClient(PODMAN_VERSION, info))
    assert isinstance(podman, podman_engine.PodmanEngine) and podman.rootless
    assert podman.describe().describe() == "Podman 4.3.1, rootless" and asked == [("GET", "/info")]


class ArchiveApi(docker.APIClient):
    """The SDK's API client answering ``get_archive`` from ``files`` (path to the engine's archive of it) in
    two chunks, as the engine streams it; NotFound for any other path."""

    def __init__(self, files: dict[str, bytes]) -> None:
        super().__init__(base_url="unix:///nonexistent/docker.sock", version="1.41")
        self.files, self.asked = files, []

    def get_archive(self, container: str, path: str, *args: Any, **kwargs: Any) -> tuple[list[bytes], dict[str, Any]]:
        self.asked.append((container, path))
        if path == "/refused":
            raise docker.errors.APIError("500 Server Error", explanation="the engine refused")
        if path not in self.files:
            raise docker.errors.NotFound(f"Could not find the file {path} in container {container}")
        data = self.files[path]
        return [data[:100], data[100:]], {"name": path.rsplit("/", 1)[-1]}


def test_read_file_joins_the_engines_chunks_and_reads_only_a_regular_file() -> None:
    content = b"-----BEGIN CERTIFICATE-----\n" + b"A" * 300 + b"\n-----END CERTIFICATE-----\n"
    link = tarfile.TarInfo("ca-certificates.crt")
    link.type, link.linkname = tarfile.SYMTYPE, "/proc/self/environ"
    client = docker_client()
    client.api = api = ArchiveApi({"/etc/ssl/certs/ca-certificates.crt": archive(tarfile.TarInfo("ca-certificates.crt"),
                                                                                 content),
                                   "/home/claude/.claude.json": archive(link)})
    seam = DockerEngine(client)
    assert seam.read_file("bottle", "/etc/ssl/certs/ca-certificates.crt") == content
    assert seam.read_file("bottle", "/home/claude/.claude.json") == b"", "a symlink is never followed"
    assert seam.read_file("bottle", "/nothing/here") is None
    with pytest.raises(DockerError, match="the engine refused"):
        seam.read_file("bottle", "/refused")
    assert api.asked[0] == ("bottle", "/etc/ssl/certs/ca-certificates.crt")


def test_an_exec_with_a_deadline_gives_up_on_a_stream_that_never_ends(monkeypatch: pytest.MonkeyPatch) -> None:
    """What verify's scripts rely on: an exec whose container died under it may never end its stream."""
    release = threading.Event()
    seam = DockerEngine(docker_client())
    monkeypatch.setattr(seam, "_exec", lambda name, argv: (release.wait(10), (0, b""))[1])
    started = time.monotonic()
    with pytest.raises(DockerError, match=r"bash in bottle did not finish within 0\.2 s"):
        seam.exec("bottle", ["bash", "-c", "x"], timeout=0.2)
    assert time.monotonic() - started < 2
    release.set()

    def failing(name: str, argv: list[str]) -> tuple[int, bytes]:
        raise DockerError("no such container")

    monkeypatch.setattr(seam, "_exec", failing)
    with pytest.raises(DockerError, match="no such container"):
        seam.exec("bottle", ["true"], timeout=5)
    monkeypatch.setattr(seam, "_exec", lambda name, argv: (3, b"out"))
    assert seam.exec("bottle", ["true"], timeout=5) == (3, b"out")


class StaleEndpointApi(docker.APIClient):
    """The SDK's API client for a network the engine still counts endpoints on after their containers went:
    ``stale``, the containers' names, each freed only by a forced disconnect by that name (as Docker 20.10)."""

    def __init__(self, stale: set[str]) -> None:
        super().__init__(base_url="unix:///nonexistent/docker.sock", version="1.41")
        self.stale, self.asked = stale, []

    def remove_network(self, net_id: str) -> None:
        self.asked.append(("remove", net_id))
        if self.stale:
            raise docker.errors.APIError(
                "403 Client Error", explanation=f"error while removing network: network {net_id} id 12ab has active "
                                                "endpoints")

    def disconnect_container_from_network(self, container: str, net_id: str, force: bool = False) -> None:
        self.asked.append(("disconnect", container))
        if not force or container not in self.stale:
            raise docker.errors.APIError("404 Client Error", explanation=f"No such container: {container}")
        self.stale.discard(container)


def test_a_stale_endpoint_of_a_removed_container_is_forced_off_before_its_network_goes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(docker_engine, "STALE_ENDPOINT_PAUSE", 0.01)
    client = docker_client()
    client.api = api = StaleEndpointApi({"run-stub"})
    DockerEngine(client).remove_network("run-outside", ["run-gate", "run-stub"])
    assert api.asked == [("remove", "run-outside"), ("disconnect", "run-gate"), ("disconnect", "run-stub"),
                         ("remove", "run-outside")]
    # without the names of what was on it, the engine's refusal is the answer
    client.api = api = StaleEndpointApi({"run-stub"})
    with pytest.raises(DockerError, match=r"has active endpoints$"):
        DockerEngine(client).remove_network("run-outside")
    assert api.asked == [("remove", "run-outside")]
    # a count that no forced disconnect clears: the error says how to clear it
    client.api = api = StaleEndpointApi({"lost"})
    with pytest.raises(DockerError, match=r"the engine's count is stale: restart the engine, then "
                                          r"`docker network rm run-outside`"):
        DockerEngine(client).remove_network("run-outside", ["run-stub"])
    assert api.asked.count(("remove", "run-outside")) == docker_engine.STALE_ENDPOINT_TRIES


class PausedContainer:
    """A container the engine reports paused for its first ``paused`` execs (409, as Docker words it)."""

    def __init__(self, paused: int) -> None:
        self.paused, self.tries = paused, 0

    def exec_run(self, argv: list[str], **kwargs: Any) -> Any:
        self.tries += 1
        if self.tries <= self.paused:
            response = requests.Response()
            response.status_code = 409
            raise docker.errors.APIError("409 Client Error", response=response,
                                         explanation="Container abc is paused, unpause the container before exec")
        return docker.models.containers.ExecResult(0, b"ran")


def test_an_exec_waits_for_a_container_held_paused_and_gives_up_after_some_seconds(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Another start on an overlapping folder holds a bottle paused until its own has started: an exec then
    (``claude-bottle exec``, verify's scripts) waits for the resume instead of failing."""
    monkeypatch.setattr(docker_engine, "PAUSED_EXEC_POLL", 0.01)
    seam = DockerEngine(docker_client())
    container = PausedContainer(paused=3)
    collection = docker.models.containers.ContainerCollection
    monkeypatch.setattr(collection, "get", lambda self, name: container)
    assert seam.exec("bottle", ["true"]) == (0, b"ran") and container.tries == 4
    monkeypatch.setattr(docker_engine, "PAUSED_EXEC_SECONDS", 0.1)
    stuck = PausedContainer(paused=10**6)
    monkeypatch.setattr(collection, "get", lambda self, name: stuck)
    with pytest.raises(DockerError, match="is paused"):
        seam.exec("bottle", ["true"])
