"""`start`, `run` and the drop-in hand Claude Code its own arguments untouched; `run` takes its prompt from
standard input; the drop-in's settings come from the environment, never its arguments."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
import time
from typing import Any

import pytest
from click.testing import CliRunner

from claude_bottle import cli as cli_module
from claude_bottle.cli import cli
from claude_bottle.commands import start as start_command
from claude_bottle.launch import forwarded_signals, while_read
from tests.fake_engine import FakeEngine


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, tuple[Any, ...]]]:
    """What the commands were asked to run, instead of running it."""
    seen: list[tuple[str, tuple[Any, ...]]] = []
    for name in ("start", "run", "claude"):
        monkeypatch.setattr(start_command, name, lambda *args, name=name: seen.append((name, args)) or 0)
    return seen


@pytest.mark.parametrize(("args", "expected"), [
    (["start"], ("start", (None, None, None, (), None, False, False, (), None, False))),
    (["start", "dev", "--keep", "--", "--resume", "abc"],
     ("start", ("dev", None, None, (), None, False, True, ("--resume", "abc"), None, False))),
    (["start", "--", "dev"], ("start", (None, None, None, (), None, False, False, ("dev",), None, False))),  # Claude's word
    (["run", "-p", "hi", "--", "--output-format", "stream-json", "--", "x"],
     ("run", (None, "hi", None, None, (), None, False, ("--output-format", "stream-json", "--", "x"), None, False))),
    (["run", "dev", "-p", "hi"], ("run", ("dev", "hi", None, None, (), None, False, (), None, False))),
    (["run", "-p", "hi", "--ask"], ("run", (None, "hi", None, None, (), None, False, (), None, True))),
    (["start", "--ask"], ("start", (None, None, None, (), None, False, False, (), None, True))),
    (["run", "-p", "hi", "--upstream-proxy", "none"], ("run", (None, "hi", None, None, (), None, False, (), "none", False))),
])
def test_what_follows_the_double_dash_is_claude_codes(
        calls: list[tuple[str, tuple[Any, ...]]], args: list[str], expected: tuple[str, tuple[Any, ...]]) -> None:
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert calls == [expected]


def test_run_without_a_prompt_reads_standard_input(calls: list[tuple[str, tuple[Any, ...]]]) -> None:
    result = CliRunner().invoke(cli, ["run", "--", "--max-turns", "3"], input="the prompt\n")  # not a terminal
    assert result.exit_code == 0, result.output
    assert calls == [("run", (None, None, None, None, (), None, False, ("--max-turns", "3"), None, False))]


def test_run_without_a_prompt_on_a_terminal_says_how_to_give_one(
        calls: list[tuple[str, tuple[Any, ...]]], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(start_command, "input_is_terminal", lambda: True)
    result = CliRunner().invoke(cli, ["run"])
    assert result.exit_code == 2
    assert "-p PROMPT, or on standard input" in result.output
    assert calls == []


@pytest.mark.parametrize("command", ["start", "run"])
def test_claude_options_before_the_double_dash_are_refused_with_the_fix(
        calls: list[tuple[str, tuple[Any, ...]]], command: str) -> None:
    result = CliRunner().invoke(cli, [command, "-p", "hi", "--model", "opus"] if command == "run"
                                else [command, "--model", "opus"])
    assert result.exit_code == 2
    assert f"claude-bottle {command} [AGENT] [OPTIONS] -- --model" in result.output
    assert calls == []


@pytest.mark.parametrize("args", [
    ["--help"], ["-h"], ["--debug", "-p", "hi"], ["--workspace", "x"], ["--", "x"], ["-p", "--", "y"],
])
def test_the_drop_in_takes_every_argument_as_claude_codes(
        calls: list[tuple[str, tuple[Any, ...]]], monkeypatch: pytest.MonkeyPatch, args: list[str]) -> None:
    monkeypatch.setattr("sys.argv", ["claude-bottle-claude", *args])
    with pytest.raises(SystemExit) as exited:
        cli_module.claude_main()
    assert exited.value.code == 0
    assert calls == [("claude", (tuple(args),))]


def test_signals_go_to_the_bottle_and_an_engine_that_cannot_take_them_ends_the_run() -> None:
    engine = FakeEngine()
    engine.add_container("b", {})
    with forwarded_signals(engine, "b"):
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGINT)
    assert engine.events[-2:] == [("kill", f"b {signal.SIGTERM}"), ("kill", f"b {signal.SIGINT}")]

    engine.fail.add("kill")
    with pytest.raises(KeyboardInterrupt), forwarded_signals(engine, "b"):
        os.kill(os.getpid(), signal.SIGHUP)


def test_a_signal_for_a_bottle_paused_by_another_start_reaches_it_once_it_goes_on() -> None:
    """The engine refuses any signal to a paused container: a Ctrl-C while a start on the same workspace holds
    the bottle paused for its mounts (runtime/stillness.py) waits for it instead of being lost."""
    engine = FakeEngine()
    engine.add_container("b", {}, status="paused")
    threading.Timer(0.3, engine.unpause, ["b"]).start()
    with forwarded_signals(engine, "b"):
        os.kill(os.getpid(), signal.SIGINT)
    assert engine.events[-2:] == [("unpause", "b"), ("kill", f"b {signal.SIGINT}")]


def test_a_bottle_held_paused_does_not_stretch_the_end_of_a_sigterm(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("claude_bottle.launch.END_SECONDS", 0.3, raising=False)
    engine = FakeEngine()
    engine.add_container("b", {}, status="paused")  # a start that hangs while it holds the bottle
    began = time.monotonic()
    with pytest.raises(KeyboardInterrupt), forwarded_signals(engine, "b"):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(15)
    assert time.monotonic() - began < 3


def test_a_bottle_that_does_not_end_on_sigterm_is_ended_from_here(monkeypatch: pytest.MonkeyPatch) -> None:
    """The agent stops its Claude Code (SIGSTOP, as Claude Code's own user): the SIGTERM passed on waits there
    forever, and so would the run and its gate. Some time after it, the run is ended all the same; a SIGINT
    (a key Claude Code reads) is only passed on."""
    monkeypatch.setattr("claude_bottle.launch.END_SECONDS", 0.2, raising=False)
    engine = FakeEngine()
    engine.add_container("b", {}, status="running")
    with forwarded_signals(engine, "b"):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.5)
    began = time.monotonic()
    with pytest.raises(KeyboardInterrupt), forwarded_signals(engine, "b"):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the engine's client waiting on a bottle that does not end
    assert time.monotonic() - began < 2
    assert engine.events[-2:] == [("kill", f"b {signal.SIGINT}"), ("kill", f"b {signal.SIGTERM}")]
    assert signal.getitimer(signal.ITIMER_REAL)[0] == 0


@pytest.mark.parametrize("socket_pair", [False, True], ids=["pipe", "socket"])  # Node gives a child sockets
def test_a_run_whose_output_lost_its_reader_ends(socket_pair: bool) -> None:
    """The program driving the drop-in is killed: nobody reads the bottle's output any more, and the run ends
    instead of lasting until the bottle next writes (which a hijacked one may never do)."""
    if socket_pair:
        reader, writer = (s.detach() for s in socket.socketpair())
    else:
        reader, writer = os.pipe()
    client = subprocess.Popen(["sleep", "30"])
    try:
        os.close(reader)
        began = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            while_read(client, writer)
        assert time.monotonic() - began < 5
    finally:
        client.kill()
        client.wait()
        os.close(writer)


def test_a_run_whose_output_is_read_returns_its_exit_code() -> None:
    reader, writer = os.pipe()
    try:
        assert while_read(subprocess.Popen(["sh", "-c", "sleep 1.5; exit 3"]), writer) == 3
    finally:
        os.close(reader)
        os.close(writer)
