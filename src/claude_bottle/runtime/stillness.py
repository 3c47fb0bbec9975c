"""Bottles that could change what a starting bottle mounts are paused until the engine has mounted it.

The engine mounts a host folder by its path when the container starts: each component of the path is looked up
then, and a symlink there is followed. A running bottle writes its workspace. When a second bottle starts on
the same workspace, one inside it or one around it, the running one could swap a folder on the second one's
paths for a symlink between the start's checks (the workspace resolved, ``runtime.files.protective_mounts``)
and the mount, and the second bottle would get whatever file or folder of this machine the symlink names. So
from before those checks until the new bottle runs, every running bottle with a mount that overlaps one of
the new bottle's is paused (the engine's freezer: none of its processes runs), and starts take turns.

A start killed while it holds others paused leaves their names in ``PAUSED_FILE``; whoever takes the turn next
(the next start, or the killed start's reaper) resumes them first.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

from claude_bottle.errors import DockerError
from claude_bottle.paths import made_state_dir, overlapping
from claude_bottle.runtime.names import LABEL, role_of
from claude_bottle.runtime.seam import ContainerInfo, Engine

TURN_SECONDS = 120.0  # a start waits this long for another's turn (its gate's boot, at worst) before it gives up
PAUSED_FILE = "paused-for-a-start"


def neighbours(engine: Engine, sources: Iterable[Path]) -> list[ContainerInfo]:
    """The running bottles with a host path mounted that overlaps one of ``sources``."""
    sources = list(sources)
    return [container for container in engine.containers(LABEL)
            if role_of(container.name) == "bottle" and container.status == "running"
            and any(overlapping(Path(mounted), source) for mounted in container.mounts.values()
                    if mounted.startswith("/") for source in sources)]


@contextlib.contextmanager
def turn(timeout: float = TURN_SECONDS) -> Iterator[Path]:
    """This process's turn among the starts of this user's bottles (a lock in the state folder): the folder."""
    folder = made_state_dir()
    fd = os.open(folder / "starts.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise DockerError(f"another claude-bottle start has held its turn for {timeout:.0f} s "
                                      f"({folder / 'starts.lock'}): try again once it has started") from None
                time.sleep(0.05)
        yield folder
    finally:
        os.close(fd)  # lets the lock go


def resume_left_paused(engine: Engine, folder: Path) -> None:
    """Resume the bottles a start killed in its turn left paused (called in a turn)."""
    listed = folder / PAUSED_FILE
    with contextlib.suppress(FileNotFoundError):
        for name in listed.read_text().split():
            with contextlib.suppress(DockerError):
                engine.unpause(name)
        listed.unlink()


@contextlib.contextmanager
def held_still(engine: Engine, sources: Iterable[Path]) -> Iterator[list[str]]:
    """In this process's turn, the running bottles that overlap ``sources`` paused (their names), resumed on the
    way out. A DockerError, with nothing left paused, where the engine cannot pause one."""
    with turn() as folder:
        resume_left_paused(engine, folder)
        found = neighbours(engine, sources)
        listed = folder / PAUSED_FILE
        paused: list[str] = []
        try:
            if found:
                listed.write_text("".join(f"{container.name}\n" for container in found))
            for container in found:
                # Listed first: a Ctrl-C while the engine pauses it, or before the answer is in, still resumes it
                # (resuming one that is not paused does nothing).
                paused.append(container.name)
                try:
                    engine.pause(container.name)
                except DockerError as exc:
                    paused.pop()  # not paused by this start (one paused by hand meanwhile stays so)
                    workspace = container.mounts.get("/workspace", "a folder this one overlaps")
                    raise DockerError(
                        f"cannot pause {container.name}, a bottle running on {workspace}, while this one starts: "
                        f"{exc}. A bottle running on an overlapping folder could turn the new bottle's mounts to "
                        "other files of this machine as it starts: stop it (`claude-bottle stop`) or wait for it "
                        "to end, then start again") from None
            yield paused
        finally:
            for name in paused:
                with contextlib.suppress(DockerError):
                    engine.unpause(name)
            listed.unlink(missing_ok=True)
