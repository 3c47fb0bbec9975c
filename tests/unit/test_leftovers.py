"""What a crashed host left on a workspace: found by the next start there, and nothing else (a run starting
or running, a kept run, another workspace's) is taken for it."""

from __future__ import annotations

from pathlib import Path

import pytest

from claude_bottle import records, trust
from claude_bottle.runtime.leftovers import left_behind, mark_kept, remove_left_behind
from claude_bottle.runtime.names import RunNames, claim_container
from tests.fake_engine import FakeEngine

WORKSPACE = Path("/srv/project")


@pytest.fixture(autouse=True)
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))


def a_run(engine: FakeEngine, gate: str, bottle: str | None, workspace: Path = WORKSPACE,
          claim: bool = False) -> str:
    names = RunNames.new("dev", workspace)
    engine.add_container(names.gate, names.labels, status=gate, output=b'{"decision": "allow"}\n')
    if bottle is not None:
        engine.add_container(names.bottle, names.labels, status=bottle)
    if claim:
        engine.add_container(claim_container(f"claude-bottle-internal-{names.hex}"), names.labels, status="created")
    return names.id


def test_only_runs_whose_every_container_ended_are_left_behind() -> None:
    engine = FakeEngine()
    crashed = a_run(engine, "exited", "exited", claim=True)
    crashed_at_start = a_run(engine, "exited", None)
    a_run(engine, "running", "running")  # another terminal's run
    a_run(engine, "created", None)  # another terminal's run, starting
    a_run(engine, "exited", "running")  # its gate gone, its CLI about to say so
    a_run(engine, "running", "exited")  # its bottle done, its CLI removing it
    a_run(engine, "exited", "exited", workspace=Path("/srv/other"))
    kept = a_run(engine, "exited", "exited")
    mark_kept(kept)
    assert left_behind(engine, WORKSPACE) == sorted([crashed, crashed_at_start])


def test_the_next_start_removes_them_with_a_notice_keeping_the_audit() -> None:
    engine = FakeEngine()
    crashed = a_run(engine, "exited", "exited")
    running = a_run(engine, "running", "running")
    said: list[str] = []
    remove_left_behind(engine, WORKSPACE, said.append)
    assert [RunNames.from_labels(c.labels).id for c in engine.containers()] == [running, running]
    assert len(said) == 1 and crashed in said[0] and "its audit is kept" in said[0]
    assert records.find(crashed).lines == 1


def test_one_that_cannot_be_removed_is_said_and_the_start_goes_on() -> None:
    engine = FakeEngine()
    crashed = a_run(engine, "exited", "exited")
    engine.fail.add("remove_container")
    said: list[str] = []
    remove_left_behind(engine, WORKSPACE, said.append)
    assert len(said) == 2 and crashed in said[1] and "`claude-bottle stop` removes it" in said[1]


def test_a_run_whose_process_is_removing_it_is_not_left_behind(tmp_path: Path) -> None:
    """Claude Code and the gate exited, the run's CLI about to read the exit code and remove it: another start on
    the workspace (a second drop-in call of the same program) must not take it for a crashed one and remove it
    under that CLI, which would then fail instead of returning Claude Code's exit code."""
    engine = FakeEngine()
    workspace = tmp_path / "project"
    workspace.mkdir()
    ending = a_run(engine, "exited", "exited", workspace=workspace)
    watch = trust.Watch(workspace, ending)
    watch.begin()
    said: list[str] = []
    remove_left_behind(engine, workspace, said.append)
    assert said == [] and len(engine.containers()) == 2
    watch.end(said.append)  # its process gone without removing it: now it is left behind
    assert left_behind(engine, workspace) == [ending]
