"""A run's reaper: it removes the run when the process that started it ends without saying it ended the run
on purpose, and only then."""

from __future__ import annotations

import os

import pytest

from claude_bottle.runtime import reaper


@pytest.mark.parametrize(("said", "removed"), [
    (reaper.RELEASED, False),  # the run ended on purpose
    (b"", True),  # the process died: its end of the pipe closed with nothing said
    (reaper.RELEASED[:2], True),  # died while saying it
    (b"x" * 100 + reaper.RELEASED, False),
])
def test_the_run_is_removed_unless_its_end_was_said(monkeypatch: pytest.MonkeyPatch, said: bytes,
                                                    removed: bool) -> None:
    reaped: list[str] = []
    monkeypatch.setattr(reaper, "reap", reaped.append)
    ours, theirs = os.pipe()
    os.write(theirs, said)
    os.close(theirs)
    try:
        assert reaper.main(["dev-0a1b2c3d"], ours) == 0
    finally:
        os.close(ours)
    assert reaped == (["dev-0a1b2c3d"] if removed else [])


@pytest.mark.parametrize("argv", [[], ["a", "b"], ["claude-bottle.run=x"], ["-x"], [""]])
def test_anything_but_one_run_id_is_refused(argv: list[str]) -> None:
    assert reaper.main(argv) == 2


def test_a_released_reaper_exits_at_once() -> None:
    watching = reaper.watch("dev-0a1b2c3d")
    assert watching.process.poll() is None, "it waits on this process"
    watching.release()
    assert watching.process.returncode == 0
    watching.release()  # twice is harmless
