"""What a container engine says about itself (Docker, or Podman through its Docker-compatible API), read from
its answers, and the errors that say what to do about it. No I/O: the engine seam's implementations
(``runtime.docker_api``) ask the engine and hand its answers here."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from claude_bottle.errors import DockerError

# Engines before 25.0.5 let containers on internal networks resolve external names (CVE-2024-29018).
DNS_FIXED_VERSION = (25, 0, 5)


def version_numbers(text: str) -> tuple[int, ...]:
    """A version as the engine writes it ("25.0.5", "20.10.24+dfsg1", "4.3.1-dev") as numbers; a part
    that is not one is 0."""
    numbers = []
    for part in text.split("+")[0].split("-")[0].split("~")[0].split("."):
        numbers.append(int(part) if part.isdigit() else 0)
    return tuple(numbers)


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


def is_podman(version: dict[str, Any]) -> bool:
    """Whether the engine's version answer is Podman's (it names itself among the components)."""
    return any(str(c.get("Name", "")).startswith("Podman") for c in version.get("Components") or [])


def engine_info(version: dict[str, Any], info: dict[str, Any], podman_info: dict[str, Any] | None = None,
                exists: Callable[[Path], bool] = Path.exists) -> EngineInfo:
    """The engine's kind, version and OCI runtimes from its answers: the Docker API's version and info, and
    for Podman (``is_podman``) its own info (``podman_info``; none: rootful, every limit enforced).
    ``exists``: whether a runtime's program is installed (Podman lists every runtime its configuration
    knows of)."""
    kind = "Podman" if is_podman(version) else "Docker"
    registered: dict[str, Any] = info.get("Runtimes") or {}
    if kind == "Podman":
        registered = {name: entry for name, entry in registered.items()
                      if not isinstance(entry, dict) or exists(Path(str(entry.get("path", ""))))}
    runtimes = tuple(sorted(registered))
    default = str(info.get("DefaultRuntime") or "")
    options = [str(o) for o in info.get("SecurityOptions") or []]
    rootless = any("rootless" in o for o in options)
    unenforced: tuple[str, ...] = ()
    if kind == "Podman":
        rootless, unenforced = podman_host(podman_info or {})
    return EngineInfo(kind, version_numbers(str(version.get("Version", "0"))), runtimes, default, rootless,
                      unenforced)


# The bottle's limits (config Resources, set on the bottle in runtime/run.py) and the cgroup controller each needs.
LIMITS = {"memory": "memory", "CPU": "cpu", "process": "pids"}


def podman_host(info: dict[str, Any]) -> tuple[bool, tuple[str, ...]]:
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
