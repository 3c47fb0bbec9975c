"""Where claude-bottle keeps things on the host. Every path is computed when asked (never at import), so
``XDG_CONFIG_HOME`` / ``XDG_STATE_HOME`` set by a test or a user take effect.

- config: what the user writes (agents, the token file, approvals of project files).
- state: what claude-bottle records (finished runs' audit, per-workspace records).

Nothing under either is ever mounted into a bottle (see ``claude_bottle.agent.mounts`` for the mount checks).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import platformdirs

APP = "claude-bottle"


def config_dir() -> Path:
    return Path(platformdirs.user_config_dir(APP))


def state_dir() -> Path:
    return Path(platformdirs.user_state_dir(APP))


def made_state_dir() -> Path:
    """``state_dir()``, made where missing, readable by this user only: it holds every run's audit and what runs
    changed in workspaces. Set again each time: the folders ``mkdir(parents=True)`` made on the way to a file
    inside it got the default mode (0755), whoever came first."""
    folder = state_dir()
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    folder.chmod(0o700)
    return folder


def host_command_dir() -> Path:
    """Where the user's own host commands run (a credential's ``command``, the ``ask_command`` hook): the home
    folder, never the current one, which is usually a workspace, written by bottles. Run there, ``python -m``,
    ``uv run``, ``npx`` or a relative path would run what a bottle left in it, on the host."""
    return Path.home()


def agents_dir() -> Path:
    """The user's agent files, ``NAME.toml`` each."""
    return config_dir() / "agents"


def holds(folder: Path, path: Path) -> bool:
    """Whether ``folder`` is ``path`` or holds it."""
    return folder == path or folder in path.parents


def overlapping(one: Path, other: Path) -> bool:
    """Whether either folder holds the other (or they are the same)."""
    return holds(one, other) or holds(other, one)


def workspace_key(workspace: Path) -> str:
    """A short stable name for a workspace (its resolved path), for volume names and record folders."""
    return hashlib.sha256(str(workspace).encode()).hexdigest()[:12]


def workspace_state_dir(workspace: Path) -> Path:
    """Records about one workspace (approvals, fingerprints of its protected files)."""
    return state_dir() / "workspaces" / workspace_key(workspace)
