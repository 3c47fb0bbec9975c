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
# The version of Podman's own API that requests to it name: the first with netavark, which every later Podman
# still answers.
LIBPOD_API = "v4.0.0"


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
    # The bottle's limits (LIMITS' names) this engine cannot enforce: rootless Podman applies a limit only
    # through a cgroup controller delegated to the user (cgroup v2), and on cgroup v1 ignores them all.
    unenforced: tuple[str, ...] = ()

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
    unenforced: tuple[str, ...] = ()
    if kind == "Podman":
        rootless, unenforced = _podman_host(libpod(client, "GET", "/info"))
    return EngineInfo(kind, _numbers(str(about.get("Version", "0"))), runtimes, default, rootless, unenforced)


# The bottle's limits (config Resources, set on the bottle in runtime/run.py) and the cgroup controller each needs.
LIMITS = {"memory": "memory", "CPU": "cpu", "process": "pids"}


def libpod(client: docker.DockerClient, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
    """A request to Podman's own API (``/libpod/...``) beside its Docker-compatible one, for what the latter
    cannot say or do; the decoded JSON answer. A DockerError with Podman's message when it refuses."""
    api = client.api
    try:
        response = api.request(method, f"{api.base_url}/{LIBPOD_API}/libpod{path}", json=body,
                               timeout=api.timeout)
        answer = response.json()
    except (docker.errors.DockerException, OSError, ValueError) as exc:
        raise DockerError(f"Podman's API ({path}) failed: {exc}") from None
    if response.status_code >= 400:
        message = answer.get("message") if isinstance(answer, dict) else None
        raise DockerError(f"Podman refused {path}: {message or response.status_code}")
    return answer


def _podman_host(info: dict[str, Any]) -> tuple[bool, tuple[str, ...]]:
    """From Podman's own info: whether it runs rootless (its Docker-compatible info does not say so: Podman
    4.3, Debian bookworm's, lists no ``name=rootless`` among its SecurityOptions), and which of the bottle's
    limits it cannot enforce then."""
    host = info.get("host") or {}
    if not (host.get("security") or {}).get("rootless"):
        return False, ()
    controllers = set(host.get("cgroupControllers") or []) if host.get("cgroupVersion") == "v2" else set()
    return True, tuple(limit for limit, controller in LIMITS.items() if controller not in controllers)


def unenforced_limits(info: EngineInfo) -> str:
    """What to tell the user when the engine cannot enforce some of the bottle's limits; empty when it can."""
    if not info.unenforced:
        return ""
    names = info.unenforced
    listed = ", ".join(names[:-1]) + " and " + names[-1] if len(names) > 1 else names[0]
    controllers = ", ".join(LIMITS[name] for name in names)
    return (f"this engine does not enforce the bottle's {listed} limits: rootless Podman sets a limit only through "
            f"a cgroup v2 controller delegated to your user ({controllers} here are not); see docs/engines.md, "
            "\"Rootless Podman\"")


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
