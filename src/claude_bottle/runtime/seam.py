"""The engine seam: what the runtime, the commands and ``verify`` ask of a container engine, in their own terms.

``Engine`` is the one interface; ``runtime.docker_engine`` implements it on Docker and ``runtime.podman_engine``
on Podman (through its Docker-compatible API, and its own where that cannot say or do something), and the
tests' fake engine in memory. Containers and networks are named by their names (``runtime.names``); what the
engine says about them comes back as plain values, never as the SDK's objects. Every failure is a DockerError with the
engine's own explanation (its callers say what they were doing), but for the few an answer to expect: a
name taken (``NameTaken``), a build that stopped (``BuildFailed``), a thing already gone (a no-op, or None).
"""

from __future__ import annotations

import socket
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from claude_bottle.errors import DockerError
from claude_bottle.runtime.engine import EngineInfo

ACTIVE = ("running", "paused", "restarting")  # a container's states in which its processes still hold on
ENDED = ("exited", "dead")  # a container's states once it has run (created: not yet; removing: going)


class NameTaken(DockerError):
    """A container of that name exists already (the engine lets one container have a name)."""


class BuildFailed(DockerError):
    """An image build stopped: the engine's own explanation (a step that failed, a context it refused)."""


@dataclass(frozen=True)
class ContainerInfo:
    """A container as the engine lists it. ``image``: the image's id; ``created``: the engine's ISO 8601
    time; ``mounts``: destination to source, for bind mounts and volumes."""

    id: str
    name: str
    status: str = "created"
    labels: dict[str, str] = field(default_factory=dict)
    image: str = ""
    created: str = ""
    mounts: dict[str, str] = field(default_factory=dict)

    @property
    def active(self) -> bool:
        return self.status in ACTIVE


@dataclass(frozen=True)
class NetworkInfo:
    """A network as the engine lists it; ``subnets`` (CIDR) and ``gateways``: what its IPAM names (no gateway
    for Podman's internal networks without a resolver)."""

    id: str
    name: str
    labels: dict[str, str] = field(default_factory=dict)
    created: str = ""
    subnets: tuple[str, ...] = ()
    gateways: tuple[str, ...] = ()


@dataclass(frozen=True)
class NetworkSpec:
    """A network to create. ``bridge``: the host-side name of its bridge (15 characters at most); ``internal``:
    no route out; ``isolated``: besides, no address for the bridge on the host, and so no resolver where
    the engine would answer from there (``Engine.internal_names``): a bottle's network."""

    name: str
    labels: dict[str, str]
    internal: bool = False
    isolated: bool = False
    bridge: str = ""


@dataclass(frozen=True)
class Mount:
    """A mount the engine makes: a host path (``source``) at ``target``, or with no source an empty tmpfs of
    ``tmpfs_size`` bytes and mode ``tmpfs_mode``."""

    target: str
    source: str = ""
    read_only: bool = True
    tmpfs_size: int = 4096
    tmpfs_mode: int = 0o555


@dataclass(frozen=True)
class ContainerSpec:
    """A container to create: always without capabilities and without new privileges. ``entrypoint``: in
    place of the image's (with ``command`` as its arguments); ``binds``: host paths or volume names (source,
    target, read-only); ``network``: the one it starts on, where it is also known by ``aliases``;
    ``network_of``: instead, the container whose network namespace it joins (the engine makes it see that
    container's user the same way too); ``memory``: as the engine takes it ("256m", bytes); ``bounded_logs``:
    the engine keeps a few megabytes of its output, whatever it floods. ``no_ipv6`` and ``host_user`` ask for
    what the engine may need to be told: no IPv6 in a container whose networks have none, and the host user's
    uid the same inside and out (a bottle's)."""

    image: str
    name: str
    labels: dict[str, str]
    command: tuple[str, ...] = ()
    entrypoint: tuple[str, ...] = ()
    network: str = ""
    aliases: tuple[str, ...] = ()
    network_of: str = ""
    user: str = ""
    environment: dict[str, str] = field(default_factory=dict)
    working_dir: str = ""
    tty: bool = False
    stdin_open: bool = False
    read_only: bool = False
    tmpfs: dict[str, str] = field(default_factory=dict)
    dns: tuple[str, ...] = ()
    dns_search: tuple[str, ...] = ()
    dns_opt: tuple[str, ...] = ()
    runtime: str = ""
    pids_limit: int | None = None
    memory: str | int | None = None
    nano_cpus: int | None = None
    binds: tuple[tuple[str, str, bool], ...] = ()
    mounts: tuple[Mount, ...] = ()
    bounded_logs: bool = False
    no_ipv6: bool = False
    host_user: bool = False


class Engine(ABC):
    """A container engine, as the runtime, ``verify`` and the commands use it."""

    # Whether containers on an internal network find each other by name (Docker's resolver). Podman's
    # internal networks have none (``NetworkSpec``): the gate is given an address there instead.
    internal_names = True
    # Whether internal networks are kept between runs (runtime/pool.py): on Docker, where making one and
    # removing it cost a fifth of a second of every run. Podman's are made for each run, without a resolver.
    pooled_networks = True
    # Whether an isolated network's bridge still has an address on the host (Podman's), so a start checks
    # that the host does not answer a bottle there (``Run.check_host_unreachable``).
    bridges_on_host = False
    # Whether a container's standard input ends when the client attached to it goes away, however (Docker's,
    # with ``StdinOnce``). Podman's Docker-compatible API keeps it open: there the host beats on the gate's
    # stream, which stops when the beats stop (runtime/lifeline.py).
    stdin_ends_with_client = True

    @abstractmethod
    def describe(self) -> EngineInfo:
        """Which engine this is: its kind, version, OCI runtimes, and whether it runs rootless."""

    # ---- containers -----------------------------------------------------------------------------------

    @abstractmethod
    def containers(self, label: str | None = None, network: NetworkInfo | None = None) -> list[ContainerInfo]:
        """Every container in any state with ``label`` (``key`` or ``key=value``) and, given ``network``, on it
        (by name or id: a container created but never started has joined no network yet, but will)."""

    @abstractmethod
    def container(self, name: str) -> ContainerInfo | None:
        """The container of that name (or id); None when there is none."""

    @abstractmethod
    def create_placeholder(self, image: str, name: str, labels: dict[str, str]) -> ContainerInfo:
        """A container never meant to start, without a network, that holds ``name`` (NameTaken when another
        holds it): a run's claim on a pooled network."""

    @abstractmethod
    def create_container(self, spec: ContainerSpec) -> ContainerInfo:
        """The container, created and not started (NameTaken when the name is another's)."""

    @abstractmethod
    def start(self, name: str) -> None:
        """Start it."""

    @abstractmethod
    def start_attached(self, name: str) -> socket.socket:
        """Attach to its standard input and error, then start it: the stream, every line it writes from its
        start on (the engine's frames: an 8-byte header, then the payload)."""

    @abstractmethod
    def address(self, name: str, network: str) -> str:
        """The container's IPv4 address on ``network`` (empty when it has none there)."""

    @abstractmethod
    def read_file(self, name: str, path: str) -> bytes | None:
        """A regular file in the container's file system, created or running; empty when the path is not a
        regular file (a symlink, a folder), None when there is nothing there."""

    @abstractmethod
    def stop(self, name: str, timeout: float) -> None:
        """SIGTERM, then SIGKILL after ``timeout`` seconds; nothing when it is gone or stopped already."""

    @abstractmethod
    def kill(self, name: str, signum: int) -> None:
        """Send signal ``signum`` to its main process; nothing when it is gone or not running."""

    @abstractmethod
    def pause(self, name: str) -> None:
        """Freeze its processes (the engine's freezer) until ``unpause``; nothing when it is gone."""

    @abstractmethod
    def unpause(self, name: str) -> None:
        """Let its frozen processes go on; nothing when it is gone or not paused."""

    @abstractmethod
    def remove_container(self, name: str) -> None:
        """Remove it whatever its state; nothing when it is gone already."""

    @abstractmethod
    def exec(self, name: str, argv: list[str], timeout: float | None = None) -> tuple[int, bytes]:
        """Run ``argv`` in the running container as its own user: its exit code and output (both streams).
        A container held paused (while a bottle on an overlapping folder starts) is waited for, some seconds.
        With ``timeout``, a DockerError when it has not finished within that many seconds: a runtime whose
        sandbox dies under an exec may never end its stream (measured: runsc 2022 on the ptrace platform)."""

    @abstractmethod
    def wait(self, name: str, timeout: float | None = None) -> int:
        """Wait for it to exit: its exit code; a DockerError when it has not exited within ``timeout``
        seconds (when given)."""

    @abstractmethod
    def inspect(self, name: str) -> dict[str, Any]:
        """The engine's whole description of the container, as ``docker inspect`` shows it to anyone on the
        host (its configuration, environment and state): for a look at what the host can see, never to read
        one fact from (``container`` has those)."""

    @abstractmethod
    def logs(self, name: str, stdout: bool = True, stderr: bool = True, follow: bool = False) -> Iterator[bytes]:
        """Its output as the engine kept it, in chunks; with ``follow``, until it exits."""

    # ---- networks -------------------------------------------------------------------------------------

    @abstractmethod
    def networks(self, label: str) -> list[NetworkInfo]:
        """The networks with ``label`` (``key`` or ``key=value``)."""

    @abstractmethod
    def network(self, name: str) -> NetworkInfo | None:
        """The network of that name (or id), as it is now; None when there is none."""

    @abstractmethod
    def create_network(self, spec: NetworkSpec) -> NetworkInfo:
        """A bridge network as ``spec`` says."""

    @abstractmethod
    def connect(self, network: str, container: str, alias: str = "", address: str = "") -> None:
        """Join ``container`` to ``network``, known there as ``alias`` or at ``address`` when given."""

    @abstractmethod
    def remove_network(self, name: str, gone: Sequence[str] = ()) -> None:
        """Remove it; nothing when it is gone already. ``gone``: the containers that were on it, removed just
        before: an endpoint the engine still counts for one of them is forced off and the removal tried again
        (Docker keeps one now and then, and refuses the removal until it is forced off or the engine restarts)."""

    # ---- volumes --------------------------------------------------------------------------------------

    @abstractmethod
    def create_volume(self, name: str, labels: dict[str, str]) -> str:
        """The named volume, made unless it exists (then as it is); its name."""

    @abstractmethod
    def remove_volume(self, name: str) -> None:
        """Remove it; nothing when it is gone already."""

    @abstractmethod
    def volumes_labelled(self, label: str) -> dict[str, dict[str, str]]:
        """The volumes with ``label`` (``key`` or ``key=value``), each name with its labels."""

    # ---- images ---------------------------------------------------------------------------------------

    @abstractmethod
    def image_ids(self, repository: str) -> list[str]:
        """The ids of the images tagged in ``repository`` (any tag)."""

    @abstractmethod
    def image_exists(self, reference: str) -> bool:
        """Whether the engine has the image ``reference`` (``repository:tag``, or an id)."""

    @abstractmethod
    def build_image(self, context: Path, tag: str, buildargs: dict[str, str]) -> Iterator[str]:
        """Build the Dockerfile in the folder ``context`` as ``tag``, with no pull of its base image and no
        intermediate container kept: its output as it comes, line by line. BuildFailed when it stops."""

    @abstractmethod
    def pull_image(self, reference: str) -> None:
        """Pull ``reference`` from its registry."""

    @abstractmethod
    def import_image(self, archive: Path, repository: str, tag: str, changes: tuple[str, ...] = ()) -> None:
        """An image made of the root file system in the tar file ``archive``, tagged ``repository:tag``, with
        ``changes`` (Dockerfile instructions such as ``CMD ["bash"]``) applied."""

    @abstractmethod
    def prune_images(self, label: str) -> None:
        """Remove the dangling images (untagged, unused) with ``label`` (``key`` or ``key=value``)."""

    # ---- this terminal ----------------------------------------------------------------------------------

    @abstractmethod
    def attach_command(self, name: str, interactive: bool) -> list[str]:
        """The command that starts the created container attached to this terminal, its standard input
        too when ``interactive``: the engine's own client handles the terminal (raw mode, resizing)."""

    @abstractmethod
    def exec_command(self, name: str, argv: list[str], tty: bool) -> list[str]:
        """The command that runs ``argv`` in the running container, as the container's own user, attached to
        this terminal (a pseudo-terminal when ``tty``)."""
