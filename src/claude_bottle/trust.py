"""What the user approved on the host, and what runs changed that the user has yet to review.

- Approvals of project files: ``<config dir>/trusted-projects.json`` maps a workspace's resolved path to
  the SHA-256 of the ``.claude-bottle.toml`` the user approved there (``claude-bottle trust``).
- Per workspace, under ``paths.workspace_state_dir``: ``runs/<run id>.json`` holds the fingerprint of the
  protected files a run began from (taken when it started, or that of runs in progress then on the workspace,
  on a folder holding it or on one inside it), locked by
  the running process, so a run that ended without its after-check (killed) is still compared at the next
  start; ``review.json`` lists the changes runs made to protected files. While it exists, ``start`` and
  ``run`` refuse the workspace until ``claude-bottle trust``. ``links-out.json`` lists the symlinks there that
  lead out of it, with where they lead.

Nothing here is ever inside a bottle: the config and state folders are not mountable.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any, NamedTuple

from claude_bottle import workspace as ws
from claude_bottle.display import printable
from claude_bottle.errors import ConfigError
from claude_bottle.paths import config_dir, holds, made_state_dir, overlapping, state_dir, workspace_state_dir

APPROVALS = "trusted-projects.json"
REVIEW = "review.json"
APPROVED = "approved-changes.json"
LINKS_OUT = "links-out.json"
SHOWN_CHANGES = 40


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path}: cannot read ({exc}); remove it to start over") from None


def _write_json(path: Path, value: Any) -> None:
    """Atomically, readable by the user only."""
    if path.is_relative_to(state_dir()):
        made_state_dir()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    temporary = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(value, f, indent=2)
    os.replace(temporary, path)


@contextlib.contextmanager
def _updating(path: Path) -> Iterator[None]:
    """Held while ``path`` is read, changed and written: runs on one workspace end at once (parallel Agent SDK
    queries), and a change one records while another writes its own would be lost."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path.with_name(f".{path.name}.lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


# ---- project files -----------------------------------------------------------------------------------------

def approvals_path() -> Path:
    return config_dir() / APPROVALS


def approved_digest(workspace: Path) -> str | None:
    """The SHA-256 of the project file the user approved for ``workspace`` (a resolved path), if any."""
    approvals = _read_json(approvals_path()) or {}
    value = approvals.get(str(workspace)) if isinstance(approvals, dict) else None
    return value if isinstance(value, str) else None


def approve(workspace: Path, digest: str) -> None:
    with _updating(approvals_path()):
        approvals = _read_json(approvals_path()) or {}
        approvals[str(workspace)] = digest
        _write_json(approvals_path(), approvals)


# ---- changes runs made to protected files ---------------------------------------------------------------

def trust_command(workspace: Path) -> str:
    return f"claude-bottle trust {workspace}"


def pending_review(workspace: Path) -> list[ws.Change]:
    """Changes to protected files that runs made and the user has not confirmed yet."""
    record = _read_json(workspace_state_dir(workspace) / REVIEW) or {}
    return [ws.Change(c["path"], c["before"], c["after"]) for c in record.get("changes", [])]


def _add_review(workspace: Path, changes: list[ws.Change]) -> None:
    with _updating(workspace_state_dir(workspace) / REVIEW):
        merged = list(dict.fromkeys(pending_review(workspace) + changes))
        _write_json(workspace_state_dir(workspace) / REVIEW, {
            "workspace": str(workspace),
            "changes": [{"path": c.path, "before": c.before, "after": c.after} for c in merged],
        })


def clear_review(workspace: Path, reviewed: list[ws.Change]) -> None:
    """Forget the changes the user reviewed; any recorded since stay. Runs in progress that began before the
    review would find those changes again at their end: they are remembered as approved for them
    (``_approved``)."""
    with _updating(workspace_state_dir(workspace) / REVIEW):
        _remember_approved(workspace, reviewed)
        left = [c for c in pending_review(workspace) if c not in reviewed]
        if left:
            _write_json(workspace_state_dir(workspace) / REVIEW, {
                "workspace": str(workspace),
                "changes": [{"path": c.path, "before": c.before, "after": c.after} for c in left],
            })
        else:
            with contextlib.suppress(FileNotFoundError):
                (workspace_state_dir(workspace) / REVIEW).unlink()


def _remember_approved(workspace: Path, reviewed: list[ws.Change]) -> None:
    """Note each reviewed change as approved now, for the runs in progress (those that began before now); kept
    only as long as one of them runs. Under the review's lock."""
    path = workspace_state_dir(workspace) / APPROVED
    oldest = min((run.since for run in _in_progress(workspace)), default=None)
    if oldest is None:
        path.unlink(missing_ok=True)
        return
    now = time.time()
    kept = [entry for entry in _approvals(workspace) if entry[2] >= oldest]
    added = [(c.path, c.after, now) for c in reviewed]
    _write_json(path, {"workspace": str(workspace),
                       "approved": [{"path": p, "after": a, "at": t} for p, a, t in [*kept, *added]]})


def _approvals(workspace: Path) -> list[tuple[str, str | None, float]]:
    """The changes approved while runs were in progress: path, signature after, when."""
    found: list[tuple[str, str | None, float]] = []
    with contextlib.suppress(OSError, ValueError, AttributeError, TypeError, KeyError):
        record = json.loads((workspace_state_dir(workspace) / APPROVED).read_text(encoding="utf-8"))
        for entry in record["approved"]:
            after = entry["after"]
            found.append((str(entry["path"]), None if after is None else str(after), float(entry["at"])))
    return found


def _approved(workspace: Path, changes: list[ws.Change], since: float) -> list[ws.Change]:
    """``changes`` less those the user approved after ``since`` (the start a run compares with) as they are now:
    a run that began before a review would otherwise flag again what the review approved."""
    approved = {(path, after) for path, after, at in _approvals(workspace) if at >= since}
    return [c for c in changes if (c.path, c.after) not in approved]


def listing(changes: list[ws.Change], shown: int | None = SHOWN_CHANGES) -> str:
    """One line per change, whatever its name; past ``shown`` a count that points to ``trust``, which lists
    them all (``shown=None``): nothing is approved unseen."""
    lines = [f"  {printable(c.describe())}" for c in changes[:shown]]
    if shown is not None and len(changes) > shown:
        lines.append(f"  ... and {len(changes) - shown} more (`claude-bottle trust` lists them all)")
    return "\n".join(lines)


def _remove_created_git(workspace: Path, git_was_absent: bool, record: Path) -> None:
    """A workspace without .git gets an empty read-only mount there, for which the engine creates an empty
    directory on the host: remove it, if it is still that, once no run but the one of ``record`` is in progress
    on the workspace or a folder holding it (whose bottle mounts it as a nested repository). A running bottle
    has that directory as a mount point, and the kernel takes a mount off a directory removed under it: that
    bottle's .git would no longer be read-only, and it could make one."""
    if git_was_absent and not any(run.record != record and holds(run.workspace, workspace)
                                  for run in _in_progress(workspace)):
        with contextlib.suppress(OSError):
            (workspace / ws.GIT).rmdir()  # only ever succeeds on an empty directory (never follows a link)


def _stale_runs(workspace: Path) -> list[ws.Change]:
    """Compare with the start of runs that ended without their after-check; forget those records."""
    found: list[ws.Change] = []
    runs = workspace_state_dir(workspace) / "runs"
    for path in sorted(runs.glob("*.json")) if runs.is_dir() else []:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            continue  # its run just ended
        with os.fdopen(fd, "rb") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # a run in progress: it checks itself when it ends
            if os.fstat(f.fileno()).st_nlink == 0:
                continue  # its run ended, or another start took it, between the open and the lock
            try:
                record = json.loads(f.read())
            except ValueError:
                record = {}
            _remove_created_git(workspace, bool(record.get("git_absent")), path)
            since = record.get("since", record.get("started", 0.0))
            found += _approved(workspace, ws.changes(record.get("fingerprint", {}), ws.fingerprint(workspace)),
                               since if isinstance(since, (int, float)) else 0.0)
            path.unlink(missing_ok=True)
    return found


class _Run(NamedTuple):
    """A run in progress: its ``Watch`` record, its workspace, when the start it compares with was, and that
    start's fingerprint."""

    record: Path
    workspace: Path
    since: float
    fingerprint: dict[str, str]


def _in_progress(workspace: Path) -> list[_Run]:
    """Every run in progress (its record locked by its process) on ``workspace``, on a folder holding it or on
    one inside it: their bottles write the same files."""
    found: list[_Run] = []
    for path in sorted((state_dir() / "workspaces").glob("*/runs/*.json")):
        with _if_running(path) as f:  # else its run ended (having checked itself), or was killed (see check)
            if f is None:
                continue
            with contextlib.suppress(ValueError, TypeError, KeyError, AttributeError):
                record = json.loads(f.read())
                theirs, fingerprint = Path(record["workspace"]), record["fingerprint"]
                if isinstance(fingerprint, dict) and overlapping(theirs, workspace):
                    found.append(_Run(path, theirs, float(record.get("since", record["started"])),
                                      {str(k): str(v) for k, v in fingerprint.items()}))
    return found


def _start(workspace: Path, found: ws.Protected) -> tuple[float, dict[str, str], bool]:
    """What a run starting now on ``workspace`` compares with at its end: when that start was, its fingerprint,
    and whether it is another run's (the run began beside others).

    Runs in progress may have changed protected files since they began, and a run started now would take them
    as they are for its own start. Hijacked together (parallel queries read the same injection), the first
    would undo the change before its own check and the second redo it before its own: neither would see one.
    So a run that starts beside another on its workspace begins from that run's start, which it records as its
    own: a chain of overlapping runs all compare with the workspace before the first of them. Beside runs on a
    folder holding it or inside it, each path both watch takes its value from the earliest of their starts."""
    runs = sorted(_in_progress(workspace), key=lambda run: run.since)
    same = next((run for run in runs if run.workspace == workspace), None)
    since, before = (same.since, dict(same.fingerprint)) if same else (time.time(), ws.fingerprint(workspace, found))
    taken: set[str] = set()
    earlier = [run for run in runs if run.workspace != workspace and run.since < since]
    for run in earlier:
        ws.take_earlier_start(before, run.fingerprint, workspace, run.workspace, taken)
    return min([since, *(run.since for run in earlier)]), before, bool(same or earlier)


def unreviewed(workspace: Path) -> list[ws.Change]:
    """Changes to protected files the user has not confirmed: recorded at the end of runs, and found now for
    runs that were killed before they could check."""
    stale = _stale_runs(workspace)
    if stale:
        _add_review(workspace, stale)
    return pending_review(workspace)


def check(workspace: Path) -> None:
    """Refuse a workspace with changes to protected files that the user has not reviewed, including those of
    a run that was killed before it could check (ConfigError, exit 2)."""
    pending = unreviewed(workspace)
    if pending:
        raise ConfigError(
            f"a bottle changed files in {workspace} that can run code on your machine:\n{listing(pending)}\n"
            f"Review them, then run `{trust_command(workspace)}` to confirm and start again")


# ---- symlinks out of workspaces ------------------------------------------------------------------------------

def record_links_out(workspace: Path, links: list[str]) -> None:
    """Remember the symlinks in ``workspace`` that lead out of it (``links``: the walk's), which a bottle may
    have made: a start whose caller does not say how it reached its folder is refused where one leads
    (``planted_link_to``)."""
    path = workspace_state_dir(workspace) / LINKS_OUT
    with _updating(path):
        # Those remembered already are looked at again: a start's walk is as old as its image builds, and a run
        # ending meanwhile may have remembered a link this walk did not see; one gone since is forgotten.
        known: list[str] = []
        with contextlib.suppress(OSError, ValueError, AttributeError, TypeError):
            known = [str(relative) for relative in json.loads(path.read_text(encoding="utf-8"))["links"]]
        out = ws.links_out(workspace, list(dict.fromkeys([*links, *known])))
        if out:
            _write_json(path, {"workspace": str(workspace), "links": out})
        else:
            path.unlink(missing_ok=True)


def workspace_holding(path: Path) -> Path | None:
    """The innermost workspace where bottles have run that is or holds ``path`` (a real path), or None."""
    return next((folder for folder in (path, *path.parents) if workspace_state_dir(folder).is_dir()), None)


def planted_link_to(folder: Path) -> tuple[Path, Path] | None:
    """A symlink remembered in a workspace where bottles have run that leads to ``folder`` or a folder holding
    it: the link's path and the workspace; None if there is none."""
    for record in sorted((state_dir() / "workspaces").glob(f"*/{LINKS_OUT}")):
        with contextlib.suppress(OSError, ValueError, AttributeError, TypeError):
            found = json.loads(record.read_text(encoding="utf-8"))
            workspace = Path(found["workspace"])
            for relative, leads in found["links"].items():
                if Path(leads) == folder or Path(leads) in folder.parents:
                    return workspace / relative, workspace
    return None


def in_progress(workspace: Path, run_id: str) -> bool:
    """Whether the process that started run ``run_id`` on ``workspace`` is alive and has not ended it: it holds
    the lock of the run's ``Watch`` from before its gate starts until after its removal."""
    return _running(Watch.record(workspace, run_id))


def _running(record: Path) -> bool:
    """Whether the run of the ``Watch`` record ``record`` is in progress: its process holds the record's lock."""
    with _if_running(record) as f:
        return f is not None


@contextlib.contextmanager
def _if_running(record: Path) -> Iterator[IO[bytes] | None]:
    """The ``Watch`` record ``record`` open for reading if its run is in progress (its process holds the
    record's lock), else None."""
    try:
        fd = os.open(record, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        yield None
        return
    with os.fdopen(fd, "rb") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            yield f
            return
        yield None


class Watch:
    """A run's before-and-after check of the protected files: ``begin`` records the fingerprint (locked, so a
    killed run is noticed at the next start), ``end`` compares, reports and records what changed."""

    def __init__(self, workspace: Path, run_id: str) -> None:
        self.workspace = workspace
        self.path = self.record(workspace, run_id)
        self.git_absent = ws.no_repository_entry(workspace)
        self.before: dict[str, str] = {}
        self.since = 0.0  # when the start it compares with was (its own, or that of the run it began beside)
        self.beside = False  # another run was in progress here when this one began: its start is this one's
        self._lock: int | None = None

    @staticmethod
    def record(workspace: Path, run_id: str) -> Path:
        """Where a run's fingerprint is kept, locked while its process runs it."""
        return workspace_state_dir(workspace) / "runs" / f"{run_id}.json"

    def begin(self, found: ws.Protected | None = None) -> None:
        """``found``: ``workspace.protected_paths`` of this workspace, if the caller has it. A run that starts
        while others run here, or on a folder holding this one or inside it, begins from their start
        (``_start``), not from now."""
        found = found or ws.protected_paths(self.workspace)
        self.since, self.before, self.beside = _start(self.workspace, found)
        record_links_out(self.workspace, found.links)
        made_state_dir()
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        temporary = self.path.with_name(f".{self.path.name}.{secrets.token_hex(4)}")
        fd = os.open(temporary, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX)  # held until end(): the file is never seen unlocked while we run
        os.write(fd, json.dumps({"workspace": str(self.workspace), "started": time.time(), "since": self.since,
                                 "git_absent": self.git_absent, "fingerprint": self.before}).encode())
        os.replace(temporary, self.path)
        self._lock = fd

    def end(self, report: Callable[[str], None]) -> list[ws.Change]:
        if self._lock is None:
            return []
        _remove_created_git(self.workspace, self.git_absent, self.path)
        now = ws.protected_paths(self.workspace)
        found = _approved(self.workspace, ws.changes(self.before, ws.fingerprint(self.workspace, now)), self.since)
        record_links_out(self.workspace, now.links)
        if found:
            _add_review(self.workspace, found)
            during = ("during the run, or before it during another run that it started beside (on this folder, "
                      "one holding it or one inside it)" if self.beside else "during the run")
            report(f"these files can run code on your machine and were changed {during}:\n{listing(found)}\n"
                   f"Review them before you open the project with git, an editor or direnv; the next start "
                   f"waits for `{trust_command(self.workspace)}`")
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        os.close(self._lock)
        self._lock = None
        with _updating(workspace_state_dir(self.workspace) / REVIEW):
            if not _in_progress(self.workspace):  # the last run that began before a review: its approvals go
                (workspace_state_dir(self.workspace) / APPROVED).unlink(missing_ok=True)
        return found
