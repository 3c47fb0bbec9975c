"""A run's reaper: it removes the run when the process that started it ends without saying it ended the run
on purpose, and only then."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from claude_bottle import trust
from claude_bottle.runtime import engines, reaper, stillness
from tests.fake_engine import FakeEngine


@pytest.mark.parametrize(("said", "removed"), [
    (reaper.RELEASED, False),  # the run ended on purpose
    (b"", True),  # the process died: its end of the pipe closed with nothing said
    (reaper.RELEASED[:2], True),  # died while saying it
    (b"x" * 100 + reaper.RELEASED, False),
])
def test_the_run_is_removed_unless_its_end_was_said(monkeypatch: pytest.MonkeyPatch, said: bytes,
                                                    removed: bool) -> None:
    reaped: list[tuple[str, Path]] = []
    monkeypatch.setattr(reaper, "reap", lambda run_id, workspace: reaped.append((run_id, workspace)))
    ours, theirs = os.pipe()
    os.write(theirs, said)
    os.close(theirs)
    try:
        assert reaper.main(["dev-0a1b2c3d", "/home/u/project"], ours) == 0
    finally:
        os.close(ours)
    assert reaped == ([("dev-0a1b2c3d", Path("/home/u/project"))] if removed else [])


@pytest.mark.parametrize("argv", [[], ["a"], ["a", "/w", "b"], ["claude-bottle.run=x", "/w"], ["-x", "/w"], ["", "/w"],
                                  ["a", "relative/w"], ["a", ""]])
def test_anything_but_one_run_id_and_its_workspace_is_refused(argv: list[str]) -> None:
    assert reaper.main(argv) == 2


def test_a_released_reaper_exits_at_once() -> None:
    watching = reaper.watch("dev-0a1b2c3d", Path("/home/u/project"))
    assert watching.process.poll() is None, "it waits on this process"
    watching.release()
    assert watching.process.returncode == 0
    watching.release()  # twice is harmless


def test_the_reaper_of_a_start_killed_in_its_turn_resumes_the_bottles_it_paused(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:
    """A start pauses the bottles on overlapping folders until its own runs (runtime/stillness.py): killed
    then, its reaper resumes them, and leaves a bottle someone else paused alone."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    engine = FakeEngine()
    for name in ("claude-bottle-other-bottle", "claude-bottle-mine-bottle"):
        engine.add_container(name, {"claude-bottle": "1"}, status="paused")
    (tmp_path / "claude-bottle").mkdir()
    (tmp_path / "claude-bottle" / stillness.PAUSED_FILE).write_text("claude-bottle-mine-bottle\n")
    monkeypatch.setattr(engines, "open_engine", lambda: engine)
    monkeypatch.setattr(reaper, "SECOND_PASS_SECONDS", 0)
    reaper.reap("dev-0a1b2c3d", tmp_path / "project")
    assert {c.name: c.status for c in engine.containers()} == {
        "claude-bottle-other-bottle": "paused", "claude-bottle-mine-bottle": "running"}
    assert not (tmp_path / "claude-bottle" / stillness.PAUSED_FILE).exists()


def test_the_reaper_of_a_killed_run_remembers_the_links_out_its_bottle_left(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:
    """A killed run never walks its workspace at its end: its reaper does, so a start that cannot say how it
    reached its folder is refused where the bottle's link leads (trust.planted_link_to) before the workspace's
    next run, not after it."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    project, keys = tmp_path / "project", tmp_path / "keys"
    project.mkdir()
    keys.mkdir()
    (project / "docs").symlink_to(keys)  # made by the bottle during the killed run
    monkeypatch.setattr(engines, "open_engine", FakeEngine)
    monkeypatch.setattr(reaper, "SECOND_PASS_SECONDS", 0)
    assert trust.planted_link_to(keys) is None
    reaper.reap("dev-0a1b2c3d", project)
    assert trust.planted_link_to(keys) == (project / "docs", project)
    reaper.reap("dev-0a1b2c3d", tmp_path / "gone")  # a workspace removed since: nothing to remember, no error


def test_a_package_a_bottle_left_in_the_current_folder_is_not_what_the_reaper_runs(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:
    """A start runs in its workspace, and ``python -m`` imports from the current folder first: a
    ``claude_bottle`` package planted there by a bottle would run on the host at the next start."""
    planted = tmp_path / "claude_bottle"
    (planted / "runtime").mkdir(parents=True)
    (planted / "__init__.py").write_text(f"open({str(tmp_path / 'ran')!r}, 'w').close()\n")
    (planted / "runtime" / "__init__.py").write_text("")
    (planted / "runtime" / "reaper.py").write_text("")
    monkeypatch.chdir(tmp_path)
    watching = reaper.watch("dev-0a1b2c3d", tmp_path)
    watching.release()
    assert watching.process.returncode == 0 and not (tmp_path / "ran").exists()
