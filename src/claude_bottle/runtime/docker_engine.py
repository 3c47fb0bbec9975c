"""The engine seam (``runtime.seam``) on Docker's API through the Docker SDK: containers, networks, volumes and
images by name, answered with the seam's plain values (``runtime.docker_values``). Podman's differences live
in ``runtime.podman_engine``; ``runtime.engines`` opens the one the engine is."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import docker
import docker.errors
import requests
from docker.models.containers import Container

from claude_bottle.errors import DockerError
from claude_bottle.runtime.docker_api import api_failed, describe_engine, docker_cli
from claude_bottle.runtime.docker_values import container_info, create_options, file_in_archive, network_info
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

# A network whose containers were all removed that the engine still counts endpoints on: how often its removal is
# tried (each time after forcing those endpoints off), and the pause after the first try (growing by as much).
STALE_ENDPOINT_TRIES = 4
STALE_ENDPOINT_PAUSE = 0.25
# A bottle is held paused while another on an overlapping folder starts (runtime/stillness.py), and resumed
# once that one has started, a moment later (longer on gVisor): an exec meanwhile waits for it.
PAUSED_EXEC_SECONDS = 10
PAUSED_EXEC_POLL = 0.1


@contextlib.contextmanager
def _unless_gone(conflict_is_done: bool = False) -> Iterator[None]:
    """A call on a container that has nothing left to do when it is gone already (404), or, with
    ``conflict_is_done``, in a state where the call means nothing (409); other failures are the engine's."""
    try:
        yield
    except docker.errors.NotFound:
        pass
    except docker.errors.APIError as exc:
        if not (conflict_is_done and exc.status_code == 409):
            raise api_failed(exc) from None


def _paused(exc: docker.errors.APIError) -> bool:
    """Whether the engine refused a call because the container is paused (409, "... is paused ...")."""
    return exc.status_code == 409 and "paused" in str(exc.explanation or exc).lower()


class DockerEngine(Engine):
    """The seam on an engine's Docker API (``client``: ``connect()``); ``about``: what it said of itself
    (``describe_engine``), asked on first use when not given."""

    def __init__(self, client: docker.DockerClient, about: EngineInfo | None = None) -> None:
        self.client = client
        self._about = about

    def describe(self) -> EngineInfo:
        if self._about is None:
            self._about = describe_engine(self.client)
        return self._about

    def containers(self, label: str | None = None, network: NetworkInfo | None = None) -> list[ContainerInfo]:
        filters: dict[str, Any] = {}
        if label is not None:
            filters["label"] = label
        if network is not None:
            filters["network"] = [network.name, network.id]
        try:
            return [container_info(c) for c in self.client.containers.list(all=True, filters=filters)]
        except docker.errors.APIError as exc:
            raise api_failed(exc) from None

    def container(self, name: str) -> ContainerInfo | None:
        try:
            return container_info(self.client.containers.get(name))
        except docker.errors.NotFound:
            return None
        except docker.errors.APIError as exc:
            raise api_failed(exc) from None

    def create_placeholder(self, image: str, name: str, labels: dict[str, str]) -> ContainerInfo:
        try:
            return container_info(self.client.containers.create(image, name=name, labels=labels,
                                                                network_disabled=True))
        except docker.errors.APIError as exc:
            if exc.status_code == 409:
                raise NameTaken(f"a container {name} exists") from None
            raise api_failed(exc) from None

    def create_container(self, spec: ContainerSpec) -> ContainerInfo:
        try:
            return container_info(self._create(spec.image, create_options(spec), spec))
        except docker.errors.APIError as exc:
            if exc.status_code == 409:
                raise NameTaken(f"a container {spec.name} exists") from None
            raise api_failed(exc) from None

    def _create(self, image: str, options: dict[str, Any], spec: ContainerSpec) -> Container:
        return self.client.containers.create(image, **options)

    def start(self, name: str) -> None:
        try:
            self.client.api.start(name)
        except docker.errors.APIError as exc:
            raise api_failed(exc) from None

    def start_attached(self, name: str) -> socket.socket:
        try:
            attached = self.client.api.attach_socket(name, params={"stdin": 1, "stderr": 1, "stream": 1})
            self.client.api.start(name)
        except docker.errors.APIError as exc:
            raise api_failed(exc) from None
        raw: socket.socket = getattr(attached, "_sock", attached)  # the SDK wraps it; half-close needs the real one
        return raw

    def address(self, name: str, network: str) -> str:
        try:
            attrs = self.client.api.inspect_container(name)
        except docker.errors.APIError as exc:
            raise api_failed(exc) from None
        return str(((attrs.get("NetworkSettings") or {}).get("Networks") or {}).get(network, {}).get("IPAddress") or "")

    def read_file(self, name: str, path: str) -> bytes | None:
        try:
            chunks, _ = self.client.api.get_archive(name, path)
            archive = b"".join(chunks)
        except docker.errors.NotFound:
            return None
        except docker.errors.APIError as exc:
            raise api_failed(exc) from None
        return file_in_archive(archive)

    def stop(self, name: str, timeout: float) -> None:
        with _unless_gone():
            self.client.api.stop(name, timeout=timeout)

    def pause(self, name: str) -> None:
        with _unless_gone():
            self.client.api.pause(name)

    def unpause(self, name: str) -> None:
        with _unless_gone(conflict_is_done=True):  # 409: not paused
            self.client.api.unpause(name)

    def kill(self, name: str, signum: int) -> None:
        with _unless_gone(conflict_is_done=True):  # 409: not running
            self.client.api.kill(name, signal=signum)

    def remove_container(self, name: str) -> None:
        with _unless_gone():
            self.client.api.remove_container(name, force=True)

    def exec(self, name: str, argv: list[str], timeout: float | None = None) -> tuple[int, bytes]:
        if timeout is None:
            return self._exec(name, argv)
        # The SDK's read has no deadline of its own: a daemon thread, left blocked if the stream never ends.
        outcome: list[tuple[int, bytes] | BaseException] = []

        def run() -> None:
            try:
                outcome.append(self._exec(name, argv))
            except BaseException as exc:  # handed to the caller's thread
                outcome.append(exc)

        worker = threading.Thread(target=run, name=f"exec in {name}", daemon=True)
        worker.start()
        worker.join(timeout)
        if not outcome:
            raise DockerError(f"{argv[0]} in {name} did not finish within {timeout:g} s")
        if isinstance(outcome[0], BaseException):
            raise outcome[0]
        return outcome[0]

    def _exec(self, name: str, argv: list[str]) -> tuple[int, bytes]:
        deadline = time.monotonic() + PAUSED_EXEC_SECONDS
        while True:
            try:
                result = self.client.containers.get(name).exec_run(argv, stdout=True, stderr=True)
            except docker.errors.APIError as exc:
                if _paused(exc) and time.monotonic() < deadline:
                    time.sleep(PAUSED_EXEC_POLL)
                    continue
                raise api_failed(exc) from None
            return int(result.exit_code if result.exit_code is not None else -1), bytes(result.output or b"")

    def wait(self, name: str, timeout: float | None = None) -> int:
        try:
            return int(self.client.api.wait(name, timeout=timeout).get("StatusCode", 1))
        except docker.errors.APIError as exc:
            raise api_failed(exc) from None
        except (requests.exceptions.ReadTimeout, requests.exceptions.ConnectionError):
            if timeout is None:  # the engine itself went away
                raise
            raise DockerError(f"{name} did not exit within {timeout:g} s") from None

    def inspect(self, name: str) -> dict[str, Any]:
        try:
            return dict(self.client.api.inspect_container(name))
        except docker.errors.APIError as exc:
            raise api_failed(exc) from None

    def logs(self, name: str, stdout: bool = True, stderr: bool = True, follow: bool = False) -> Iterator[bytes]:
        try:
            return iter(self.client.api.logs(name, stdout=stdout, stderr=stderr, stream=True, follow=follow))
        except docker.errors.APIError as exc:
            raise api_failed(exc) from None

    def networks(self, label: str) -> list[NetworkInfo]:
        try:
            return [network_info(n.attrs) for n in self.client.networks.list(filters={"label": label})]
        except docker.errors.APIError as exc:
            raise api_failed(exc) from None

    def create_network(self, spec: NetworkSpec) -> NetworkInfo:
        options = {}
        if spec.isolated:
            # An internal bridge still gets the gateway address on the host side, and with it anything the
            # host serves on that address or on 0.0.0.0 would be in a bottle's reach: the bridge gets none.
            options["com.docker.network.bridge.inhibit_ipv4"] = "true"
        if spec.bridge:
            options["com.docker.network.bridge.name"] = spec.bridge
        try:
            return network_info(self.client.networks.create(spec.name, driver="bridge", internal=spec.internal,
                                                            options=options or None, labels=spec.labels).attrs)
        except docker.errors.APIError as exc:
            raise api_failed(exc) from None

    def network(self, name: str) -> NetworkInfo | None:
        try:
            return network_info(self.client.api.inspect_network(name))
        except docker.errors.NotFound:
            return None
        except docker.errors.APIError as exc:
            raise api_failed(exc) from None

    def connect(self, network: str, container: str, alias: str = "", address: str = "") -> None:
        try:
            self.client.api.connect_container_to_network(container, network, aliases=[alias] if alias else None,
                                                         ipv4_address=address or None)
        except docker.errors.APIError as exc:
            raise api_failed(exc) from None

    def remove_network(self, name: str, gone: Sequence[str] = ()) -> None:
        for attempt in range(STALE_ENDPOINT_TRIES):
            try:
                self.client.api.remove_network(name)
                return
            except docker.errors.NotFound:  # gone already
                return
            except docker.errors.APIError as exc:
                if "active endpoints" not in str(exc.explanation or exc) or not gone:
                    raise api_failed(exc) from None
                if attempt == STALE_ENDPOINT_TRIES - 1:
                    raise DockerError(f"{api_failed(exc)}; what was on it is gone, so the engine's count is "
                                      f"stale: restart the engine, then `docker network rm {name}`") from None
            # By name: the engine finds a stale endpoint by its container's name, not by the id it no longer lists.
            for container in gone:
                with contextlib.suppress(docker.errors.APIError):
                    self.client.api.disconnect_container_from_network(container, name, force=True)
            time.sleep(STALE_ENDPOINT_PAUSE * (attempt + 1))

    def create_volume(self, name: str, labels: dict[str, str]) -> str:
        try:
            return str(self.client.volumes.create(name, labels=labels).name)
        except docker.errors.APIError as exc:
            raise api_failed(exc) from None

    def remove_volume(self, name: str) -> None:
        try:
            self.client.api.remove_volume(name, force=True)
        except docker.errors.NotFound:  # gone already
            pass
        except docker.errors.APIError as exc:
            raise api_failed(exc) from None

    def volumes_labelled(self, label: str) -> dict[str, dict[str, str]]:
        try:
            found = self.client.api.volumes(filters={"label": label}).get("Volumes") or []
        except docker.errors.APIError as exc:
            raise api_failed(exc) from None
        return {str(volume["Name"]): dict(volume.get("Labels") or {}) for volume in found}

    def image_ids(self, repository: str) -> list[str]:
        try:
            return [str(image.id) for image in self.client.images.list(name=repository)]
        except docker.errors.APIError as exc:
            raise api_failed(exc) from None

    def image_exists(self, reference: str) -> bool:
        try:
            self.client.images.get(reference)
            return True
        except docker.errors.ImageNotFound:
            return False
        except docker.errors.APIError as exc:
            raise api_failed(exc) from None

    def build_image(self, context: Path, tag: str, buildargs: dict[str, str]) -> Iterator[str]:
        try:
            for chunk in self.client.api.build(path=str(context), tag=tag, buildargs=buildargs, rm=True,
                                               forcerm=True, decode=True, pull=False):
                if "error" in chunk:
                    raise BuildFailed(str(chunk["error"]))
                yield from str(chunk.get("stream", "")).splitlines()
        except docker.errors.APIError as exc:
            raise BuildFailed(str(exc.explanation or exc)) from None

    def pull_image(self, reference: str) -> None:
        try:
            self.client.images.pull(reference)
        except docker.errors.APIError as exc:
            raise api_failed(exc) from None

    def import_image(self, archive: Path, repository: str, tag: str, changes: tuple[str, ...] = ()) -> None:
        try:
            self.client.api.import_image_from_file(str(archive), repository=repository, tag=tag,
                                                   changes=list(changes))
        except docker.errors.APIError as exc:
            raise api_failed(exc) from None

    def prune_images(self, label: str) -> None:
        try:
            self.client.images.prune(filters={"dangling": True, "label": label})
        except docker.errors.APIError as exc:
            raise api_failed(exc) from None

    def attach_command(self, name: str, interactive: bool) -> list[str]:
        return [docker_cli(), "start", "--attach", *(["--interactive"] if interactive else []), name]

    def exec_command(self, name: str, argv: list[str], tty: bool) -> list[str]:
        # no -u: docker exec runs as the container's own user, the one the bottle was started as
        return [docker_cli(), "exec", "-it" if tty else "-i", name, *argv]
