"""``[[mounts]]``: host files and folders in the bottle. A source is only a real file or folder, named by its
real path, that reaches nothing a bottle must never reach: the engine's socket, the Docker client's folder,
claude-bottle's own config and state, and (checked at start) the workspace, which reaches none of those
either."""

from __future__ import annotations

import os
import stat
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from claude_bottle.agent.fields import Fields
from claude_bottle.errors import ConfigError
from claude_bottle.paths import config_dir, state_dir


@dataclass(frozen=True)
class Mount:
    """A ``[[mounts]]`` entry: a host file or folder at ``target`` in the bottle."""

    source: Path  # checked: a real file or folder, its path free of symlinks, nothing the bottle must not reach
    target: str
    read_only: bool
    origin: str = ""  # "FILE: mounts[N].source", for messages


def parse_mounts(value: Any, top: Fields) -> tuple[Mount, ...]:
    if not isinstance(value, list):
        raise top.fail("mounts", 'must be a list of tables: [[mounts]] source = "~/data" target = "/data"')
    mounts = []
    for i, entry in enumerate(value):
        fields = Fields(entry if isinstance(entry, dict) else {}, top.source, f"mounts[{i}].")
        fields.check_keys({"source", "target", "mode"})
        source = _mount_source(fields.string("source"), fields)
        target = fields.string("target")
        if not target.startswith("/") or target in ("/", "/workspace") or ".." in target.split("/"):
            raise fields.fail("target", f"{target!r} must be an absolute path other than / and /workspace")
        mode = fields.string("mode", "ro")
        if mode not in ("ro", "rw"):
            raise fields.fail("mode", f"{mode!r} must be 'ro' or 'rw'")
        mounts.append(Mount(source, target, mode == "ro", f"{top.source}: mounts[{i}].source"))
    return tuple(mounts)


def engine_paths() -> tuple[Path, ...]:
    """Where a Docker engine may listen on this host, and the Docker client's folder (its credentials): a
    bottle that reached one would own the host."""
    paths = [Path("/var/run/docker.sock"), Path("/run/docker.sock"), Path.home() / ".docker"]
    host = os.environ.get("DOCKER_HOST", "")
    if host.startswith("unix://"):
        paths.append(Path(host.removeprefix("unix://")))
    if os.environ.get("XDG_RUNTIME_DIR"):
        paths.append(Path(os.environ["XDG_RUNTIME_DIR"], "docker.sock"))
    return tuple(paths)


def _relation(source: Path, protected: Path) -> str:
    """How ``source`` touches ``protected`` ("is", "contains", "lies under"), or "" if it does not."""
    protected = Path(os.path.realpath(protected))
    if source == protected:
        return "is"
    return "contains" if protected.is_relative_to(source) else "lies under" if source.is_relative_to(protected) else ""


_KINDS = {stat.S_IFSOCK: "socket", stat.S_IFCHR: "character device", stat.S_IFBLK: "block device",
          stat.S_IFIFO: "named pipe"}


def _mount_source(written: str, fields: Fields) -> Path:
    """A mount source exactly as it will be mounted: an existing regular file or folder, named by its real
    path (a symlink anywhere on the way could be pointed elsewhere later), and none of the engine's socket,
    the Docker client's folder, or claude-bottle's own config and state (the token file, the runs' audit)."""
    path = Path(os.path.expanduser(written))
    if not path.is_absolute():
        raise fields.fail("source", f"{written!r} must be an absolute path or start with ~")
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        raise fields.fail("source", f"{path} does not exist") from None
    except OSError as exc:
        raise fields.fail("source", f"{path}: cannot be read ({exc.strerror})") from None
    if stat.S_ISLNK(info.st_mode):
        raise fields.fail("source", f"{path} is a symlink (to {os.path.realpath(path)}); name the real file or "
                                    "folder, as long as nothing below forbids it")
    if not (stat.S_ISREG(info.st_mode) or stat.S_ISDIR(info.st_mode)):
        kind = _KINDS.get(stat.S_IFMT(info.st_mode), "special file")
        raise fields.fail("source", f"{path} is a {kind}: only regular files and folders can be mounted")
    resolved = Path(os.path.realpath(path))
    if resolved != path:
        raise fields.fail("source", f"{path} resolves to {resolved} (through a symlink or '..' on the way); "
                                    "write the real path")
    for protected, what in never_mounted():
        if relation := _relation(resolved, protected):
            raise fields.fail("source", f"{path} {relation} {what}, {protected}: a bottle must never reach it; "
                                        "mount a folder of its own instead")
    return resolved


def never_mounted() -> list[tuple[Path, str]]:
    """What no mount may be, hold or lie in, the workspace's included: each with what it is."""
    return [(p, "the Docker engine's socket or client folder") for p in engine_paths()] + \
        [(config_dir(), "claude-bottle's config folder (the token file, the agents)"),
         (state_dir(), "claude-bottle's state folder (the runs' audit)")]


def running_from() -> list[Path]:
    """What the host runs as claude-bottle: its package, its Python environment and the folders it imports
    from (a project's ``.venv`` it was installed in, the source of an editable install)."""
    import claude_bottle

    return [Path(claude_bottle.__file__).parent, Path(sys.prefix), *(Path(p) for p in sys.path if os.path.isdir(p))]


def check_workspace(workspace: Path) -> None:
    """The workspace is mounted read-write, so it may reach none of ``never_mounted`` either (``~/.config``,
    where one edits dotfiles, holds claude-bottle's token file), nor hold what the host runs as claude-bottle
    (``running_from``): a bottle would change the code of the next start."""
    for protected, what in never_mounted():
        if relation := _relation(workspace, protected):
            raise ConfigError(f"refusing the workspace {workspace}: it {relation} {what}, {protected}, which a "
                              "bottle must never reach; run from a folder that does not hold it, or pass "
                              "--workspace DIR")
    _hold_no_code(workspace, "the workspace")


def _hold_no_code(place: Path, what: str) -> None:
    for code in running_from():
        if _relation(place, code) in ("is", "contains"):
            raise ConfigError(f"refusing {what} {place}: it holds {code}, which this claude-bottle runs from on the "
                              "host, so a bottle could change what runs at the next start; install claude-bottle "
                              "outside it (pipx, `uv tool install`, or a virtual environment of its own)")


def check_mounts(mounts: tuple[Mount, ...], workspace: Path) -> None:
    """No mount may reach the workspace: it is at /workspace already, with its .git protections, which a
    second, writable view of it (or of a folder around it) would bypass."""
    for mount in mounts:
        if not mount.read_only:
            _hold_no_code(mount.source, f"the writable mount {mount.origin}:")
        if relation := _relation(mount.source, workspace):
            raise ConfigError(f"{mount.origin}: {mount.source} {relation} the workspace {workspace}, which the "
                              "bottle has at /workspace already; mount another folder")
