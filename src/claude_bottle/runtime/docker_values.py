"""The seam's plain values and the Docker SDK's, each way: the engine's descriptions of containers and networks
as ``ContainerInfo`` and ``NetworkInfo``, a ``ContainerSpec`` as the SDK's create keywords, and a file out of
the engine's archive of it. No requests: these only translate."""

from __future__ import annotations

import contextlib
import io
import ipaddress
import tarfile
from typing import Any

from docker.models.containers import Container
from docker.types import LogConfig
from docker.types import Mount as DockerMount

from claude_bottle.runtime.seam import ContainerInfo, ContainerSpec, Mount, NetworkInfo

# Every container's: no capabilities, and no privileges gained through setuid programs or file capabilities.
CAP_DROP = ("ALL",)
SECURITY_OPT = ("no-new-privileges",)
# What a container may leave in the engine's logs (the gate's audit, the bottle's output), whatever it floods.
LOG_CONFIG = LogConfig(type=LogConfig.types.JSON, config={"max-size": "5m", "max-file": "2"})


def container_info(container: Container) -> ContainerInfo:
    """A container from the SDK's model of it."""
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
    options: dict[str, Any] = {"name": spec.name, "labels": spec.labels, "cap_drop": list(CAP_DROP),
                               "security_opt": list(SECURITY_OPT)}
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


def file_in_archive(archive: bytes) -> bytes:
    """The content of the tar ``archive``'s first member (the engine's archive of one path) when it is a
    regular file; empty when it is anything else (a symlink, a folder)."""
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        member = tar.next()
        extracted = tar.extractfile(member) if member is not None and member.isfile() else None
        return extracted.read() if extracted is not None else b""
