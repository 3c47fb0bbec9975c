"""Claude Code's own arguments through `run` and `start`, with the real Claude Code: its output is the command's
standard output alone, the prompt comes on standard input, its exit code is the command's, and its sessions
resume across runs of a workspace."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from claude_bottle.stub import DEFAULT_TEXT
from tests.bottle.conftest import Upstream, write_agent

pytestmark = pytest.mark.docker
AGENT = "claude-args"


def run(upstream: Upstream, workspace: Path, *args: str, claude_args: tuple[str, ...] = (),
        stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """``claude-bottle run AGENT ARGS -- CLAUDE_ARGS`` against the stub, standard error not a terminal."""
    command = [sys.executable, "-m", "claude_bottle", "run", AGENT, *args, "--upstream", upstream.url,
               "--upstream-network", upstream.network]
    return subprocess.run([*command, *(("--", *claude_args) if claude_args else ())], input=stdin,
                          stdin=None if stdin is not None else subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=240, cwd=workspace)


@pytest.fixture
def agent(token: str) -> str:
    write_agent(AGENT, "")
    return AGENT


def test_stream_json_is_all_of_standard_output(upstream: Upstream, workspace: Path, agent: str) -> None:
    result = run(upstream, workspace, "-p", "say hi",
                 claude_args=("--output-format", "stream-json", "--verbose"))
    assert result.returncode == 0, result.stderr
    messages = [json.loads(line) for line in result.stdout.splitlines()]  # every line Claude Code's JSON
    assert messages[0]["type"] == "system" and messages[0]["subtype"] == "init"
    assert messages[-1]["type"] == "result" and messages[-1]["result"] == DEFAULT_TEXT
    assert "starting gate" not in result.stderr, "the steps are quiet where standard error is not a terminal"


def test_a_piped_prompt_and_sessions_resumed_across_runs(upstream: Upstream, workspace: Path, agent: str) -> None:
    first = run(upstream, workspace, stdin="run: echo piped > /workspace/piped.txt\n",
                claude_args=("--output-format", "json"))
    assert first.returncode == 0, first.stderr
    assert (workspace / "piped.txt").read_text() == "piped\n", "the prompt on standard input reached Claude Code"
    session = json.loads(first.stdout)["session_id"]

    before = len(upstream.requests())
    resumed = run(upstream, workspace, "-p", "say hi", claude_args=("--resume", session, "--output-format", "json"))
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout)["session_id"] == session
    turns = max(r["messages"] for r in upstream.requests()[before:] if r["target"].startswith("/v1/messages"))
    assert turns >= 3, "the resumed conversation went up with the first run's turns"

    continued = run(upstream, workspace, "-p", "say hi", claude_args=("--continue", "--output-format", "json"))
    assert continued.returncode == 0, continued.stderr

    unknown = run(upstream, workspace, "-p", "say hi", claude_args=("--resume", str(uuid.uuid4())))
    assert unknown.returncode != 0, "an unknown session is refused by Claude Code: the lookup above was real"


def test_claude_codes_errors_and_exit_code_are_the_commands(
        upstream: Upstream, workspace: Path, agent: str) -> None:
    result = run(upstream, workspace, "-p", "say hi", claude_args=("--no-such-option",))
    assert result.returncode == 1
    assert result.stdout == ""
    assert "unknown option '--no-such-option'" in result.stderr

