"""`exec` takes everything after `--` as the command; `logs` reads the recorded runs without an engine."""

from __future__ import annotations

import contextlib
import json
import os
import pty
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from click.testing import CliRunner

from claude_bottle import launch, records
from claude_bottle.cli import cli
from claude_bottle.errors import DockerError
from claude_bottle.runtime import engines
from claude_bottle.runtime import gate as runtime_gate
from claude_bottle.runtime.names import RunNames
from tests.fake_engine import FakeEngine


@pytest.fixture
def docker_exec(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[Any]:
    """What `exec` would run, on an engine with a bottle of agent dev on ``tmp_path`` and one of agent ops
    elsewhere."""
    calls: list[Any] = []
    engine = FakeEngine()
    for run in (RunNames("dev-1", "dev", str(tmp_path)), RunNames("ops-2", "ops", "/elsewhere")):
        engine.add_container(run.gate, run.labels)
        engine.add_container(run.bottle, run.labels)
    monkeypatch.setattr(engines, "open_engine", lambda: engine)
    @contextlib.contextmanager
    def client(argv: list[str]) -> Iterator[Any]:
        calls.append(argv)
        yield SimpleNamespace(wait=lambda: 0)

    monkeypatch.setattr(launch, "engine_client", client)
    return calls


@pytest.mark.parametrize(("args", "agent", "command"), [
    (["--", "id", "-u"], None, ["id", "-u"]),
    (["dev", "--", "id", "-u"], "dev", ["id", "-u"]),
    (["--", "dev", "--", "x"], None, ["dev", "--", "x"]),  # only the first -- separates
])
def test_exec_runs_what_follows_the_double_dash_as_the_bottles_own_user(
    docker_exec: list[Any], args: list[str], agent: str | None, command: list[str], tmp_path: Path
) -> None:
    result = CliRunner().invoke(cli, ["exec", "--workspace", str(tmp_path), *args])
    assert result.exit_code == 0, result.output
    assert docker_exec == [["engine", "exec", "-i", "claude-bottle-dev-1-bottle", *command]]


# exec_in on an engine whose exec is the command itself, run here: what it writes is what a bottle wrote.
EXEC_ON_A_TERMINAL = """
import sys
from claude_bottle.commands.exec import exec_in
from claude_bottle.runtime import engines
from claude_bottle.runtime.names import RunNames
from tests.fake_engine import FakeEngine

engine = FakeEngine()
run = RunNames("dev-1", "dev", sys.argv[1])
engine.add_container(run.gate, run.labels)
engine.add_container(run.bottle, run.labels)
engine.exec_command = lambda name, argv, tty: argv
engines.open_engine = lambda: engine
sys.exit(exec_in("dev", sys.argv[1], [sys.executable, "-c", sys.argv[2]]))
"""


def test_exec_without_a_terminal_for_input_shows_a_terminal_output_s_control_characters(tmp_path: Path) -> None:
    """`claude-bottle exec -- CMD < /dev/null` on a terminal: a clipboard write and a screen clear the bottle
    writes are shown as escapes, not obeyed; the exit code is the command's."""
    written = r"import sys; sys.stdout.write('\x1b]52;c;eA==\x07\x1b[2Jdone\n'); sys.exit(3)"
    leader, follower = pty.openpty()
    root = Path(__file__).resolve().parents[2]
    child = subprocess.Popen([sys.executable, "-c", EXEC_ON_A_TERMINAL, str(tmp_path), written],
                             stdin=subprocess.DEVNULL, stdout=follower, stderr=follower, cwd=root,
                             env={**os.environ, "PYTHONPATH": f"{root / 'src'}{os.pathsep}{root}"})
    os.close(follower)
    shown = b""
    with contextlib.suppress(OSError):  # EIO once every writer is gone
        while data := os.read(leader, 65536):
            shown += data
    os.close(leader)
    assert child.wait(30) == 3
    assert b"\\x1b]52;c;eA==\\x07\\x1b[2Jdone" in shown and b"\x1b" not in shown, shown


@pytest.mark.parametrize(("args", "message"), [
    (["id"], "put the command after --: claude-bottle exec [AGENT] -- CMD..."),
    (["dev"], "put the command after --"),
    (["dev", "--"], "no command after --"),
    (["dev", "extra", "--", "id"], "unexpected extra argument"),
])
def test_exec_without_a_command_is_a_usage_error(docker_exec: list[Any], args: list[str], message: str) -> None:
    result = CliRunner().invoke(cli, ["exec", *args])
    assert result.exit_code == 2 and message in result.output
    assert docker_exec == []


@pytest.fixture
def recorded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Two recorded runs of one workspace and no engine."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))

    def no_engine() -> None:
        raise DockerError("no engine")

    monkeypatch.setattr(engines, "connect", no_engine)
    workspace = tmp_path / "project"
    for n, agent in enumerate(("dev", "ops")):
        line = {"time": "t", "listener": "proxy" if n else "api", "decision": "deny", "status": 403,
                "method": "CONNECT", "target": f"run{n}.example:443", "reason": "not in the allowlist"}
        records.save(f"{agent}-{n}", agent, str(workspace), "t", [json.dumps(line).encode()])
    return workspace


def test_logs_shows_the_last_run_of_this_workspace_or_of_an_agent_or_a_given_run(recorded: Path) -> None:
    runner = CliRunner()
    assert "run1.example:443" in runner.invoke(cli, ["logs", "--workspace", str(recorded)]).output
    assert "run0.example:443" in runner.invoke(cli, ["logs", "dev"]).output
    assert "run0.example:443" in runner.invoke(cli, ["logs", "--run", "dev-0"]).output
    raw = runner.invoke(cli, ["logs", "--run", "dev-0", "--json"]).output
    assert json.loads(raw)["target"] == "run0.example:443"
    assert runner.invoke(cli, ["logs", "--run", "dev-0", "--egress"]).output == "", "an API route line"
    listed = runner.invoke(cli, ["logs", "--runs"]).output.splitlines()
    assert listed[0].split()[:2] == ["RUN", "AGENT"] and [line.split()[0] for line in listed[1:]] == ["dev-0", "ops-1"]


def test_logs_json_holds_no_control_character_a_bottle_chose(recorded: Path) -> None:
    """An MCP method and tool name are the bottle's words, audited as written: as JSON they are escaped, so a
    C1 CSI or OSC, or a bidi override, never reaches the terminal, and the values read back the same."""
    line = {"time": "t", "listener": "mcp", "decision": "deny", "status": 200, "target": "mcp.example:443",
            "method": "\x9b2J\u202etools/call", "tool": "\x9d52;c;eA==\x9c", "reason": "x"}
    records.save("dev-9", "dev", str(recorded), "t", [json.dumps(line, ensure_ascii=False).encode()])
    raw = CliRunner().invoke(cli, ["logs", "--run", "dev-9", "--json"]).output
    assert raw.isascii() and json.loads(raw)["method"] == line["method"] and json.loads(raw)["tool"] == line["tool"]


def test_logs_and_suggest_say_when_a_runs_first_lines_were_pushed_out(recorded: Path) -> None:
    """The engine and the host keep a run's newest audit lines, and a bottle chooses how many it makes: lines
    are numbered, so a log that begins past its first says so."""
    line = {"version": 2, "time": "t", "listener": "proxy", "decision": "deny", "status": 403, "method": "CONNECT",
            "target": "exfil.example:443", "reason": "not in the allowlist", "unlisted": True}
    records.save("dev-8", "dev", str(recorded), "t",
                 [b'{}\n', *(json.dumps({**line, "seq": n}).encode() + b"\n" for n in (4001, 4002))])
    for command in (["logs", "--run", "dev-8"], ["logs", "--run", "dev-8", "--json"],
                    ["policy", "suggest", "--run", "dev-8"]):
        result = CliRunner().invoke(cli, command)
        assert result.exception is None and "exfil.example" in result.stdout, command
        assert "run dev-8: its first 4000 audit lines are not kept" in result.stderr, command
        assert "line 4001" in result.stderr and result.stderr.count("not kept") == 1
    whole = CliRunner().invoke(cli, ["logs", "--run", "dev-0"])
    assert "not kept" not in whole.stderr, "lines without a number (an earlier gate's) say nothing"
    records.save("dev-9", "dev", str(recorded), "t", [json.dumps({**line, "seq": 1}).encode()])
    assert "not kept" not in CliRunner().invoke(cli, ["logs", "--run", "dev-9"]).stderr


def test_logs_errors_say_what_to_do(recorded: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    other = runner.invoke(cli, ["logs", "--workspace", str(tmp_path / "other")])
    assert isinstance(other.exception, Exception) and "no runs recorded for this workspace" in str(other.exception)
    assert "logs --runs" in str(other.exception)
    follow = runner.invoke(cli, ["logs", "--workspace", str(recorded), "--follow"])
    assert "--follow shows a running bottle's decisions" in str(follow.exception)


def test_logs_is_a_table_and_policy_suggest_reads_the_same_run(recorded: Path) -> None:
    runner = CliRunner()
    table = runner.invoke(cli, ["logs", "--run", "ops-1"]).output.splitlines()
    assert table[0].split() == ["TIME", "DECISION", "METHOD", "HOST", "PATH", "RULE", "REASON"]
    assert table[1].split()[:3] == ["deny", "CONNECT", "run1.example:443"] and "\x1b" not in table[1]
    suggested = runner.invoke(cli, ["policy", "suggest", "--run", "ops-1"]).output
    assert "from run ops-1" in suggested and "run1.example:443: not in the allowlist" in suggested


@pytest.fixture
def gate_changes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """`allow` and `deny` against a stand-in gate of agent dev: the changes it was asked for."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    asked: list[tuple[str, str]] = []

    engine = FakeEngine()
    run = RunNames("dev-1", "dev", "/elsewhere")
    engine.add_container(run.gate, run.labels)

    def control(name: str, argv: list[str]) -> tuple[int, bytes]:
        assert name == run.gate and argv[:3] == [runtime_gate.GATE_PYTHON, "-m", "claude_bottle.gate.control"]
        op, entry = argv[-2:]
        asked.append((op, entry))
        message = f"{op}ed {entry}".replace("denyed", "denied")
        return 0, json.dumps({"ok": True, "message": message, "policy": {}}).encode()

    engine.on_exec = control
    monkeypatch.setattr(engines, "open_engine", lambda: engine)
    monkeypatch.setattr(runtime_gate, "write_policy", lambda run_id, view: None)
    return asked


def agent_file(tmp_path: Path) -> Path:
    return tmp_path / "config" / "claude-bottle" / "agents" / "dev.toml"


def test_allow_save_appends_the_entry_after_the_diff_and_deny_save_takes_it_out(
        gate_changes: list[tuple[str, str]], tmp_path: Path) -> None:
    runner = CliRunner()
    saved = runner.invoke(cli, ["allow", "pypi.org", "--save", "--yes"])
    assert saved.exit_code == 0, saved.output
    assert '+host = "pypi.org"' in saved.output and agent_file(tmp_path).read_text().startswith("version = 1\n")
    assert runner.invoke(cli, ["allow", "dev", "pypi.org", "--save", "--yes"]).output.endswith(
        "agent dev already lists it\n")
    removed = runner.invoke(cli, ["deny", "pypi.org", "--save", "--yes"])
    assert removed.exit_code == 0 and '-host = "pypi.org"' in removed.output
    assert "pypi.org" not in agent_file(tmp_path).read_text()
    assert gate_changes == [("allow", "pypi.org"), ("allow", "pypi.org"), ("deny", "pypi.org")]


def test_saving_without_a_terminal_or_yes_writes_nothing(gate_changes: list[tuple[str, str]], tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["allow", "pypi.org", "--save"])
    assert result.exit_code != 0 and "run again with --yes" in str(result.exception)
    assert not agent_file(tmp_path).exists()
    missing = CliRunner().invoke(cli, ["deny", "other.example", "--save", "--yes"])
    assert "lists no entry other.example" in str(missing.exception)


def test_logs_of_a_running_bottle_reads_a_long_line_the_engine_splits(monkeypatch: pytest.MonkeyPatch,
                                                                      tmp_path: Path) -> None:
    """The engine hands a log line longer than 16 KiB over in pieces (Docker's frames), and a bottle makes
    one as long as it likes (a path it requests is audited): each piece is no line of its own, and the lines
    after it still show."""
    long = {"time": "t", "listener": "proxy", "decision": "allow", "status": 200, "method": "GET",
            "target": "pypi.org:80", "path": "/" + "a" * 40_000, "reason": "in the allowlist"}
    after = {"time": "t", "listener": "proxy", "decision": "deny", "status": 403, "method": "CONNECT",
             "target": "exfil.example:443", "reason": "exfil.example:443 is not in the allowlist", "unlisted": True}
    output = b"".join(json.dumps(line).encode() + b"\n" for line in (long, after))
    engine = FakeEngine()
    run = RunNames("dev-1", "dev", str(tmp_path))
    engine.add_container(run.gate, run.labels, output=output)
    engine.add_container(run.bottle, run.labels)
    monkeypatch.setattr(engine, "logs", lambda *_, **__: iter([output[i : i + 16384]
                                                               for i in range(0, len(output), 16384)]))
    monkeypatch.setattr(engines, "open_engine", lambda: engine)
    shown = CliRunner().invoke(cli, ["logs", "--workspace", str(tmp_path)])
    assert shown.exception is None, shown.output
    assert "pypi.org:80" in shown.output and "exfil.example:443" in shown.output
    raw = CliRunner().invoke(cli, ["logs", "--workspace", str(tmp_path), "--json"]).output.splitlines()
    assert [json.loads(line)["target"] for line in raw] == ["pypi.org:80", "exfil.example:443"]


def test_logs_skips_a_piece_of_a_line_the_engine_kept_without_its_beginning(recorded: Path) -> None:
    """The engine keeps a long line in pieces and drops its oldest log entries past its cap, so a run's kept
    log may begin with a line's later piece. A bottle that requested a path of braces has that piece begin
    with one, like an audit line: it is no line, and the lines after it still show."""
    piece = b'{{{{{{{{{{{{{{{{{{{{", "rule": null, "reason": "allowlist pypi.org"}'
    after = {"time": "t", "listener": "proxy", "decision": "deny", "status": 403, "method": "CONNECT",
             "target": "exfil.example:443", "reason": "exfil.example:443 is not in the allowlist", "unlisted": True}
    records.save("dev-7", "dev", str(recorded), "t", [piece + b"\n", json.dumps(after).encode() + b"\n"])
    for args in ([], ["--json"], ["--egress"]):
        shown = CliRunner().invoke(cli, ["logs", "--run", "dev-7", *args])
        assert shown.exception is None and "exfil.example:443" in shown.output, args
    suggested = CliRunner().invoke(cli, ["policy", "suggest", "--run", "dev-7"])
    assert suggested.exception is None and "exfil.example:443" in suggested.output


def test_a_workspace_a_bottle_named_is_listed_and_reported_with_its_control_characters_escaped(
        recorded: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A folder a bottle made in its workspace is where a program may start the next (an Agent SDK's cwd taken
    from the tree): its name, a clipboard write, is listed and said as escapes, never written to the terminal."""
    from claude_bottle.commands.common import progress

    named = str(recorded / "pkg\x1b]52;c;ZWNobyBwd25lZA==\x07")
    records.save("dev-7", "dev", named, "t", [])
    listed = CliRunner().invoke(cli, ["logs", "--runs"]).output
    engine = FakeEngine()
    engine.add_container(RunNames("dev-7", "dev", named).bottle, RunNames("dev-7", "dev", named).labels)
    monkeypatch.setattr(engines, "open_engine", lambda: engine)
    running = CliRunner().invoke(cli, ["ls"]).output
    progress(f"starting Claude Code in {named}")
    said = capsys.readouterr().err
    for shown in (listed, running, said):
        assert "\x1b" not in shown and "\x07" not in shown and "\\x1b]52;c;" in shown, shown
