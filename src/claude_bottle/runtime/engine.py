"""The container engine connection (Docker, or Podman through its Docker-compatible API), with errors that
say what to do."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker
import docker.errors

from claude_bottle.errors import DockerError

# Engines before 25.0.5 let containers on internal networks resolve external names (CVE-2024-29018).
DNS_FIXED_VERSION = (25, 0, 5)


def connect() -> docker.DockerClient:
    try:
        client = docker.from_env(timeout=120)
        client.ping()
    except docker.errors.DockerException as exc:
        raise DockerError(
            f"cannot reach the container engine ({exc}); start Docker (or `podman system service`), or set "
            "DOCKER_HOST to where it listens"
        ) from None
    return client


def _numbers(text: str) -> tuple[int, ...]:
    numbers = []
    for part in text.split("+")[0].split("-")[0].split("~")[0].split("."):
        numbers.append(int(part) if part.isdigit() else 0)
    return tuple(numbers)


def version(client: docker.DockerClient) -> tuple[int, ...]:
    return _numbers(str(client.version().get("Version", "0")))


@dataclass(frozen=True)
class EngineInfo:
    """Which engine answers on the Docker API: ``kind`` is "Docker" or "Podman"."""

    kind: str
    version: tuple[int, ...]
    runtimes: tuple[str, ...]  # OCI runtimes registered with the engine (runc, runsc, crun, ...)
    default_runtime: str
    rootless: bool

    @property
    def podman(self) -> bool:
        return self.kind == "Podman"

    def describe(self) -> str:
        mode = ", rootless" if self.rootless else ""
        return f"{self.kind} {'.'.join(map(str, self.version))}{mode}"


def describe(client: docker.DockerClient) -> EngineInfo:
    """The engine's kind, version and OCI runtimes, from its version and info endpoints (Podman names
    itself among the version's components)."""
    about = client.version()
    components = [str(c.get("Name", "")) for c in about.get("Components") or []]
    kind = "Podman" if any(name.startswith("Podman") for name in components) else "Docker"
    info = client.info()
    registered: dict[str, Any] = info.get("Runtimes") or {}
    if kind == "Podman":  # Podman lists every runtime its configuration knows of, installed or not
        registered = {name: entry for name, entry in registered.items()
                      if not isinstance(entry, dict) or Path(str(entry.get("path", ""))).exists()}
    runtimes = tuple(sorted(registered))
    default = str(info.get("DefaultRuntime") or "")
    options = [str(o) for o in info.get("SecurityOptions") or []]
    rootless = any("rootless" in o for o in options)
    return EngineInfo(kind, _numbers(str(about.get("Version", "0"))), runtimes, default, rootless)


def check_runtime(info: EngineInfo, runtime: str, origin: str) -> None:
    """A DockerError naming ``origin`` (where the runtime was asked for) when the engine lacks ``runtime``."""
    if not runtime:
        return
    if runtime in info.runtimes:
        return
    known = ", ".join(info.runtimes) or "none listed"
    raise DockerError(
        f"{origin}: the engine ({info.describe()}) has no OCI runtime {runtime!r} (it has: {known}); install it "
        "and register it with the engine (for gVisor: scripts/gvisor, or see docs/engines.md), or leave the "
        "runtime unset")
