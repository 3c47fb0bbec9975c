"""The persistence group of `verify` judged on the host without a bottle: each plant an attack of verify's own
shape, its outcome from what is (or is not) where it would act."""

from __future__ import annotations

from pathlib import Path

import pytest

from claude_bottle.persistence import GROUP, RUNS_NOTHING, Plants, git_plant
from claude_bottle.verify.attack import Outcome


@pytest.fixture
def plants(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Plants:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    (tmp_path / "workspace").mkdir()
    return Plants(tmp_path, tmp_path / "workspace")


def test_a_git_plant_that_ran_or_is_still_there_is_a_leak(plants: Plants) -> None:
    (plants.canary / "fired").touch()
    found = plants.git_after(plants.other, [git_plant("fires", "fired", lambda: False),
                                            git_plant("lurks", "lurking", lambda: True),
                                            git_plant("harmless", "never", lambda: False)])
    assert found == [Outcome(GROUP, "fires", RUNS_NOTHING, "it ran", False),
                     Outcome(GROUP, "lurks", RUNS_NOTHING, "planted where the host's git reads it", False),
                     Outcome(GROUP, "harmless", RUNS_NOTHING, "ran nothing", True)]


def test_the_next_bottle_of_the_project_is_judged_by_what_it_saw(plants: Plants) -> None:
    saw = f'{{"hooks": "{plants.marker}"}}\n---\nsecret {plants.marker}\n---\n/home/agent/.claude/projects/x\n'
    judged = {o.attack: o for o in plants.after_next(saw)}
    assert judged["hooks planted in ~/.claude/settings.json"].actual == "the planted hooks are there"
    assert not judged["a symlink to a host folder where a protected folder would be (.idea)"].blocked
    assert plants.transcript_kept
    clean = {o.attack: o for o in plants.after_next("{}\n---\nNo such file\n---\n")}
    assert all(o.blocked for o in clean.values()), clean
    assert all(o.group == GROUP for o in clean.values())


def test_another_projects_transcripts_prove_nothing_unless_their_own_project_kept_them(plants: Plants) -> None:
    attack = "another project's Claude transcripts, from a bottle of the same agent"
    unproven = {o.attack: o for o in plants.after_other("")}[attack]
    assert (unproven.actual, unproven.blocked) == (
        "not judged: the transcript did not stay with its own project either", False)
    plants.transcript_kept = True
    assert {o.attack: o for o in plants.after_other("")}[attack].blocked
    seen = {o.attack: o for o in plants.after_other("/home/agent/.claude/projects/x/planted.jsonl\n")}[attack]
    assert (seen.actual, seen.blocked) == ("visible: /home/agent/.claude/projects/x/planted.jsonl", False)


def test_a_run_without_an_audit_on_the_host_is_a_leak(plants: Plants) -> None:
    judged = {o.attack: o for o in plants.after_first("verify-0000-dev", "secret")}
    audit = judged["the run's audit, after the run"]
    assert (audit.expected, audit.actual, audit.blocked) == ("kept on the host, without the credential",
                                                             "no audit kept for the run", False)
    assert judged["a project file written by the bottle"].actual == "not written"
