"""Claude Code's own arguments through `run` and `start`, with the real Claude Code: its output is the command's
standard output alone, the prompt comes on standard input, its exit code is the command's, and its sessions
resume across runs of a workspace."""

from __future__ import annotations

import io
import json
import os
import pty
import select
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pexpect
import pytest

from claude_bottle.stub import DEFAULT_TEXT
from tests.bottle.conftest import Upstream, on_screen, write_agent

pytestmark = pytest.mark.docker
AGENT = "claude-args"


def cli(upstream: Upstream, *args: str) -> list[str]:
    return [sys.executable, "-P", "-m", "claude_bottle", "run", AGENT, *args, "--upstream", upstream.url,
            "--upstream-network", upstream.network]


def run(upstream: Upstream, workspace: Path, *args: str, claude_args: tuple[str, ...] = (),
        stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """``claude-bottle run AGENT ARGS -- CLAUDE_ARGS`` against the stub, standard error not a terminal."""
    command = cli(upstream, *args)
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



def test_on_a_terminal_the_bottles_control_sequences_are_shown_not_obeyed(
        upstream: Upstream, workspace: Path, agent: str) -> None:
    """A hijacked agent writes a clipboard write (OSC 52) and a screen clear to Claude Code's standard output
    (every /proc/PID/fd/1 it may open but its own): on a terminal they arrive as text, and Claude Code's answer
    after them as ever."""
    sequence = r"\033]52;c;cHduZWQ=\007\033[2J"
    attack = (f"run: own=$(readlink /proc/$$/fd/1); for f in /proc/[0-9]*/fd/1; do [ \"$(readlink $f)\" = \"$own\" ] "
              f"|| printf '{sequence}' > $f; done 2>/dev/null; echo planted")
    leader, follower = pty.openpty()
    process = subprocess.Popen(cli(upstream, "-p", attack), stdin=subprocess.DEVNULL, stdout=follower,
                               stderr=subprocess.PIPE, cwd=workspace)
    os.close(follower)
    shown, deadline = b"", time.monotonic() + 240
    try:
        while time.monotonic() < deadline:
            if not select.select([leader], [], [], 1)[0]:
                if process.poll() is not None:
                    break
                continue
            try:
                data = os.read(leader, 65536)
            except OSError:  # EIO: every end of the terminal but ours is closed
                break
            if not data:
                break
            shown += data
    finally:
        os.close(leader)
        _, errors = process.communicate(timeout=60)
    assert process.returncode == 0, errors
    assert b"\\x1b]52;c;cHduZWQ=\\x07\\x1b[2J" in shown, shown
    assert b"\x1b" not in shown, "the terminal got a control sequence from the bottle"
    assert b"Tool said: planted" in shown


def test_an_interactive_bottle_draws_its_interface_but_reaches_nothing_past_the_screen(
        upstream: Upstream, workspace: Path, agent: str) -> None:
    """In ``start`` a hijacked agent writes to Claude Code's own terminal: a clipboard write, a request for
    the window's title as typed input and a device control string. Claude Code's interface is drawn and
    answers; none of the three reaches the user's terminal."""
    (workspace / "attack.sh").write_text(
        'own=$(readlink /proc/$$/fd/1)\n'
        'for f in /proc/[0-9]*/fd/1; do [ "$(readlink $f)" = "$own" ] || '
        r"printf '\033]52;c;cHduZWQ=\007\033[21t\033P$qm\033\\' > $f; done 2>/dev/null" "\n"
        "echo planted\n")
    child = pexpect.spawn(sys.executable, ["-P", "-m", "claude_bottle", "start", AGENT, "--upstream", upstream.url,
                                           "--upstream-network", upstream.network],
                          cwd=str(workspace), timeout=120, dimensions=(40, 140), encoding="utf-8",
                          codec_errors="replace")
    child.logfile_read = shown = io.StringIO()
    try:
        child.expect(on_screen("bypass permissions on"))
        child.send("run: sh /workspace/attack.sh")
        time.sleep(0.5)
        child.send("\r")
        child.expect(on_screen("Tool said: planted"))
        child.sendcontrol("c")
        time.sleep(0.3)
        child.sendcontrol("c")
        child.expect(pexpect.EOF, timeout=60)
    finally:
        child.close(force=child.isalive())
    assert "\x1b[?2004h" in shown.getvalue(), "Claude Code's interface set its modes"
    for dropped in ("\x1b]52", "52;c;cHduZWQ=", "\x1b[21t", "\x1bP"):
        assert dropped not in shown.getvalue()
