"""An engine in memory (``runtime.seam.Engine``): containers, networks and images as plain records, and every
change in ``events``, so the runtime's logic is tested without Docker, like httpx's MockTransport."""

from __future__ import annotations

import dataclasses
import itertools
import socket
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from claude_bottle.errors import DockerError
from claude_bottle.runtime.engine import EngineInfo
from claude_bottle.runtime.seam import (
    BuildFailed,
    ContainerInfo,
    ContainerSpec,
    Engine,
    NameTaken,
    NetworkInfo,
    NetworkSpec,
)

DOCKER = EngineInfo("Docker", (27, 1, 0), ("runc",), "runc", rootless=False)

Exec = Callable[[str, list[str]], tuple[int, bytes]]


def _matches(labels: dict[str, str], selector: str | None) -> bool:
    if selector is None:
        return True
    key, _, value = selector.partition("=")
    return key in labels and (not value or labels[key] == value)


class FakeEngine(Engine):
    """Holds what was made until it is removed. ``output``: each container's logs; ``on_exec``: what running
    a command in a container answers (by default exit 0, no output); ``files``: what ``read_file`` finds, by
    (container, path); ``specs``: how each container was asked for; ``attached``: the container's end of each
    attached stream, to write its start-up lines on; ``fail``: operation names that raise a DockerError, to
    test what a failing engine leaves. Images: ``tags``, the references it has; ``build_output``, what a
    build writes (a build that fails raises BuildFailed after it); ``about``: what it says of itself."""

    def __init__(self, internal_names: bool = True, pooled_networks: bool = True, about: EngineInfo = DOCKER) -> None:
        self.internal_names, self.pooled_networks, self.about = internal_names, pooled_networks, about
        self.containers_by_name: dict[str, ContainerInfo] = {}
        self.networks_by_name: dict[str, NetworkInfo] = {}
        self.members: dict[str, set[str]] = {}  # network name -> container names
        self.stale: dict[str, set[str]] = {}  # network name -> removed containers whose endpoints it still counts
        self.images: dict[str, list[str]] = {}  # repository -> image ids
        self.volumes: dict[str, dict[str, str]] = {}  # name -> labels
        self.output: dict[str, bytes] = {}
        self.on_exec: Exec = lambda name, argv: (0, b"")
        self.fail: set[str] = set()
        self.files: dict[tuple[str, str], bytes] = {}
        self.specs: dict[str, ContainerSpec] = {}
        self.attached: dict[str, socket.socket] = {}
        self.events: list[tuple[str, str]] = []
        self.tags: set[str] = set()
        self.build_output: list[str] = []
        self.contexts: dict[str, dict[str, bytes]] = {}  # tag -> the build context's files, as it was built
        self.buildargs: dict[str, dict[str, str]] = {}  # tag -> the build arguments it was built with
        self._ids = itertools.count(1)

    def _check(self, operation: str) -> None:
        if operation in self.fail:
            raise DockerError(f"{operation} failed (fake)")

    # ---- what a test sets up ---------------------------------------------------------------------------

    def add_container(self, name: str, labels: dict[str, str], status: str = "running", image: str = "sha256:img",
                      mounts: dict[str, str] | None = None, output: bytes = b"") -> ContainerInfo:
        if name in self.containers_by_name:
            raise NameTaken(f"a container {name} exists")
        container = ContainerInfo(f"c{next(self._ids)}", name, status, dict(labels), image,
                                  "2026-11-25T10:00:00.123456789Z", dict(mounts or {}))
        self.containers_by_name[name] = container
        self.output[name] = output
        self.events.append(("create", name))
        return container

    # ---- the seam ----------------------------------------------------------------------------------------

    def describe(self) -> EngineInfo:
        return self.about

    def containers(self, label: str | None = None, network: NetworkInfo | None = None) -> list[ContainerInfo]:
        self._check("containers")
        on = self.members.get(network.name, set()) if network is not None else None
        return [c for c in reversed(self.containers_by_name.values())  # newest first, as the engine lists them
                if _matches(c.labels, label) and (on is None or c.name in on)]

    def container(self, name: str) -> ContainerInfo | None:
        return self.containers_by_name.get(name)

    def create_placeholder(self, image: str, name: str, labels: dict[str, str]) -> ContainerInfo:
        self._check("create_placeholder")
        return self.add_container(name, labels, status="created", image=image)

    def create_container(self, spec: ContainerSpec) -> ContainerInfo:
        self._check("create_container")
        created = self.add_container(spec.name, spec.labels, status="created", image=f"sha256:{spec.image}",
                                     mounts={target: source for source, target, _ in spec.binds})
        self.specs[spec.name] = spec
        if spec.network:
            self.connect(spec.network, spec.name)
        return created

    def start(self, name: str) -> None:
        self._check("start")
        found = self._found(name)
        self.containers_by_name[found.name] = dataclasses.replace(found, status="running")
        self.events.append(("start", found.name))

    def start_attached(self, name: str) -> socket.socket:
        ours, theirs = socket.socketpair()
        self.attached[name] = theirs
        self.start(name)
        return ours

    def address(self, name: str, network: str) -> str:
        found = self._found(name)
        if found.name not in self.members.get(network, set()):
            return ""
        subnet = self.networks_by_name[network].subnets[0]
        return subnet.replace("0/24", str(2 + sorted(self.members[network]).index(found.name)))

    def read_file(self, name: str, path: str) -> bytes | None:
        self._found(name)
        self.events.append(("read", f"{name}:{path}"))
        return self.files.get((name, path))

    def _found(self, name: str) -> ContainerInfo:
        found = next((c for c in self.containers_by_name.values() if name in (c.name, c.id)), None)
        if found is None:
            raise DockerError(f"No such container: {name}")
        return found

    def stop(self, name: str, timeout: float) -> None:
        self._check("stop")
        if (found := self.containers_by_name.get(name)) is not None and found.active:
            self.containers_by_name[name] = dataclasses.replace(found, status="exited")
            self.events.append(("stop", name))

    def kill(self, name: str, signum: int) -> None:
        self._check("kill")
        if (found := self.containers_by_name.get(name)) is not None and found.status == "running":
            self.events.append(("kill", f"{name} {signum}"))

    def pause(self, name: str) -> None:
        self._check("pause")
        if (found := self.containers_by_name.get(name)) is not None:
            if found.status != "running":
                raise DockerError(f"Container {name} is not running (fake)")
            self.containers_by_name[name] = dataclasses.replace(found, status="paused")
            self.events.append(("pause", name))

    def unpause(self, name: str) -> None:
        self._check("unpause")
        if (found := self.containers_by_name.get(name)) is not None and found.status == "paused":
            self.containers_by_name[name] = dataclasses.replace(found, status="running")
            self.events.append(("unpause", name))

    def remove_container(self, name: str) -> None:
        self._check("remove_container")
        if self.containers_by_name.pop(name, None) is not None:
            for members in self.members.values():
                members.discard(name)
            self.events.append(("remove", name))

    def exec(self, name: str, argv: list[str], timeout: float | None = None) -> tuple[int, bytes]:
        self._check("exec")
        if name not in self.containers_by_name:
            raise DockerError(f"No such container: {name}")
        self.events.append(("exec", name))
        return self.on_exec(name, argv)

    def wait(self, name: str, timeout: float | None = None) -> int:
        found = self._found(name)
        self.containers_by_name[found.name] = dataclasses.replace(found, status="exited")
        return 0

    def inspect(self, name: str) -> dict[str, Any]:
        """A few of the engine's fields: its name, state and labels, and what it was asked to run with."""
        found = self._found(name)
        spec = self.specs.get(found.name)
        config: dict[str, Any] = {"Image": found.image, "Labels": found.labels}
        if spec is not None:
            config |= {"Cmd": list(spec.command), "Entrypoint": list(spec.entrypoint) or None, "User": spec.user,
                       "Env": [f"{key}={value}" for key, value in spec.environment.items()]}
        return {"Id": found.id, "Name": f"/{found.name}", "State": {"Status": found.status}, "Config": config}

    def logs(self, name: str, stdout: bool = True, stderr: bool = True, follow: bool = False) -> Iterator[bytes]:
        if name not in self.containers_by_name:
            raise DockerError(f"No such container: {name}")
        return iter([self.output.get(name, b"")])

    def networks(self, label: str) -> list[NetworkInfo]:
        self._check("networks")
        return [n for n in self.networks_by_name.values() if _matches(n.labels, label)]

    def network(self, name: str) -> NetworkInfo | None:
        return self.networks_by_name.get(name)

    def create_network(self, spec: NetworkSpec) -> NetworkInfo:
        self._check("create_network")
        if spec.name in self.networks_by_name:
            raise DockerError(f"network with name {spec.name} already exists")
        number = next(self._ids)
        network = NetworkInfo(f"n{number}", spec.name, dict(spec.labels), f"2026-11-25T10:00:{number:02d}Z",
                              (f"10.{number}.0.0/24",), () if spec.isolated else (f"10.{number}.0.1",))
        self.networks_by_name[spec.name] = network
        self.members[spec.name] = set()
        self.events.append(("create network", spec.name))
        return network

    def connect(self, network: str, container: str, alias: str = "", address: str = "") -> None:
        self._check("connect")
        network = next((n.name for n in self.networks_by_name.values() if network in (n.name, n.id)), network)
        if network not in self.members:
            raise DockerError(f"network {network} not found")
        name = next((c.name for c in self.containers_by_name.values() if container in (c.name, c.id)), None)
        if name is None:
            raise DockerError(f"No such container: {container}")
        self.members[network].add(name)

    def remove_network(self, name: str, gone: Sequence[str] = ()) -> None:
        self._check("remove_network")
        if self.members.get(name) or self.stale.get(name, set()) - set(gone):
            raise DockerError(f"network {name} has active endpoints")
        if self.networks_by_name.pop(name, None) is not None:
            self.members.pop(name, None)
            self.events.append(("remove network", name))

    def create_volume(self, name: str, labels: dict[str, str]) -> str:
        self._check("create_volume")
        self.volumes.setdefault(name, dict(labels))
        return name

    def remove_volume(self, name: str) -> None:
        self._check("remove_volume")
        if self.volumes.pop(name, None) is not None:
            self.events.append(("remove volume", name))

    def volumes_labelled(self, label: str) -> dict[str, dict[str, str]]:
        key, _, value = label.partition("=")
        return {name: dict(labels) for name, labels in self.volumes.items()
                if key in labels and (not value or labels[key] == value)}

    def image_ids(self, repository: str) -> list[str]:
        return list(self.images.get(repository, []))

    def image_exists(self, reference: str) -> bool:
        return reference in self.tags

    def build_image(self, context: Path, tag: str, buildargs: dict[str, str]) -> Iterator[str]:
        self.events.append(("build", tag))
        self.buildargs[tag] = dict(buildargs)
        self.contexts[tag] = {path.relative_to(context).as_posix(): path.read_bytes()
                              for path in sorted(context.rglob("*")) if path.is_file()}
        yield from self.build_output
        if "build_image" in self.fail:
            raise BuildFailed("The command '/bin/sh -c exit 1' returned a non-zero code: 1 (fake)")
        self.tags.add(tag)

    def pull_image(self, reference: str) -> None:
        self._check("pull_image")
        self.events.append(("pull", reference))
        self.tags.add(reference)

    def import_image(self, archive: Path, repository: str, tag: str, changes: tuple[str, ...] = ()) -> None:
        self.events.append(("import", f"{repository}:{tag}"))
        self.tags.add(f"{repository}:{tag}")

    def prune_images(self, label: str) -> None:
        self._check("prune_images")
        self.events.append(("prune", label))

    def attach_command(self, name: str, interactive: bool) -> list[str]:
        return ["engine", "start", "--attach", *(["--interactive"] if interactive else []), name]

    def exec_command(self, name: str, argv: list[str], tty: bool) -> list[str]:
        return ["engine", "exec", "-it" if tty else "-i", name, *argv]
