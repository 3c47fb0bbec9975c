from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.prerequisites import require

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def claude_binary() -> Path:
    """The real Claude Code CLI, installed from npm by scripts/test (or named by CLAUDE_BOTTLE_TEST_CLAUDE).

    Missing, the tests are skipped visibly; under CI (CI=true) that is a failure instead.
    """
    path = Path(os.environ.get("CLAUDE_BOTTLE_TEST_CLAUDE") or ROOT / ".cache/claude-code/node_modules/.bin/claude")
    path = path.absolute()  # Claude Code runs in each test's own folder
    require(path.exists(), f"real Claude Code not installed at {path}", "scripts/test installs it with npm")
    return path
