"""`login` and `logout` as a user runs them, with no keyring backend (so the 0600 file is used)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

CLI = [sys.executable, "-m", "claude_bottle"]
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
