"""`login` and `logout` as a user runs them, with no keyring backend (so the 0600 file is used)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

CLI = [sys.executable, "-P", "-m", "claude_bottle"]
TOKEN = "sk-ant-oat01-" + "L" * 60


def run(tmp_path: Path, *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("CLAUDE_BOTTLE_OAUTH_TOKEN", "ANTHROPIC_API_KEY")}
    env.update(XDG_CONFIG_HOME=str(tmp_path), PYTHON_KEYRING_BACKEND="keyring.backends.fail.Keyring")
    return subprocess.run([*CLI, *args], input=stdin, capture_output=True, text=True, timeout=60, env=env)


def test_login_stores_a_0600_file_and_logout_removes_it(tmp_path: Path) -> None:
    stored = run(tmp_path, "login", "--stdin", stdin=TOKEN + "\n")
    path = tmp_path / "claude-bottle" / "token"
    assert stored.returncode == 0 and str(path) in stored.stdout
    assert path.read_text().strip() == TOKEN and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert TOKEN not in stored.stdout + stored.stderr
    removed = run(tmp_path, "logout")
    assert removed.returncode == 0 and not path.exists()
    assert run(tmp_path, "logout").stdout.strip() == "no stored token"


def test_login_refuses_what_is_not_a_token(tmp_path: Path) -> None:
    result = run(tmp_path, "login", "--stdin", stdin="hunter2\n")
    assert result.returncode == 2 and "does not hold an Anthropic token" in result.stderr
    assert not (tmp_path / "claude-bottle" / "token").exists()


def test_login_name_stores_a_credential_routes_value_and_run_uses_it(tmp_path: Path) -> None:
    value = "ghp_" + "Q" * 36
    stored = run(tmp_path, "login", "github", "--stdin", stdin=value + "\n")
    path = tmp_path / "claude-bottle" / "credentials" / "github"
    assert stored.returncode == 0 and str(path) in stored.stdout and value not in stored.stdout + stored.stderr
    assert path.read_text().strip() == value and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert run(tmp_path, "login", "github", "--stdin", stdin="short\n").returncode == 2
    assert run(tmp_path, "logout", "github").returncode == 0 and not path.exists()


def test_a_failing_value_command_stops_the_start_before_anything_runs(tmp_path: Path) -> None:
    agents = tmp_path / "claude-bottle" / "agents"
    agents.mkdir(parents=True)
    (agents / "pushing.toml").write_text(
        f'version = 1\n[credentials.github]\ncommand = ["{sys.executable}", "-c", '
        '"import sys; sys.exit(\'not logged in to github.com\')"]\n')
    workspace = tmp_path / "project"
    workspace.mkdir()
    env = {**os.environ, "CLAUDE_BOTTLE_OAUTH_TOKEN": TOKEN, "XDG_CONFIG_HOME": str(tmp_path),
           "XDG_STATE_HOME": str(tmp_path / "state"), "DOCKER_HOST": "unix:///nonexistent.sock"}
    result = subprocess.run([*CLI, "run", "pushing", "-p", "hi", "--workspace", str(workspace)], text=True,
                            capture_output=True, timeout=60, env=env)
    assert result.returncode == 2, result.stderr
    assert "credentials.github: command" in result.stderr and "not logged in to github.com" in result.stderr
    assert "Docker" not in result.stderr, "the value is read before the engine is touched"


def test_login_proxy_stores_the_proxys_password_and_a_run_uses_it(tmp_path: Path) -> None:
    stored = run(tmp_path, "login", "proxy", "--stdin", stdin="pr0xy pass\n")
    path = tmp_path / "claude-bottle" / "upstream-proxy-password"
    assert stored.returncode == 0 and str(path) in stored.stdout and "pr0xy" not in stored.stdout + stored.stderr
    assert path.read_text() == "pr0xy pass\n" and stat.S_IMODE(path.stat().st_mode) == 0o600
    env = {"XDG_CONFIG_HOME": str(tmp_path), "PYTHON_KEYRING_BACKEND": "keyring.backends.fail.Keyring",
           "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
    chosen = subprocess.run([sys.executable, "-c", "from claude_bottle.agent.upstream_proxy import "
                             "choose_upstream_proxy as c; print(c(None, '', {'HTTPS_PROXY': 'http://me@proxy:3128'})"
                             ".password)"], capture_output=True, text=True, timeout=60, env={**os.environ, **env})
    assert chosen.stdout.strip() == "pr0xy pass", chosen.stderr
    assert run(tmp_path, "login", "proxy", "--stdin", stdin="\n").returncode == 2
    assert run(tmp_path, "logout", "proxy").returncode == 0 and not path.exists()
