"""The engine seam (``runtime.seam``) on Docker, and on Podman through its Docker-compatible API (and its own
where that one cannot say or do something): the one place that speaks the Docker SDK."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import ipaddress
import shutil
import socket
import tarfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import docker.errors
import requests
from docker.models.containers import Container
from docker.types import LogConfig
from docker.types import Mount as DockerMount

from claude_bottle.errors import DockerError
from claude_bottle.runtime import engine
from claude_bottle.runtime.engine import EngineInfo
from claude_bottle.runtime.seam import (
    BuildFailed,
    ContainerInfo,
    ContainerSpec,
    Engine,
    Mount,
    NameTaken,
    NetworkInfo,
    NetworkSpec,
)

# What a container may leave in the engine's logs (the gate's audit, the bottle's output), whatever it floods.
LOG_CONFIG = LogConfig(type=LogConfig.types.JSON, config={"max-size": "5m", "max-file": "2"})
# Podman leaves IPv6 on in a container whose networks have none, so a bottle could send link-local packets to
# its bridge, which rootless Podman keeps in its own network namespace, beyond any host firewall. Docker turns
# it off the same way.
PODMAN_SYSCTLS = {"net.ipv6.conf.all.disable_ipv6": "1", "net.ipv6.conf.default.disable_ipv6": "1"}
# The version of Podman's own API that requests to it name: the first with netavark, which every later Podman
# still answers.
LIBPOD_API = "v4.0.0"


def connect() -> docker.DockerClient:
    """The SDK's client of the engine at $DOCKER_HOST (or the default socket), answering; else a DockerError
    that says what to do."""
    try:
        client = docker.from_env(timeout=120)
        client.ping()
    except docker.errors.DockerException as exc:
        raise DockerError(
            f"cannot reach the container engine ({exc}); start Docker (or `podman system service`), or set "
            "DOCKER_HOST to where it listens"
        ) from None
    return client


def libpod_answer(path: str, status: int, answer: Any) -> Any:
    """Podman's answer to a request to ``path`` of its own API; a DockerError with its message when it refused."""
    if status >= 400:
        message = answer.get("message") if isinstance(answer, dict) else None
        raise DockerError(f"Podman refused {path}: {message or status}")
    return answer


def libpod(client: docker.DockerClient, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
    """A request to Podman's own API (``/libpod/...``) beside its Docker-compatible one, for what the latter
    cannot say or do; the decoded JSON answer (``libpod_answer``)."""
    api = client.api
    try:
        response = api.request(method, f"{api.base_url}/{LIBPOD_API}/libpod{path}", json=body,
                               timeout=api.timeout)
        answer = response.json()
    except (docker.errors.DockerException, OSError, ValueError) as exc:
        raise DockerError(f"Podman's API ({path}) failed: {exc}") from None
    return libpod_answer(path, response.status_code, answer)


def describe_engine(client: docker.DockerClient) -> EngineInfo:
    """What the engine says about itself (``engine.engine_info``): its version and info endpoints, and
    Podman's own info for what those do not say."""
    try:
        version, info = client.version(), client.info()
    except docker.errors.APIError as exc:
        raise _failed(exc) from None
    podman_info = libpod(client, "GET", "/info") if engine.is_podman(version) else None
    return engine.engine_info(version, info, podman_info)


def docker_cli() -> str:
    """The engine's command-line client, which attaches a terminal (``docker`` speaks Podman's API too)."""
    cli = shutil.which("docker")
    if cli is None:
        raise DockerError("the docker command is needed to attach a terminal; install the Docker CLI")
    return cli


def file_in_archive(archive: bytes) -> bytes:
    """The content of the tar ``archive``'s first member (the engine's archive of one path) when it is a
    regular file; empty when it is anything else (a symlink, a folder)."""
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        member = tar.next()
        extracted = tar.extractfile(member) if member is not None and member.isfile() else None
        return extracted.read() if extracted is not None else b""


def _failed(exc: docker.errors.APIError) -> DockerError:
    return DockerError(str(exc.explanation or exc))


def container_info(container: Container) -> ContainerInfo:
    attrs = container.attrs
    mounts = {str(m.get("Destination", "")): str(m.get("Source") or m.get("Name") or "")
              for m in attrs.get("Mounts") or []}
    return ContainerInfo(id=str(container.id), name=str(container.name), status=str(container.status),
                         labels=dict(container.labels or {}), image=str(attrs.get("Image", "")),
                         created=str(attrs.get("Created", "")), mounts=mounts)


def network_info(attrs: dict[str, Any]) -> NetworkInfo:
    """A network from the engine's description of it (``docker network inspect``'s)."""
    subnets, gateways = [], []
    for pool in attrs.get("IPAM", {}).get("Config") or []:
        if pool.get("Subnet"):
            subnets.append(str(pool["Subnet"]))
        with contextlib.suppress(ValueError):  # Podman's internal networks show "<nil>"
            gateways.append(str(ipaddress.ip_address(pool.get("Gateway") or "")))
    return NetworkInfo(id=str(attrs.get("Id", "")), name=str(attrs.get("Name", "")),
                       labels=dict(attrs.get("Labels") or {}), created=str(attrs.get("Created", "")),
                       subnets=tuple(subnets), gateways=tuple(gateways))


def docker_mount(mount: Mount) -> DockerMount:
    """``mount`` as the SDK's (a tmpfs where it has no source)."""
    if not mount.source:
        return DockerMount(mount.target, None, type="tmpfs", read_only=mount.read_only, tmpfs_mode=mount.tmpfs_mode,
                           tmpfs_size=mount.tmpfs_size)
    return DockerMount(mount.target, mount.source, type="bind", read_only=mount.read_only)


def create_options(spec: ContainerSpec) -> dict[str, Any]:
    """``spec`` as the SDK's ``containers.create`` keywords (but the image): only what it sets."""
    options: dict[str, Any] = {"name": spec.name, "labels": spec.labels, "cap_drop": ["ALL"],
                               "security_opt": ["no-new-privileges"]}
    chosen: dict[str, Any] = {
        "command": list(spec.command), "entrypoint": list(spec.entrypoint), "network": spec.network,
        "networking_config": {spec.network: {"Aliases": list(spec.aliases)}} if spec.aliases else None,
        "network_mode": f"container:{spec.network_of}" if spec.network_of else "", "user": spec.user,
        "environment": spec.environment, "working_dir": spec.working_dir, "tty": spec.tty,
        "stdin_open": spec.stdin_open, "read_only": spec.read_only, "tmpfs": spec.tmpfs, "dns": list(spec.dns),
        "dns_search": list(spec.dns_search), "dns_opt": list(spec.dns_opt), "runtime": spec.runtime,
        "log_config": LOG_CONFIG if spec.bounded_logs else None,
        "volumes": {source: {"bind": target, "mode": "ro" if read_only else "rw"}
                    for source, target, read_only in spec.binds},
        "mounts": [docker_mount(m) for m in spec.mounts],
    }
    options.update({key: value for key, value in chosen.items() if value})
    for key, value in (("pids_limit", spec.pids_limit), ("mem_limit", spec.memory), ("nano_cpus", spec.nano_cpus)):
        if value is not None:
            options[key] = value
    return options


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
            raise _failed(exc) from None

    def container(self, name: str) -> ContainerInfo | None:
        try:
            return container_info(self.client.containers.get(name))
        except docker.errors.NotFound:
            return None
        except docker.errors.APIError as exc:
            raise _failed(exc) from None

    def create_placeholder(self, image: str, name: str, labels: dict[str, str]) -> ContainerInfo:
        try:
            return container_info(self.client.containers.create(image, name=name, labels=labels,
                                                                network_disabled=True))
        except docker.errors.APIError as exc:
            if exc.status_code == 409:
                raise NameTaken(f"a container {name} exists") from None
            raise _failed(exc) from None

    def create_container(self, spec: ContainerSpec) -> ContainerInfo:
        try:
            return container_info(self._create(spec.image, create_options(spec), spec))
        except docker.errors.APIError as exc:
            if exc.status_code == 409:
                raise NameTaken(f"a container {spec.name} exists") from None
            raise _failed(exc) from None

    def _create(self, image: str, options: dict[str, Any], spec: ContainerSpec) -> Container:
        return self.client.containers.create(image, **options)

    def start(self, name: str) -> None:
        try:
            self.client.api.start(name)
        except docker.errors.APIError as exc:
            raise _failed(exc) from None

    def start_attached(self, name: str) -> socket.socket:
        try:
            attached = self.client.api.attach_socket(name, params={"stdin": 1, "stderr": 1, "stream": 1})
            self.client.api.start(name)
        except docker.errors.APIError as exc:
            raise _failed(exc) from None
        raw: socket.socket = getattr(attached, "_sock", attached)  # the SDK wraps it; half-close needs the real one
        return raw

    def address(self, name: str, network: str) -> str:
        try:
            attrs = self.client.api.inspect_container(name)
        except docker.errors.APIError as exc:
            raise _failed(exc) from None
        return str(((attrs.get("NetworkSettings") or {}).get("Networks") or {}).get(network, {}).get("IPAddress") or "")

    def read_file(self, name: str, path: str) -> bytes | None:
        try:
            chunks, _ = self.client.api.get_archive(name, path)
            archive = b"".join(chunks)
        except docker.errors.NotFound:
            return None
        except docker.errors.APIError as exc:
            raise _failed(exc) from None
        return file_in_archive(archive)

    def stop(self, name: str, timeout: float) -> None:
        try:
            self.client.api.stop(name, timeout=timeout)
        except docker.errors.NotFound:  # gone already
            pass
        except docker.errors.APIError as exc:
            raise _failed(exc) from None

    def kill(self, name: str, signum: int) -> None:
        try:
            self.client.api.kill(name, signal=signum)
        except docker.errors.NotFound:  # gone already
            pass
        except docker.errors.APIError as exc:
            if exc.status_code != 409:  # 409: not running
                raise _failed(exc) from None

    def remove_container(self, name: str) -> None:
        try:
            self.client.api.remove_container(name, force=True)
        except docker.errors.NotFound:  # gone already
            pass
        except docker.errors.APIError as exc:
            raise _failed(exc) from None

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
        try:
            result = self.client.containers.get(name).exec_run(argv, stdout=True, stderr=True)
        except docker.errors.APIError as exc:
            raise _failed(exc) from None
        return int(result.exit_code if result.exit_code is not None else -1), bytes(result.output or b"")

    def wait(self, name: str, timeout: float | None = None) -> int:
        try:
            return int(self.client.api.wait(name, timeout=timeout).get("StatusCode", 1))
        except docker.errors.APIError as exc:
            raise _failed(exc) from None
        except (requests.exceptions.ReadTimeout, requests.exceptions.ConnectionError):
            if timeout is None:  # the engine itself went away
                raise
            raise DockerError(f"{name} did not exit within {timeout:g} s") from None

    def inspect(self, name: str) -> dict[str, Any]:
        try:
            return dict(self.client.api.inspect_container(name))
        except docker.errors.APIError as exc:
            raise _failed(exc) from None

    def logs(self, name: str, stdout: bool = True, stderr: bool = True, follow: bool = False) -> Iterator[bytes]:
        try:
            return iter(self.client.api.logs(name, stdout=stdout, stderr=stderr, stream=True, follow=follow))
        except docker.errors.APIError as exc:
            raise _failed(exc) from None

    def networks(self, label: str) -> list[NetworkInfo]:
        try:
            return [network_info(n.attrs) for n in self.client.networks.list(filters={"label": label})]
        except docker.errors.APIError as exc:
            raise _failed(exc) from None

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
            raise _failed(exc) from None

    def network(self, name: str) -> NetworkInfo | None:
        try:
            return network_info(self.client.api.inspect_network(name))
        except docker.errors.NotFound:
            return None
        except docker.errors.APIError as exc:
            raise _failed(exc) from None

    def connect(self, network: str, container: str, alias: str = "", address: str = "") -> None:
        try:
            self.client.api.connect_container_to_network(container, network, aliases=[alias] if alias else None,
                                                         ipv4_address=address or None)
        except docker.errors.APIError as exc:
            raise _failed(exc) from None

    def remove_network(self, name: str) -> None:
        try:
            self.client.api.remove_network(name)
        except docker.errors.NotFound:  # gone already
            pass
        except docker.errors.APIError as exc:
            raise _failed(exc) from None

    def create_volume(self, name: str, labels: dict[str, str]) -> str:
        try:
            return str(self.client.volumes.create(name, labels=labels).name)
        except docker.errors.APIError as exc:
            raise _failed(exc) from None

    def remove_volume(self, name: str) -> None:
        try:
            self.client.api.remove_volume(name, force=True)
        except docker.errors.NotFound:  # gone already
            pass
        except docker.errors.APIError as exc:
            raise _failed(exc) from None

    def image_ids(self, repository: str) -> list[str]:
        try:
            return [str(image.id) for image in self.client.images.list(name=repository)]
        except docker.errors.APIError as exc:
            raise _failed(exc) from None

    def image_exists(self, reference: str) -> bool:
        try:
            self.client.images.get(reference)
            return True
        except docker.errors.ImageNotFound:
            return False
        except docker.errors.APIError as exc:
            raise _failed(exc) from None

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
            raise _failed(exc) from None

    def import_image(self, archive: Path, repository: str, tag: str, changes: tuple[str, ...] = ()) -> None:
        try:
            self.client.api.import_image_from_file(str(archive), repository=repository, tag=tag,
                                                   changes=list(changes))
        except docker.errors.APIError as exc:
            raise _failed(exc) from None

    def prune_images(self, label: str) -> None:
        try:
            self.client.images.prune(filters={"dangling": True, "label": label})
        except docker.errors.APIError as exc:
            raise _failed(exc) from None

    def attach_command(self, name: str, interactive: bool) -> list[str]:
        return [docker_cli(), "start", "--attach", *(["--interactive"] if interactive else []), name]

    def exec_command(self, name: str, argv: list[str], tty: bool) -> list[str]:
        # no -u: docker exec runs as the container's own user, the one the bottle was started as
        return [docker_cli(), "exec", "-it" if tty else "-i", name, *argv]


class PodmanEngine(DockerEngine):
    """The seam on Podman: its Docker-compatible API, and its own (``libpod``) where that one cannot
    say or do something."""

    internal_names = False
    pooled_networks = False
    bridges_on_host = True
    stdin_ends_with_client = False

    def __init__(self, client: docker.DockerClient, about: EngineInfo | None = None, rootless: bool = False) -> None:
        """``rootless``: whether it runs as an ordinary user, unless ``about`` says."""
        super().__init__(client, about)
        self.rootless = about.rootless if about is not None else rootless

    def _create(self, image: str, options: dict[str, Any], spec: ContainerSpec) -> Container:
        """Without IPv6 where asked (``PODMAN_SYSCTLS``), and on rootless Podman the host user's uid kept
        (user namespace ``keep-id``): rootless Podman maps the container's root to the user and every other
        uid to the user's subordinate ids, so a bottle running as the user's uid would be a stranger on the
        host, unable to write the workspace. A container joining another's network namespace joins its user
        namespace as well: the other's user (the bottle's, for verify's probe) is then the same user there,
        under the same mapping."""
        if spec.no_ipv6:
            options = {**options, "sysctls": PODMAN_SYSCTLS}
        if self.rootless and spec.host_user:
            return create_in_userns(self.client, image, "keep-id", options)
        if self.rootless and spec.network_of:
            return create_in_userns(self.client, image, f"container:{spec.network_of}", options)
        return self.client.containers.create(image, **options)

    def create_network(self, spec: NetworkSpec) -> NetworkInfo:
        """An internal network is made through Podman's own API: without a resolver. With one (what its
        Docker-compatible API always makes) the bridge gets the gateway address, on the host (rootful) or in
        rootless Podman's network namespace, and there Podman's resolver, aardvark-dns, answers the bottle and
        forwards whatever it does not know to the host's resolvers: a way out for any name the bottle makes
        up. Without a resolver the bridge has no address at all, and nothing resolves names there."""
        if not spec.isolated:
            return super().create_network(spec)
        created = libpod(self.client, "POST", "/networks/create", {
            "name": spec.name, "driver": "bridge", "internal": True, "dns_enabled": False,
            **({"network_interface": spec.bridge} if spec.bridge else {}), "labels": spec.labels})
        found = self.network(spec.name)
        if found is None:
            raise DockerError(f"cannot find the internal network just made ({spec.name})")
        subnets = tuple(str(s["subnet"]) for s in created.get("subnets") or [])
        return dataclasses.replace(found, subnets=subnets or found.subnets)


def create_in_userns(client: docker.DockerClient, image: str, userns: str, options: dict[str, Any]) -> Container:
    """``client.containers.create(image, **options)`` in the user namespace ``userns``, which the SDK refuses
    but for "host": the request is made with the SDK's own arguments and the mode added to its host config."""
    from docker.models.containers import _create_container_args

    arguments = _create_container_args({**options, "image": image, "version": client.api._version})
    arguments["host_config"]["UsernsMode"] = userns
    return client.containers.get(client.api.create_container(**arguments)["Id"])


def create_container(client: docker.DockerClient, image: str, userns: str = "", **options: Any) -> Container:
    """``client.containers.create(image, **options)``, in the user namespace ``userns`` when one is given."""
    if not userns:
        return client.containers.create(image, **options)
    return create_in_userns(client, image, userns, options)


def engine_for(client: docker.DockerClient, about: EngineInfo) -> DockerEngine:
    """The implementation for the engine ``about`` describes."""
    return PodmanEngine(client, about) if about.podman else DockerEngine(client, about)


def open_engine(client: docker.DockerClient | None = None) -> DockerEngine:
    """The engine answering on the Docker API (``connect()`` unless ``client`` is given), Docker's or
    Podman's implementation as it names itself."""
    client = client or connect()
    return engine_for(client, describe_engine(client))
