"""A run's removal when the process that started it dies without removing it (SIGKILL, a crash).

``watch`` starts a small process of its own session that holds the read end of a pipe from this one. A run
that ends on purpose (removed, or kept with ``--keep``) says so (``Reaper.release``); when the pipe ends
without that, this process is gone, and the reaper removes the run as ``claude-bottle stop`` would: its bottle,
then its gate once its audit is kept on the host. The gate stops by itself too (runtime/lifeline.py): this
also takes away what it leaves, within seconds. Then it remembers the symlinks out of the run's workspace, as
the run's own end would have (claude_bottle.trust): a start that cannot say how it reached its folder is
refused where one leads, from then on, not only after the workspace's next run. The reaper acts on the run's
id and workspace alone, given by this process; nothing in the bottle reaches it. A host that loses power
takes the reaper with it: what that leaves is listed by ``ls`` and removed by the next start on its
workspace, or ``stop``.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import time
from pathlib import Path

RELEASED = b"done\n"
SECOND_PASS_SECONDS = 2.0  # a create request the dead process had in flight may still land: look again


class Reaper:
    """The reaper of one run, started by ``watch``."""

    def __init__(self, process: subprocess.Popen[bytes]) -> None:
        self.process = process

    def release(self) -> None:
        """The run ended on purpose: the reaper exits without touching it."""
        if self.process.stdin is not None and not self.process.stdin.closed:
            with contextlib.suppress(OSError):
                self.process.stdin.write(RELEASED)
            with contextlib.suppress(OSError):
                self.process.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(5)  # reaped here, so it is no zombie of ours


def watch(run_id: str, workspace: Path) -> Reaper:
    """Start the reaper of run ``run_id`` on ``workspace``: in a session of its own, so the terminal's Ctrl-C
    and hang-up, meant for this process, do not reach it; with this environment (the engine's address). Python's
    ``-P``: ``-m`` would put the current folder first on the import path, and that is usually the workspace,
    where a bottle can leave a ``claude_bottle`` package of its own for the host to run."""
    process = subprocess.Popen([sys.executable, "-P", "-m", "claude_bottle.runtime.reaper", run_id, str(workspace)],
                               stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               start_new_session=True)
    return Reaper(process)


def reap(run_id: str, workspace: Path) -> None:
    """Remove run ``run_id`` as ``stop`` does, twice, ``SECOND_PASS_SECONDS`` apart; then resume the bottles it
    held still while its own started, if it died then (runtime/stillness.py), and remember the links out of
    ``workspace`` its bottle left."""
    from claude_bottle import trust
    from claude_bottle import workspace as ws
    from claude_bottle.runtime.engines import open_engine
    from claude_bottle.runtime.removal import remove_run
    from claude_bottle.runtime.stillness import resume_left_paused, turn

    engine = open_engine()
    remove_run(engine, run_id)
    time.sleep(SECOND_PASS_SECONDS)
    remove_run(engine, run_id)
    with turn() as folder:
        resume_left_paused(engine, folder)
    with contextlib.suppress(OSError):  # a workspace gone or unreadable: its next start walks it again
        trust.record_links_out(workspace, ws.protected_paths(workspace).links)


def main(argv: list[str], fd: int = 0) -> int:
    """``argv``: the run's id and its workspace. Wait for ``fd`` (standard input) to end; unless what came last
    is ``RELEASED``, remove the run."""
    if (len(argv) != 2 or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", argv[0])
            or not os.path.isabs(argv[1])):
        return 2
    said = b""
    while chunk := os.read(fd, 64):
        said = (said + chunk)[-64:]
    if said.endswith(RELEASED):
        return 0
    reap(argv[0], Path(argv[1]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
