"""What outlives a run on the host: its audit lines and a small record, under ``<state dir>/runs/<run id>/``.

- ``run.json``: run id, agent, workspace (and its key), start and end time, how many audit lines were seen.
- ``audit.jsonl`` (and ``audit.jsonl.1``): the gate's JSON audit lines, oldest first across the two files.

Both ends are bounded: a run keeps at most ``RUN_BYTES`` of audit (the standard library's rotating file
handler: when a flood passes the cap, the oldest half goes and the newest lines stay), and the folder keeps
at most ``KEPT_RUNS`` runs and ``KEPT_BYTES`` in all (the oldest runs go first). The gate redacts its
credential before a line is written, so what is copied here holds none.
"""

from __future__ import annotations

import datetime
import fcntl
import json
import logging
import logging.handlers
import os
import shutil
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from claude_bottle.errors import ConfigError
from claude_bottle.paths import made_state_dir, state_dir, workspace_key

RUN_BYTES = 8 * 1024 * 1024  # per run: two files of half this each
KEPT_RUNS = 200
KEPT_BYTES = 256 * 1024 * 1024
AUDIT_FILE = "audit.jsonl"
RECORD_FILE = "run.json"


@dataclass(frozen=True)
class RunRecord:
    run: str
    agent: str
    workspace: str
    workspace_key: str
    started: str  # ISO 8601, UTC
    ended: str
    lines: int  # audit lines the gate wrote; fewer are kept when the run passed RUN_BYTES


def runs_dir() -> Path:
    return state_dir() / "runs"


def run_dir(run_id: str) -> Path:
    """Where a finished run's audit is kept (it exists once the run has been removed)."""
    return runs_dir() / run_id


def now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def whole_lines(chunks: Iterable[bytes]) -> Iterator[bytes]:
    """Whole lines from a stream of chunks that may split or join them (the engine splits a log line longer
    than 16 KiB)."""
    pending = b""
    for chunk in chunks:
        pending += chunk
        *complete, pending = pending.split(b"\n")
        yield from complete
    if pending:
        yield pending


def save(run_id: str, agent: str, workspace: str, started: str, logs: Iterable[bytes]) -> RunRecord:
    """Copy a run's audit lines (the gate's log, as a stream of chunks; other lines are dropped) to the host,
    then drop the oldest runs beyond the caps. Called once per run, when it is removed."""
    made_state_dir()
    folder = run_dir(run_id)
    folder.mkdir(parents=True, exist_ok=True)
    # One save of a run at a time: its end and a `stop` from another terminal remove it at once, and two
    # writers of one audit file would write its lines twice, or rotate away each other's.
    lock = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for name in (AUDIT_FILE, f"{AUDIT_FILE}.1"):  # saved again (an earlier save failed, or the other one
            (folder / name).unlink(missing_ok=True)    # of two at once): the log is read whole
        handler = logging.handlers.RotatingFileHandler(folder / AUDIT_FILE, maxBytes=RUN_BYTES // 2,
                                                       backupCount=1, encoding="utf-8")
        count = 0
        try:
            for line in whole_lines(logs):
                if line.startswith(b"{"):
                    count += 1
                    handler.emit(logging.makeLogRecord({"msg": line.decode("utf-8", "replace").rstrip("\r")}))
        finally:
            handler.close()
        record = RunRecord(run_id, agent, workspace, workspace_key(Path(workspace)) if workspace else "", started,
                           now(), count)
        partial = folder / f".{RECORD_FILE}.new"
        partial.write_text(json.dumps(asdict(record), indent=2) + "\n")
        os.replace(partial, folder / RECORD_FILE)
    finally:
        os.close(lock)
    prune(keep=run_id)
    return record


def _size(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.iterdir() if f.is_file())


def recorded() -> list[RunRecord]:
    """Every kept run, oldest first."""
    found = []
    for path in runs_dir().glob(f"*/{RECORD_FILE}"):
        try:
            found.append(RunRecord(**json.loads(path.read_text())))
        except (OSError, ValueError, TypeError):
            continue  # a run being written, or a record from another version: not listed
    return sorted(found, key=lambda r: (r.ended, r.run))


def prune(keep: str) -> None:
    """Remove the oldest runs until at most KEPT_RUNS and KEPT_BYTES remain; ``keep`` always stays."""
    kept = recorded()
    sizes = {r.run: _size(run_dir(r.run)) for r in kept}
    total = sum(sizes.values())
    for record in kept:
        if len(kept) <= KEPT_RUNS and total <= KEPT_BYTES:
            break
        if record.run == keep:
            continue
        shutil.rmtree(run_dir(record.run), ignore_errors=True)
        kept = [r for r in kept if r.run != record.run]
        total -= sizes[record.run]


def find(run_id: str) -> RunRecord:
    for record in recorded():
        if record.run == run_id:
            return record
    raise ConfigError(f"no recorded run {run_id!r}: `claude-bottle logs --runs` lists the recorded runs")


def latest(agent: str | None, workspace: Path | None) -> RunRecord:
    """The last recorded run of ``agent`` and/or ``workspace`` (either may be None: any)."""
    matching = [r for r in recorded() if (agent is None or r.agent == agent)
                and (workspace is None or r.workspace == str(workspace))]
    if not matching:
        whose = " and ".join([*([f"agent {agent}"] if agent else []),
                              *([f"this workspace ({workspace})"] if workspace else [])])
        raise ConfigError(f"no runs recorded for {whose}: a run's audit is kept here once it ends; "
                          "`claude-bottle logs --runs` lists the recorded runs")
    return matching[-1]


def audit_lines(record: RunRecord) -> Iterator[str]:
    """A recorded run's audit lines, oldest first."""
    folder = run_dir(record.run)
    for name in (f"{AUDIT_FILE}.1", AUDIT_FILE):
        path = folder / name
        if path.exists():
            with path.open(encoding="utf-8") as f:
                for line in f:
                    yield line.rstrip("\n")


def current(entry: dict[str, Any]) -> dict[str, Any]:
    """An audit line with the fields the current gate writes. A line that carries a ``version`` (gate/audit.py's
    ``VERSION``) is from a gate that writes every field, and is returned as it is: its reason is never read.
    A line without one is from an earlier gate (a run kept on the host from before), which may have said two
    facts in its reason only: that a tunnel carried raw TCP, and that a refused target was in no allowlist.
    For such a line without ``tunnel`` or ``unlisted``, those fields are filled in from the reason's fixed
    wording of that time."""
    if "version" in entry:
        return entry
    upgrade: dict[str, Any] = {}
    reason = entry.get("reason")
    if not isinstance(reason, str):
        return entry
    if entry.get("method") == "CONNECT" and "tunnel" not in entry and "; raw TCP allowed" in reason:
        upgrade["tunnel"] = "raw_tcp"
    if "unlisted" not in entry and entry.get("decision") == "deny" and \
            reason.endswith(" is not in the allowlist"):
        upgrade["unlisted"] = True
    return {**entry, **upgrade} if upgrade else entry
