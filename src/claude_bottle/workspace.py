"""The workspace files that can run code on the host, and fingerprints to see what a run changed in them.

A bottle writes its workspace, and the user's tools later read some files there as configuration that runs
code: git (``.git``), Mercurial (``.hg``), Jujutsu (``.jj``), editors (``.vscode/``, ``.idea/``), direnv
(``.envrc``), Claude Code on the host (``.claude/settings.json``, ``.mcp.json``), commit hooks kept in the tree
(``.husky/``, ``.pre-commit-config.yaml``). Those paths are *protected*: mounted read-only into the bottle where they
exist (``claude_bottle.runtime.files.protective_mounts``) and fingerprinted before and after every run
(here), so whatever still changed is reported. Below the top level, nested repositories (``.git``, ``.hg``, ``.jj``) are
protected too, and the configs a tool reads from any folder it is started in are fingerprinted.

Everything here reads with ``lstat`` and never follows a symlink. Work is bounded: the search below the top
level stops after ``WALK_LIMIT`` directory entries, a protected directory is fingerprinted up to
``ENTRY_LIMIT`` entries, neither goes more than ``DEPTH_LIMIT`` folders deep, and files above ``HASH_LIMIT``
bytes, or past ``HASH_BUDGET`` bytes hashed in one fingerprint, are fingerprinted by size and change time
instead of content.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import NamedTuple

GIT = ".git"
# Of a repository folder only what makes its tool run something: its config and hooks, and where it points
# (its objects and history change with every commit). Mercurial runs the hooks in .hg/hgrc before any command;
# Jujutsu runs what its repository's config names (a pager, `jj fix` tools), and a secondary workspace's
# .jj/repo is a file naming the repository it uses.
GIT_SIGNED = ("config", "config.worktree", "commondir", "hooks")
REPOSITORY_SIGNED = {
    GIT: GIT_SIGNED,
    ".hg": ("hgrc", "hgrc-not-shared", "requires", "sharedpath"),
    ".jj": ("repo/config.toml", "repo/config-id", "workspace-config.toml"),
}
REPOSITORIES = tuple(REPOSITORY_SIGNED)
# Relative paths, as sandbox-runtime protects them plus their equivalents: all are read as configuration
# that runs code by version control, editors, direnv, dev containers, commit-hook managers and Claude Code on
# the host.
PROTECTED = (
    *REPOSITORIES, ".gitmodules", ".gitattributes", ".lfsconfig", ".hgsub",
    ".envrc", ".vscode", ".idea", ".devcontainer",
    ".husky", ".githooks", ".pre-commit-config.yaml",
    ".mcp.json", ".claude/settings.json", ".claude/settings.local.json",
    ".claude/commands", ".claude/agents", ".claude/hooks", ".claude/skills",
)
# Of those, what the host's tools read from whatever folder they are started in, not only the top: Claude Code,
# editors, dev containers and direnv opened in a subfolder (a monorepo's package). Below the top they are
# watched, not mounted: a read-only mount there would pin a folder that a package manager must replace.
IN_ANY_FOLDER = (
    ".envrc", ".vscode", ".idea", ".devcontainer",
    ".mcp.json", ".claude/settings.json", ".claude/settings.local.json",
    ".claude/commands", ".claude/agents", ".claude/hooks", ".claude/skills",
)
# A folder git takes for a repository itself, with no .git entry (a bare repository: git looks for one in every
# folder it searches, and runs what its config says, as core.fsmonitor on `git status`): HEAD and objects/ and
# refs/, or HEAD and a commondir file that points to the rest.
_BARE = ({"HEAD", "objects", "refs"}, {"HEAD", "commondir"})
WALK_LIMIT = 100_000
ENTRY_LIMIT = 20_000
HASH_LIMIT = 16 * 1024 * 1024
# Hard links cost a bottle no space: ENTRY_LIMIT links to one file of HASH_LIMIT bytes would be 320 GB to hash
# (measured: some 700 MB a second), at the end of the run, when signals wait, and at every start after.
HASH_BUDGET = 256 * 1024 * 1024
# A bottle can nest folders as deep as a path goes (some 2,000 with one-letter names): past Python's recursion
# limit, and every path checked lstats each of its parents, so the checks' time grows with the cube of the depth.
DEPTH_LIMIT = 64
WALK_KEY = ""  # the entry that records whether the search below the top saw everything
PARTIAL = "not fully checked"  # in the signature of a directory whose entries were not all signed


@dataclass(frozen=True)
class Change:
    """One protected path that differs; ``before``/``after`` are signatures, None where it did not exist."""

    path: str
    before: str | None
    after: str | None

    def describe(self) -> str:
        if self.path == WALK_KEY:
            return f"the search for nested repositories and configs: {self.after} (was: {self.before})"
        if self.before is None:
            return f"{self.path}: created ({self.after})"
        if self.after is None:
            return f"{self.path}: removed (was {self.before})"
        return f"{self.path}: changed ({self.before} -> {self.after})"


class Protected(NamedTuple):
    """The workspace paths that run code on the host: ``mounted`` read-only into the bottle where they exist,
    and all ``watched`` (fingerprinted before and after a run); ``complete``: whether the search below the
    top level saw every entry; ``links``: the symlinks it saw on the way."""

    mounted: list[str]
    watched: list[str]
    complete: bool
    links: list[str]


def nested(workspace: Path, limit: int | None = None) -> Protected:
    """Below the top level, breadth first: relative paths of every ``REPOSITORIES`` entry (a repository, a
    gitfile, a symlink) and of what makes git run something in every folder laid out as a repository (``_BARE``, the
    workspace itself included: its HEAD and ``GIT_SIGNED``), to mount; of ``IN_ANY_FOLDER`` in every folder
    that has one, to watch; and whether the walk saw every entry (False once it passed ``limit``, or
    WALK_LIMIT, or left folders more than DEPTH_LIMIT deep unread)."""
    limit = WALK_LIMIT if limit is None else limit
    found: list[str] = []
    configs: list[str] = []
    links: list[str] = []
    seen = 0
    complete = True
    queue: deque[str] = deque([""])
    while queue:
        relative = queue.popleft()
        try:
            with os.scandir(workspace / relative if relative else workspace) as entries:
                children = sorted(entries, key=lambda e: e.name)
        except OSError:
            continue  # unreadable or gone: nothing the host's tools could read there either
        names = {entry.name for entry in children}
        if any(layout <= names for layout in _BARE):
            found += [f"{relative}/{name}" if relative else name for name in ("HEAD", *GIT_SIGNED)]
        if relative:
            configs += [f"{relative}/{path}" for path in IN_ANY_FOLDER if path.split("/", 1)[0] in names]
        for entry in children:
            seen += 1
            if seen > limit:
                return Protected(found, configs, False, links)
            path = f"{relative}/{entry.name}" if relative else entry.name
            if entry.is_symlink():
                links.append(path)
            if entry.name in REPOSITORIES:
                if relative:
                    found.append(path)
            elif entry.is_dir(follow_symlinks=False):
                if path.count("/") < DEPTH_LIMIT:
                    queue.append(path)
                else:
                    complete = False
    return Protected(found, configs, complete, links)


def protected_paths(workspace: Path) -> Protected:
    """To mount: ``PROTECTED`` and the nested repositories and bare repository layouts; to watch: those and the
    configs ``IN_ANY_FOLDER`` below the top."""
    below = nested(workspace)
    mounted = list(dict.fromkeys([*PROTECTED, *below.mounted]))
    return Protected(mounted, [*mounted, *below.watched], below.complete, below.links)


def links_out(workspace: Path, links: list[str]) -> dict[str, str]:
    """Of the symlinks ``links`` (relative paths in ``workspace``), those that lead out of it: each path and the
    real path it leads to. A relative target without ``..`` stays in the link's folder, or leaves it through
    another link, which is in ``links`` itself. Not capped but by the walk that found them: a bottle could
    otherwise put its link after as many decoys."""
    out: dict[str, str] = {}
    listed: dict[str, frozenset[str]] = {}
    for relative in links:
        path = workspace / relative
        try:
            target = os.readlink(path)
        except OSError:
            continue
        if not target.startswith("/") and ".." not in Path(target).parts:
            continue
        leads = Path(_leads(str(path.parent), target, listed))
        if not leads.is_relative_to(workspace):
            out[relative] = str(leads)
    return out


def _leads(folder: str, target: str, listed: dict[str, frozenset[str]]) -> str:
    """Where a symlink in ``folder`` (a real path) to ``target`` leads, as ``os.path.realpath`` says, but a name
    is looked up only in a folder that lists it (``listed``: the folders read so far); from the first name that
    is not listed, the rest is taken as written. A bottle chooses the names: an automounter mounts whatever is
    looked up below it (``/net/NAME`` on macOS and many Linux hosts), asking DNS for NAME, out past the gate."""
    done = "/" if target.startswith("/") else folder
    parts = deque(target.split("/"))
    hops = 0
    while parts:
        name = parts.popleft()
        if name in ("", "."):
            continue
        if name == "..":
            done = os.path.dirname(done)
            continue
        if done not in listed:
            try:
                listed[done] = frozenset(os.listdir(done))
            except OSError:
                listed[done] = frozenset()
        path = os.path.join(done, name)
        if name not in listed[done]:
            return os.path.normpath(os.path.join(path, *parts))
        if hops < 40 and os.path.islink(path):  # past 40, a loop: realpath leaves it as it is too
            hops += 1
            with contextlib.suppress(OSError):
                link = os.readlink(path)
                parts.extendleft(reversed(link.split("/")))
                done = "/" if link.startswith("/") else done
                continue
        done = path
    return done


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "fifo"), (stat.S_ISSOCK, "socket"), (stat.S_ISCHR, "character device"),
                       (stat.S_ISBLK, "block device")):
        if test(mode):
            return name
    return "special file"


def _file_signature(path: Path, info: os.stat_result, budget: list[int]) -> str:
    mode = f"mode {stat.S_IMODE(info.st_mode):04o}, {info.st_size} bytes"
    if info.st_size > min(HASH_LIMIT, budget[1]):
        return f"file, {mode}, changed at {info.st_ctime_ns}"
    budget[1] -= info.st_size
    digest = hashlib.sha256()
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        return f"file, {mode}, unreadable ({exc.strerror})"
    # At most the size seen: the path may have become another file since (a bottle running on this workspace can
    # swap in a sparse one of a terabyte, which costs it no space, or a pipe it writes to without end).
    left = info.st_size
    with os.fdopen(fd, "rb") as f:
        while left > 0 and (chunk := f.read(min(1 << 20, left))):
            digest.update(chunk)
            left -= len(chunk)
    return f"file, {mode}, sha256 {digest.hexdigest()[:16]}"


def _signature(path: Path, info: os.stat_result, budget: list[int]) -> str:
    if stat.S_ISLNK(info.st_mode):
        try:
            return f"symlink to {os.readlink(path)!r}"
        except OSError:
            return "symlink"
    if stat.S_ISREG(info.st_mode):
        return _file_signature(path, info, budget)
    if stat.S_ISDIR(info.st_mode):
        return f"directory, mode {stat.S_IMODE(info.st_mode):04o}"
    return _kind(info.st_mode)


def no_repository_entry(workspace: Path) -> bool:
    """Whether the workspace has no ``.git``, or only an empty ``.git`` directory: the mount point the engine
    makes on the host for a bottle's empty read-only ``.git`` (a bottle of another run may still be on it),
    which git takes for no repository."""
    try:
        return stat.S_ISDIR((workspace / GIT).lstat().st_mode) and not os.listdir(workspace / GIT)
    except FileNotFoundError:
        return True
    except OSError:
        return False


def lstat_inside(workspace: Path, relative: str) -> tuple[str, os.stat_result] | None:
    """``lstat`` of ``relative`` with every component checked, never following a symlink: the path and its
    status, or where a parent is not a real directory (a symlink could lead out of the workspace), that
    parent and its status. None where something does not exist."""
    parts = relative.split("/")
    for depth in range(1, len(parts) + 1):
        prefix = "/".join(parts[:depth])
        try:
            info = (workspace / prefix).lstat()
        except OSError:
            return None
        if depth == len(parts) or not stat.S_ISDIR(info.st_mode):
            return prefix, info
    return None


def _record(workspace: Path, relative: str, entries: dict[str, str], budget: list[int], depth: int = 0) -> None:
    """Sign ``relative`` and, for a directory, what is in it (of a repository folder, only ``REPOSITORY_SIGNED``)
    down to ``DEPTH_LIMIT`` folders below it (``depth``: how far below it already is)."""
    found = lstat_inside(workspace, relative)
    if found is None:
        return
    relative, info = found
    path = workspace / relative
    if path.name == GIT and no_repository_entry(path.parent):
        # A mount point, signed as no .git: a run's bottle there (this workspace's, or one inside it) may keep it
        # after this run ends. Git takes an empty .git for none.
        return
    budget[0] -= 1
    entries[relative] = _signature(path, info, budget)
    if not stat.S_ISDIR(info.st_mode):
        return
    if (signed := REPOSITORY_SIGNED.get(path.name)) is not None:
        entries[relative] += f", inode {info.st_ino}"  # its identity: a repository put in its place differs
        for name in signed:
            _record(workspace, f"{relative}/{name}", entries, budget, depth + 1)
        return
    if depth >= DEPTH_LIMIT:
        entries[relative] += f", {PARTIAL} (more than {DEPTH_LIMIT} folders deep)"
        return
    try:
        names = sorted(os.listdir(path))
    except OSError as exc:
        entries[relative] += f", unreadable ({exc.strerror})"
        return
    for name in names:
        if budget[0] <= 0:
            entries[relative] += f", {PARTIAL} (too many entries)"
            return
        _record(workspace, f"{relative}/{name}", entries, budget, depth + 1)


def fingerprint(workspace: Path, found: Protected | None = None) -> dict[str, str]:
    """Every watched path that exists, and what is in watched directories: relative path -> signature.
    ``WALK_KEY`` says whether the search below the top was complete. ``found`` is what ``protected_paths``
    just returned, to save a second walk."""
    _, paths, complete, _ = found or protected_paths(workspace)
    entries: dict[str, str] = {WALK_KEY: "complete" if complete else
                               f"stopped after {WALK_LIMIT} entries or {DEPTH_LIMIT} folders deep"}
    budget = [ENTRY_LIMIT, HASH_BUDGET]  # entries left in protected directories, bytes left to hash
    for relative in paths:
        _record(workspace, relative, entries, budget)
    return entries


def _under(relative: str, tops: tuple[str, ...]) -> bool:
    return any(relative == top or relative.startswith(f"{top}/") for top in tops)


def watched(relative: str) -> bool:
    """Whether every fingerprint of a workspace has ``relative`` where it exists (the search below the top
    complete), whatever else is there: a protected path at the top, a repository entry or a config read in any
    folder below it, or what is in them. A bare layout's files are recorded only as the layout is there."""
    parts = relative.split("/")
    return _under(relative, PROTECTED) or any(
        parts[i] in REPOSITORIES or _under("/".join(parts[i:]), IN_ANY_FOLDER) for i in range(1, len(parts)))


def _moved(path: str, strip: str, add: str) -> str | None:
    """``path`` (relative, "" for the top) from one workspace's terms to another's: ``strip`` taken off its front
    (None where it is not there), then ``add`` put on."""
    if strip:
        if path != strip and not path.startswith(f"{strip}/"):
            return None
        path = path[len(strip) + 1:]
    return f"{add}/{path}" if add and path else add or path


def _layouts(entries: dict[str, str], to: Callable[[str], str | None]) -> set[str]:
    """The folders that ``entries`` has laid out as bare repositories (their HEAD recorded as such), by ``to``."""
    heads = (key.removesuffix("HEAD").rstrip("/") for key in entries if (key == "HEAD" or key.endswith("/HEAD"))
             and not watched(key))
    return {folder for head in heads if (folder := to(head)) is not None}


def _head(folder: str) -> str:
    return f"{folder}/HEAD" if folder else "HEAD"


def _bare_folders(relative: str) -> list[str]:
    """The folders of which ``relative`` would be a bare layout's file (HEAD, ``GIT_SIGNED``, in hooks)."""
    parts = relative.split("/")
    return ["/".join(parts[:i]) for i, part in enumerate(parts)
            if part == "hooks" or (i == len(parts) - 1 and part in ("HEAD", *GIT_SIGNED))]


def take_earlier_start(before: dict[str, str], theirs: dict[str, str], mine: Path, their_workspace: Path,
                       taken: set[str]) -> None:
    """Where the start of a run on a workspace holding ``mine`` or inside it (``theirs``, its fingerprint) says
    what a path both watch was, ``before`` (this workspace's fingerprint) takes that, unless the path is in
    ``taken`` (said by a start earlier still); the paths it takes join ``taken``. It says what one was not where
    its search was complete. The two watch different paths: a protected path at one's top is below the other's,
    and bare layouts count as each found them."""
    if their_workspace in mine.parents:
        rel = mine.relative_to(their_workspace).as_posix()
        to_mine, to_theirs = partial(_moved, strip=rel, add=""), partial(_moved, strip="", add=rel)
    else:
        rel = their_workspace.relative_to(mine).as_posix()
        to_mine, to_theirs = partial(_moved, strip="", add=rel), partial(_moved, strip=rel, add="")
    layouts = _layouts(before, lambda path: path) | _layouts(theirs, to_mine)
    complete = theirs.get(WALK_KEY) == "complete" and not any(PARTIAL in v for v in theirs.values())

    def both_watch(path: str, other: str) -> bool:
        bare = [folder for folder in _bare_folders(path) if folder in layouts]
        return ((watched(path) or any(not watched(_head(folder)) for folder in bare))
                and (watched(other) or any((head := to_theirs(_head(folder))) is not None and not watched(head)
                                           for folder in bare)))

    paths = {path for path in before if to_theirs(path) is not None}
    paths |= {path for key in theirs if key != WALK_KEY and (path := to_mine(key)) is not None}
    for path in sorted(paths - taken - {WALK_KEY}):
        other = to_theirs(path)
        if other is None or not (other in theirs or complete) or not both_watch(path, other):
            continue
        taken.add(path)
        if other in theirs:
            before[path] = theirs[other]
        else:
            before.pop(path, None)


def changes(before: dict[str, str], after: dict[str, str]) -> list[Change]:
    """What differs between two fingerprints, in path order."""
    return [Change(path, before.get(path), after.get(path))
            for path in sorted(before.keys() | after.keys())
            if before.get(path) != after.get(path)]
