"""Runs a crashed host left behind: the CLI and its reaper gone with the power, the containers found stopped
when the engine came back. ``ls`` lists them; the next start on their workspace removes them (``stop`` too),
their audit kept. A run kept on purpose (``start --keep``) is marked so and left for ``stop``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from claude_bottle import records, trust
from claude_bottle.errors import BottleError
from claude_bottle.runtime.names import GATE, WORKSPACE_LABEL, RunNames, is_claim, role_of
from claude_bottle.runtime.removal import remove_run
from claude_bottle.runtime.seam import ENDED, ContainerInfo, Engine

KEPT_FILE = "kept"


def mark_kept(run_id: str) -> None:
    """Record that the run is kept on purpose (``--keep``): no later start removes it."""
    folder = records.run_dir(run_id)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / KEPT_FILE).touch()


def left_behind(engine: Engine, workspace: Path) -> list[str]:
    """The runs on ``workspace`` that nothing holds: a gate and every other container of theirs ended (a run
    starting or running elsewhere has one created or running), not kept on purpose (``mark_kept``), and their
    process gone (``trust.in_progress``: a run whose Claude Code and gate have just exited is its process's to
    remove, its exit code still to be read)."""
    found: dict[str, list[ContainerInfo]] = {}
    for container in engine.containers(label=f"{WORKSPACE_LABEL}={workspace}"):
        run_id = RunNames.from_labels(container.labels).id
        if run_id and not is_claim(container.name):  # a claim is never started: its state says nothing
            found.setdefault(run_id, []).append(container)
    return sorted(run_id for run_id, containers in found.items()
                  if any(role_of(c.name) == GATE for c in containers)
                  and all(c.status in ENDED for c in containers)
                  and not (records.run_dir(run_id) / KEPT_FILE).exists()
                  and not trust.in_progress(workspace, run_id))


def remove_left_behind(engine: Engine, workspace: Path, progress: Callable[[str], None]) -> None:
    """Remove the runs ``left_behind`` on ``workspace``, each with a notice; one that cannot be removed (its
    removal under way elsewhere) is said and left for ``stop``."""
    for run_id in left_behind(engine, workspace):
        progress(f"removing run {run_id}, left stopped on this workspace by a start that did not end (the host or "
                 "the engine went down under it); its audit is kept (`claude-bottle logs`)")
        try:
            remove_run(engine, run_id)
        except BottleError as exc:
            progress(f"could not remove run {run_id} ({exc}); `claude-bottle stop` removes it")
