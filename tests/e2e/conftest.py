from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CLAUDE_VERSION = "2.1.190"


@pytest.fixture(scope="session")
def claude_binary() -> Path:
    """The real Claude Code CLI, installed from npm by scripts/test (or named by CLAUDE_BOTTLE_TEST_CLAUDE).

    Missing, the tests are skipped visibly; under CI (CI=true) that is a failure instead.
    """
    path = Path(os.environ.get("CLAUDE_BOTTLE_TEST_CLAUDE") or ROOT / ".cache/claude-code/node_modules/.bin/claude")
    path = path.absolute()  # Claude Code runs in each test's own folder
    if not path.exists():
        message = f"real Claude Code not installed at {path}: run scripts/test (it installs it with npm)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return path
