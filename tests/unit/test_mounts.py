"""Agent mount sources: only a real file or folder, named by its real path, that reaches nothing a bottle must
never reach (the engine's socket, claude-bottle's own config and state, the workspace)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from claude_bottle.agent import mounts
from claude_bottle.agent.mounts import check_mounts, check_workspace, engine_paths
from claude_bottle.agent.schema import AgentConfig, parse_agent
from claude_bottle.errors import ConfigError
from tests.helpers import make_token


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A home of the test's own, with claude-bottle's config and state in their default places under it, a
    fake engine socket, and a few things to mount or not."""
    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    monkeypatch.delenv("XDG_STATE_HOME", raising=False)
    (home / ".config/claude-bottle").mkdir(parents=True)
    (home / ".config/claude-bottle/token").write_text("secret")
    (home / ".local/state/claude-bottle/runs").mkdir(parents=True)
    (home / ".docker").mkdir()
    (home / ".docker/config.json").write_text("{}")
    (home / "data/sub").mkdir(parents=True)
    (home / "data/file.txt").write_text("x")
    (home / "link-to-data").symlink_to(home / "data")
    (home / "link-to-file").symlink_to(home / "data/file.txt")
    (home / "link-to-token").symlink_to(home / ".config/claude-bottle/token")
    (home / "run").mkdir()
    engine = socket.socket(socket.AF_UNIX)
    engine.bind(str(home / "run/docker.sock"))
    os.mkfifo(home / "pipe")
    monkeypatch.setattr(mounts, "engine_paths", lambda: (home / "run/docker.sock", home / ".docker"))
    yield home
    engine.close()


def agent_with(source: str) -> AgentConfig:
    text = f'version = 1\n[[mounts]]\nsource = "{source}"\ntarget = "/data"\n'
    return parse_agent("a", tomllib.loads(text), "agent.toml")


@pytest.mark.parametrize(("source", "problem"), [
    ("data", "'data' must be an absolute path or start with ~"),
    ("~/missing", "{home}/missing does not exist"),
    ("~/link-to-data", "{home}/link-to-data is a symlink (to {home}/data)"),
    ("~/link-to-file", "{home}/link-to-file is a symlink (to {home}/data/file.txt)"),
    ("~/link-to-token", "{home}/link-to-token is a symlink (to {home}/.config/claude-bottle/token)"),
    ("~/link-to-data/sub", "{home}/link-to-data/sub resolves to {home}/data/sub (through a symlink or '..'"),
    ("~/data/../.config", "{home}/data/../.config resolves to {home}/.config"),
    ("~/run/docker.sock", "{home}/run/docker.sock is a socket: only regular files and folders"),
    ("~/pipe", "{home}/pipe is a named pipe"),
    ("/dev/null", "/dev/null is a character device"),
    ("~/run", "{home}/run contains the Docker engine's socket or client folder, {home}/run/docker.sock"),
    ("~/.docker", "{home}/.docker is the Docker engine's socket or client folder"),
    ("~/.docker/config.json", "{home}/.docker/config.json lies under the Docker engine's socket or client folder"),
    ("~", "{home} contains the Docker engine's socket"),
    ("~/.config", "{home}/.config contains claude-bottle's config folder (the token file, the agents)"),
    ("~/.config/claude-bottle", "{home}/.config/claude-bottle is claude-bottle's config folder"),
    ("~/.config/claude-bottle/token", "lies under claude-bottle's config folder"),
    ("~/.local", "{home}/.local contains claude-bottle's state folder (the runs' audit)"),
    ("~/.local/state/claude-bottle/runs", "lies under claude-bottle's state folder"),
])
def test_bad_mount_sources_are_refused_naming_file_key_and_problem(home: Path, source: str, problem: str) -> None:
    with pytest.raises(ConfigError) as caught:
        agent_with(source)
    message = str(caught.value)
    assert message.startswith("agent.toml: mounts[0].source: ")
    assert problem.format(home=home) in message


def test_real_files_and_folders_are_mounted_as_written(home: Path) -> None:
    for source, real in (("~/data", home / "data"), ("~/data/file.txt", home / "data/file.txt"),
                         (f"{home}/data/sub/", home / "data/sub")):
        (mount,) = agent_with(source).mounts
        assert mount.source == real and mount.origin == "agent.toml: mounts[0].source"


@pytest.mark.parametrize(("workspace", "relation"), [("data", "is"), ("data/sub", "contains"), ("", "lies under")])
def test_a_mount_may_not_reach_the_workspace(home: Path, workspace: str, relation: str) -> None:
    agent = agent_with("~/data")
    if relation == "lies under":
        check_mounts(agent.mounts, home / "elsewhere")
        agent = agent_with("~/data/sub")
        workspace = "data"
    with pytest.raises(ConfigError) as caught:
        check_mounts(agent.mounts, home / workspace)
    assert str(caught.value).startswith(f"agent.toml: mounts[0].source: {home}/data")
    assert f"{relation} the workspace {home / workspace}, which the bottle has at /workspace already" \
        in str(caught.value)


def test_the_engine_paths_cover_the_usual_sockets_the_docker_host_and_the_client_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("DOCKER_HOST", "unix:///srv/engine/docker.sock")
    monkeypatch.setenv("XDG_RUNTIME_DIR", "/run/user/1234")
    assert set(engine_paths()) == {Path("/var/run/docker.sock"), Path("/run/docker.sock"), tmp_path / ".docker",
                                   Path("/srv/engine/docker.sock"), Path("/run/user/1234/docker.sock")}
    monkeypatch.setenv("DOCKER_HOST", "tcp://127.0.0.1:2375")
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    assert Path("/srv/engine/docker.sock") not in engine_paths()


@pytest.mark.parametrize(("workspace", "problem"), [
    ("~/.config", "it contains claude-bottle's config folder (the token file, the agents), {home}/.config/claude-bottle"),
    ("~/.config/claude-bottle/agents", "it lies under claude-bottle's config folder"),
    ("~/.local/state", "it contains claude-bottle's state folder (the runs' audit)"),
    ("~/run", "it contains the Docker engine's socket or client folder, {home}/run/docker.sock"),
    ("~/.docker", "it is the Docker engine's socket or client folder"),
])
def test_a_workspace_may_not_reach_what_no_mount_may(home: Path, workspace: str, problem: str) -> None:
    """The workspace is mounted read-write: one that held claude-bottle's token file (editing dotfiles in
    ``~/.config``) would hand the bottle the credential."""
    path = Path(os.path.expanduser(workspace))
    path.mkdir(parents=True, exist_ok=True)
    with pytest.raises(ConfigError) as caught:
        check_workspace(path)
    assert str(caught.value).startswith(f"refusing the workspace {path}: ")
    assert problem.format(home=home) in str(caught.value) and "--workspace DIR" in str(caught.value)
    (home / ".config/nvim").mkdir(exist_ok=True)
    for beside in (home / "data", home / ".config/nvim"):  # beside those, holding none of them
        check_workspace(beside)


def test_run_refuses_such_a_workspace_before_anything_starts(tmp_path: Path) -> None:
    project = tmp_path / "dotfiles"
    (project / "config/claude-bottle").mkdir(parents=True)
    env = {**os.environ, "XDG_CONFIG_HOME": str(project / "config"), "XDG_STATE_HOME": str(tmp_path / "state"),
           "CLAUDE_BOTTLE_OAUTH_TOKEN": make_token(), "DOCKER_HOST": f"unix://{tmp_path}/no-engine.sock"}
    result = subprocess.run([sys.executable, "-m", "claude_bottle", "run", "-p", "hi"], cwd=project, env=env,
                            capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert result.returncode == 2, result.stderr
    assert f"refusing the workspace {project}: it contains claude-bottle's config folder" in result.stderr


def test_a_workspace_or_writable_mount_holding_what_claude_bottle_runs_from_is_refused(
        home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """claude-bottle installed in a project's .venv (or editable from its source): a bottle there would change
    the code the host runs as claude-bottle at the next start, with the user's token at hand."""
    project = home / "data" / "project"
    site = project / ".venv" / "lib" / "site-packages"
    site.mkdir(parents=True)
    monkeypatch.setattr(sys, "path", [*sys.path, str(site)])
    for place in (project, project / ".venv"):
        with pytest.raises(ConfigError, match=rf"refusing the workspace {place}: it holds {site}, which"):
            check_workspace(place)
    check_workspace(home / "data" / "sub")  # beside it
    with pytest.raises(ConfigError, match="which this claude-bottle runs from on the host"):
        check_mounts((mounts.Mount(project, "/data", False, "agent.toml"),), home / "data" / "sub")
    check_mounts((mounts.Mount(project, "/data", True, "agent.toml"),), home / "data" / "sub")  # read-only
