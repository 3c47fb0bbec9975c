"""The runs' audit on the host: what is kept, in what order, and within which bounds."""

from __future__ import annotations

import json
import logging.handlers
import threading
from pathlib import Path
from typing import Any

import pytest

from claude_bottle import records
from claude_bottle.errors import ConfigError


@pytest.fixture(autouse=True)
def state_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    return tmp_path


def line(n: int, padding: int = 0) -> bytes:
    return json.dumps({"n": n, "decision": "deny", "pad": "x" * padding}).encode()


def test_a_runs_audit_lines_are_kept_and_other_output_is_not(state_home: Path) -> None:
    # the gate's log as the engine streams it: chunks that split and join lines
    stream = b'claude-bottle gate: ready {"api": "gate:8080"}\n' + b"\n".join(line(n) for n in range(5)) + b"\nTraceback\n"
    chunks = [stream[i:i + 7] for i in range(0, len(stream), 7)]
    record = records.save("dev-1", "dev", "/srv/a", "2026-01-01T00:00:00Z", chunks)
    assert record.lines == 5 and record.workspace_key == records.workspace_key(Path("/srv/a"))
    assert [json.loads(text)["n"] for text in records.audit_lines(record)] == [0, 1, 2, 3, 4]
    assert records.run_dir("dev-1").is_relative_to(state_home / "claude-bottle" / "runs")
    assert json.loads((records.run_dir("dev-1") / "run.json").read_text())["agent"] == "dev"


def test_a_run_saved_again_keeps_its_lines_once() -> None:
    # a save that failed part way leaves the gate running; `stop` saves its whole log again
    records.save("dev-1", "dev", "/srv/a", "t", [line(0) + b"\n"])
    record = records.save("dev-1", "dev", "/srv/a", "t", [line(0) + b"\n" + line(1) + b"\n"])
    assert [json.loads(text)["n"] for text in records.audit_lines(record)] == [0, 1]


def test_a_run_saved_twice_at_once_keeps_its_lines_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """A run's end and a `stop` from another terminal save its audit at once: the one that started second
    finishes first, and the first one's file is still its own."""
    log = [line(0) + b"\n" + line(1) + b"\n"]
    other = threading.Thread(target=records.save, args=("dev-1", "dev", "/srv/a", "t", log))
    handler = logging.handlers.RotatingFileHandler

    def opened(*args: Any, **kwargs: Any) -> logging.handlers.RotatingFileHandler:
        if other.ident is None:
            other.start()
            other.join(0.3)  # the other save, which waits for this one
        return handler(*args, **kwargs)

    monkeypatch.setattr(logging.handlers, "RotatingFileHandler", opened)
    records.save("dev-1", "dev", "/srv/a", "t", log)
    other.join()
    assert [json.loads(text)["n"] for text in records.audit_lines(records.find("dev-1"))] == [0, 1]


def test_a_flood_keeps_the_newest_lines_within_the_per_run_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(records, "RUN_BYTES", 20_000)
    record = records.save("dev-1", "dev", "/srv/a", "t", (line(n, 100) + b"\n" for n in range(2000)))
    folder = records.run_dir("dev-1")
    assert sum(f.stat().st_size for f in folder.iterdir()) <= 20_000 + 1000  # the audit, plus run.json
    kept = [json.loads(text)["n"] for text in records.audit_lines(record)]
    assert kept == list(range(kept[0], 2000)) and kept[0] > 1800, "the newest lines, in order"
    assert record.lines == 2000


def test_the_oldest_runs_go_beyond_the_caps(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(records, "KEPT_RUNS", 3)
    for n in range(5):
        records.save(f"dev-{n}", "dev", "/srv/a", "t", [line(n)])
    assert [r.run for r in records.recorded()] == ["dev-2", "dev-3", "dev-4"]
    assert not records.run_dir("dev-0").exists()
    monkeypatch.setattr(records, "KEPT_BYTES", 1)  # the run just saved stays, whatever its size
    records.save("dev-5", "dev", "/srv/a", "t", [line(5)])
    assert [r.run for r in records.recorded()] == ["dev-5"]


def test_latest_and_find_choose_by_workspace_agent_and_id() -> None:
    records.save("dev-1", "dev", "/srv/a", "t", [line(1)])
    records.save("ops-1", "ops", "/srv/a", "t", [line(2)])
    records.save("dev-2", "dev", "/srv/b", "t", [line(3)])
    assert records.latest(None, Path("/srv/a")).run == "ops-1"
    assert records.latest("dev", None).run == "dev-2"
    assert records.latest("dev", Path("/srv/a")).run == "dev-1"
    assert records.find("ops-1").agent == "ops"
    with pytest.raises(ConfigError, match=r"no runs recorded for this workspace \(/srv/c\).*logs --runs"):
        records.latest(None, Path("/srv/c"))
    with pytest.raises(ConfigError, match="no recorded run 'nope'"):
        records.find("nope")
