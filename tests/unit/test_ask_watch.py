"""The host's side of ask mode in the run's own process: questions parsed, hooks' answers, notifications, and
the watcher against a fake gate channel."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from claude_bottle.runtime import ask_watch
from claude_bottle.runtime.ask_watch import Asked, Watcher, hook_answer, notifier, run_hook, where_answered
from tests.unit.fake_control import FakeChannel, asked


def test_a_question_from_the_gate_fields() -> None:
    question = Asked.from_fields(asked("q1", "pypi.org", kind="http", method="GET", path="/simple/", port=80,
                                       waited=2.5, waiting=3))
    assert question == Asked("q1", "pypi.org", 80, "http", "GET", "/simple/", 2.5, 3)
    assert question.summary() == "pypi.org:80 GET /simple/"
    assert Asked("q2", "example.com", 443).summary() == "example.com:443"


def test_an_ipv6_destination_is_shown_in_brackets() -> None:
    assert Asked("q", "2001:db8::1", 443).summary() == "[2001:db8::1]:443"


@pytest.mark.parametrize("fields", [{}, {"id": "q"}, {"id": "q", "host": "h", "port": "https"},
                                    {"id": "", "host": "h", "port": 1}])
def test_what_is_not_a_question_is_none(fields: dict[str, Any]) -> None:
    assert Asked.from_fields(fields) is None


def test_a_bottle_chosen_path_is_shown_without_control_characters() -> None:
    question = Asked("q", "h.example", 80, "http", "GET", "/\x1b[2Jx\n")
    assert "\x1b" not in question.summary() and "\n" not in question.summary()


def test_a_long_destination_is_shown_whole_and_only_the_path_is_cut() -> None:
    host = "pypi.org." + ".".join(["files-mirror-cache-edge-node-0123456789-us-east-1"] * 4) + ".exfil.example"
    question = Asked("q", host, 8443, "http", "GET", "/" + "x" * 1000)
    assert question.summary().startswith(f"{host}:8443 GET /xxx")
    assert len(question.summary()) < len(host) + 300
    assert Asked("q", host, 8443).summary() == f"{host}:8443"


@pytest.mark.parametrize("code, output, answer", [
    (0, b"", "allow-once"),
    (0, b"\n", "allow-once"),
    (1, b"", "deny-once"),
    (2, b"", "deny-once"),
    (None, b"", "deny-once"),  # hung, killed
    (0, b'{"answer": "allow-always"}\n', "allow-always"),
    (0, b'{"answer": "deny-always"}', "deny-always"),
    (0, b'{"answer": "pass"}', None),
    (0, b'{"answer": "yes"}', "deny-once"),
    (0, b"sure\n", "deny-once"),
    (0, b'["allow-once"]', "deny-once"),
    (0, b'{"answer": "allow-once"}\n{"answer": "allow-always"}\n', "deny-once"),  # two lines: garbage
    (1, b'{"answer": "allow-always"}', "deny-once"),  # a failure denies whatever it said
])
def test_a_hooks_answer(code: int | None, output: bytes, answer: str | None) -> None:
    assert hook_answer(code, output) == answer


def hook(tmp_path: Path, body: str) -> tuple[str, ...]:
    script = tmp_path / "hook.py"
    script.write_text("import json, sys, time\nasked = json.load(sys.stdin)\n" + body)
    return (sys.executable, str(script))


def test_a_hook_reads_the_question_and_answers(tmp_path: Path) -> None:
    command = hook(tmp_path, "print(json.dumps({'answer': 'allow-always' if asked['host'] == 'ok.example' "
                             "and asked['run'] == 'r1' and asked['timeout'] == 60 else 'deny-always'}))\n")
    description = Asked("q", "ok.example", 443).description("r1", "dev", 60)
    assert run_hook(command, description, 10) == ("allow-always", "")


def test_a_hook_that_crashes_hangs_or_cannot_start_denies(tmp_path: Path) -> None:
    description = Asked("q", "h.example", 443).description("r1", "dev", 60)
    assert run_hook(hook(tmp_path, "raise SystemExit(3)\n"), description, 10) == ("deny-once", "exited with 3")
    began = time.monotonic()
    answer, why = run_hook(hook(tmp_path, "time.sleep(30)\n"), description, 0.5)
    assert (answer, time.monotonic() - began < 5) == ("deny-once", True) and "killed" in why
    assert run_hook(hook(tmp_path, "print('hello')\n"), description, 10)[0] == "deny-once"
    assert run_hook((str(tmp_path / "missing"),), description, 10)[0] == "deny-once"


def test_notifiers_take_the_words_as_arguments() -> None:
    found = {"notify-send": "/usr/bin/notify-send", "osascript": "/usr/bin/osascript"}
    linux = notifier(found.get, "linux")
    mac = notifier(found.get, "darwin")
    assert linux is not None and mac is not None
    assert linux("t", "$(x)") == ["/usr/bin/notify-send", "--app-name=claude-bottle", "--", "t", "$(x)"]
    assert mac("t", '" & x')[-2:] == ["t", '" & x'] and all('" & x' not in part for part in mac("t", '" & x')[:-1])
    assert notifier(lambda name: None, "linux") is None


def test_a_desktop_notification_shows_a_path_s_markup_as_written() -> None:
    """A plain-HTTP path may hold ``<b>`` or ``&#8238;`` (which would reverse what follows): a freedesktop
    notification's body is markup, so what the bottle wrote is escaped; macOS shows plain text."""
    question = Asked("q", "h.example", 80, "http", "GET", "/<b>x</b>&#8238;moc")
    linux = notifier({"notify-send": "/usr/bin/notify-send"}.get, "linux")
    mac = notifier({"osascript": "/usr/bin/osascript"}.get, "darwin")
    assert linux is not None and mac is not None
    assert linux("t", question.summary())[-1] == "h.example:80 GET /&lt;b&gt;x&lt;/b&gt;&amp;#8238;moc"
    assert mac("t", question.summary())[-1] == "h.example:80 GET /<b>x</b>&#8238;moc"


def test_a_notifier_that_fails_changes_nothing(tmp_path: Path) -> None:
    ask_watch.notify([str(tmp_path / "missing")])
    ask_watch.notify([sys.executable, "-c", "raise SystemExit(1)"])


def watched(channel: FakeChannel, hook_command: tuple[str, ...] = (), timeout: float = 60,
            desktop: Any = None) -> tuple[Watcher, list[str]]:
    said: list[str] = []
    watcher = Watcher(channel, "r1", "dev", hook_command, timeout, desktop, said.append)
    watcher.start()
    return watcher, said


def test_each_question_goes_to_the_hook_once_and_its_answer_to_the_gate(tmp_path: Path) -> None:
    command = hook(tmp_path, "raise SystemExit(0 if asked['host'] == 'ok.example' else 1)\n")
    channel = FakeChannel([asked("q1", "ok.example"), asked("q2", "bad.example"), asked("q1", "ok.example")],
                          expected=2)
    watcher, said = watched(channel, command)
    try:
        assert channel.done.wait(20)
    finally:
        watcher.close()
    assert sorted(channel.decided) == [("q1", "allow-once", "hook"), ("q2", "deny-once", "hook")]
    assert said == ["ask: the hook for bad.example:443 exited with 1: denied"]


def test_a_hook_that_passes_leaves_the_question(tmp_path: Path) -> None:
    command = hook(tmp_path, "open(sys.argv[0] + '.ran', 'w').close()\nprint(json.dumps({'answer': 'pass'}))\n")
    watcher, _ = watched(FakeChannel([asked("q1", "h.example")]), command)
    try:
        deadline = time.monotonic() + 20
        while not Path(command[1] + ".ran").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)
    finally:
        watcher.close()
    assert Path(command[1] + ".ran").exists() and watcher.channel.decided == []  # type: ignore[attr-defined]


def test_the_gate_refusing_a_hooks_answer_is_said(tmp_path: Path) -> None:
    channel = FakeChannel([asked("q1", "h.example")], reply={"ok": False, "error": "no such question"})
    watcher, said = watched(channel, hook(tmp_path, ""))
    try:
        assert channel.done.wait(20)
        time.sleep(0.2)
    finally:
        watcher.close()
    assert said == ["ask: the gate refused the hook's allow-once for h.example:443: no such question"]


def test_each_question_is_notified_and_other_events_are_not(tmp_path: Path) -> None:
    shown = tmp_path / "shown"
    desktop = notifier(lambda name: None)
    assert desktop is None
    script = f"import sys\nopen({str(shown)!r}, 'a').write(sys.argv[2] + '\\n')\n"

    def show(title: str, text: str) -> list[str]:
        return [sys.executable, "-c", script, title, text]

    events = [asked("q1", "one.example"), {"event": "decided", "id": "q1", "answer": "deny-once", "by": "x"},
              asked("q2", "two.example", 80, kind="http", method="POST", path="/up")]
    watcher, _ = watched(FakeChannel(events), desktop=show)
    try:
        deadline = time.monotonic() + 20
        while (not shown.exists() or shown.read_text().count("\n") < 2) and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        watcher.close()
    lines = sorted(shown.read_text().splitlines())
    assert lines == ["one.example:443: claude-bottle approve dev --run r1",
                     "two.example:80 POST /up: claude-bottle approve dev --run r1"]


def test_closing_kills_a_hook_still_running(tmp_path: Path) -> None:
    """A bottle can ask just before its run ends: the hook, whose question no gate can take an answer to any
    more, is killed with the watch, not left to its timeout (the ask timeout, up to a day), for which this
    process would wait at its exit (the pool's threads are joined then) and then report it."""
    command = hook(tmp_path, f"open({str(tmp_path / 'started')!r}, 'w').close()\ntime.sleep(60)\n")
    watcher, said = watched(FakeChannel([asked("q1", "h.example")]), command, timeout=60)
    deadline = time.monotonic() + 20
    while not (tmp_path / "started").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    watcher.close()
    threads = list(watcher.pool._threads)
    for thread in threads:
        thread.join(timeout=10)
    assert (tmp_path / "started").exists() and not any(t.is_alive() for t in threads) and said == []


def test_closing_ends_the_watch_process() -> None:
    watcher, said = watched(FakeChannel([]))
    deadline = time.monotonic() + 10
    while watcher.watch is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert watcher.watch is not None
    process = watcher.watch.process
    watcher.close()
    assert process.poll() is not None and said == []


def test_a_watch_that_ends_is_started_again_then_said(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(ask_watch, "MAX_RESTARTS", 2)
    monkeypatch.setattr(ask_watch, "RESTART_SECONDS", 0.01)
    started = tmp_path / "started"
    channel = FakeChannel([])
    refusal = '{"ok": false, "error": "cannot reach the gate\'s control socket"}'
    channel.watch_command = lambda: [  # type: ignore[method-assign]
        sys.executable, "-c", f"open({str(started)!r}, 'a').write('.'); print({refusal!r}); raise SystemExit(1)"]
    watcher, said = watched(channel)
    watcher.thread.join(20)
    watcher.close()
    assert started.read_text() == "..."  # the first watch and two more
    assert said == ["ask: the gate's questions are no longer watched here (exit 1: cannot reach the gate's "
                    "control socket); `claude-bottle approve dev --run r1` still answers them"]


def test_a_watch_that_fails_at_start_then_works_is_watched(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(ask_watch, "RESTART_SECONDS", 0.01)
    first = tmp_path / "first"
    channel = FakeChannel([asked("q1", "h.example")])
    watch = channel.watch_command()
    channel.watch_command = lambda: (  # type: ignore[method-assign]
        watch if first.exists() else [sys.executable, "-c", f"open({str(first)!r}, 'w')"])
    watcher, said = watched(channel, hook(tmp_path, ""))
    try:
        assert channel.done.wait(20)
    finally:
        watcher.close()
    assert channel.decided == [("q1", "allow-once", "hook")] and said == []


def test_where_questions_are_answered() -> None:
    assert where_answered("dev", "dev-1a2b", (), False).startswith(
        "ask mode: a destination outside the allowlist waits for an answer from "
        "`claude-bottle approve dev --run dev-1a2b`")
    line = where_answered("dev", "dev-1a2b", ("/opt/hook",), True)
    assert "the hook /opt/hook, then `claude-bottle approve dev --run dev-1a2b` in another terminal (desktop " \
        "notifications on)" in line
    assert "`claude-bottle approve --run r-1` in" in where_answered("", "r-1", (), False)


def test_a_question_for_the_hook_is_json(tmp_path: Path) -> None:
    description = Asked("q", "h", 1, "http", "GET", "/").description("r", "a", 5)
    assert json.loads(json.dumps(description))["method"] == "GET"


def gate_channel(replies: dict[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
                 ) -> tuple[ask_watch.GateChannel, list[list[str]], list[tuple[str, Any]]]:
    """A GateChannel on a fake engine whose gate answers each operation with ``replies[op]``: the channel, the
    control argv it ran, and the policy files written."""
    from claude_bottle.runtime import gate as runtime_gate
    from claude_bottle.runtime.names import RunNames
    from tests.fake_engine import FakeEngine

    engine = FakeEngine()
    run = RunNames("dev-1", "dev", "/elsewhere")
    info = engine.add_container(run.gate, run.labels)
    ran: list[list[str]] = []
    written: list[tuple[str, Any]] = []

    def control(name: str, argv: list[str]) -> tuple[int, bytes]:
        ran.append(argv[4:])
        return 0, json.dumps(replies[argv[4]]).encode()

    engine.on_exec = control
    monkeypatch.setattr(runtime_gate, "write_policy", lambda run_id, view: written.append((run_id, view)))
    monkeypatch.setattr(ask_watch, "write_policy", lambda run_id, view: written.append((run_id, view)))
    return ask_watch.GateChannel(engine, info), ran, written


def test_a_decision_reaches_the_gate_and_the_bottles_policy_file(monkeypatch: pytest.MonkeyPatch) -> None:
    channel, ran, written = gate_channel({"decide": {"ok": True, "message": "allow-once pypi.org", "entry": "pypi.org"},
                                          "show": {"ok": True, "policy": {"allow": ["pypi.org"]}}}, monkeypatch)
    assert (channel.run, channel.agent) == ("dev-1", "dev")
    assert channel.decide("3", "allow-once", "terminal")["entry"] == "pypi.org"
    assert ran == [["decide", "3", "allow-once", "terminal"], ["show"]]
    assert written == [("dev-1", {"allow": ["pypi.org"]})]
    assert channel.watch_command()[-6:] == ["claude-bottle-dev-1-gate", "/opt/gate/bin/python", "-m",
                                            "claude_bottle.gate.control", "/tmp/claude-bottle-control.sock", "watch"]


def test_pending_and_a_refused_decision(monkeypatch: pytest.MonkeyPatch) -> None:
    from claude_bottle.errors import BottleError

    channel, _, written = gate_channel({"decide": {"ok": False, "error": "no question 9"},
                                          "pending": {"ok": True, "pending": [asked("3", "pypi.org"), {"x": 1}]}},
                                         monkeypatch)
    assert channel.decide("9", "deny-once", "hook") == {"ok": False, "error": "no question 9"} and written == []
    assert channel.pending() == [Asked("3", "pypi.org", 443)]
    channel, _, _ = gate_channel({"pending": {"ok": False, "error": "this gate does not ask"}}, monkeypatch)
    with pytest.raises(BottleError, match="does not ask"):
        channel.pending()


def test_a_run_without_ask_mode_is_not_watched() -> None:
    import contextlib
    from types import SimpleNamespace

    from claude_bottle.launch import ask_watching

    run = SimpleNamespace(spec=SimpleNamespace(ask=False), engine=None, names=None)
    assert isinstance(ask_watching(run, ("hook",), print), contextlib.nullcontext)  # type: ignore[arg-type]


def test_a_flood_of_questions_shows_a_few_notifications_not_one_each(monkeypatch: pytest.MonkeyPatch) -> None:
    """A bottle asks as often as it likes (a question it withdraws is asked again): the desktop gets a few
    notifications, never a process and a bubble per question."""
    shown: list[list[str]] = []
    monkeypatch.setattr(ask_watch, "notify", shown.append)
    channel = FakeChannel([asked(f"q{n}", f"h{n}.example") for n in range(100)])
    watcher, _ = watched(channel, desktop=lambda title, text: [title, text])
    try:
        deadline = time.monotonic() + 20
        while len(watcher.seen) < 100 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)
    finally:
        watcher.close()
    assert len(watcher.seen) == 100 and len(shown) <= ask_watch.MAX_NOTIFICATIONS


def test_what_is_kept_of_a_question_goes_once_it_is_decided(tmp_path: Path) -> None:
    """A bottle asks as often as it likes for as long as the run lasts (a question it withdraws, it asks
    again): the run's process keeps nothing of a question once it is decided."""
    count = 20_000
    script = ("import json\n"
              f"for n in range({count}):\n"
              "    print(json.dumps({'event': 'asked', 'id': str(n), 'host': 'h.example', 'port': 443}))\n"
              "    print(json.dumps({'event': 'decided', 'id': str(n), 'answer': 'deny-once', 'by': 'gone'}))\n"
              "print(json.dumps({'event': 'asked', 'id': 'last', 'host': 'last.example', 'port': 443}), flush=True)\n"
              "import sys; sys.stdin.read()\n")
    channel = FakeChannel([])
    channel.watch_command = lambda: [sys.executable, "-c", script]  # type: ignore[method-assign]
    watcher, _ = watched(channel, hook(tmp_path, "raise SystemExit(1)\n"))
    try:
        deadline = time.monotonic() + 60
        while "last" not in watcher.seen and time.monotonic() < deadline:
            time.sleep(0.05)
        assert watcher.seen == {"last"}, "one question waits"
        while (watcher.hooked or watcher.decided) and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        watcher.close()
    assert (len(watcher.hooked), len(watcher.decided)) == (0, 0), "every hook is through"


def test_a_question_decided_before_its_turn_is_not_given_to_the_hook(tmp_path: Path) -> None:
    """Questions the bottle asked and withdrew wait behind the running hooks: they are not run (a hook that
    asks a person would ask about what no longer waits), and their answers are not sent."""
    command = hook(tmp_path, "time.sleep(1)\n")
    questions = [asked(f"q{n}", f"h{n}.example") for n in range(40)]
    gone = [{"event": "decided", "id": f"q{n}", "answer": "deny-once", "by": "gone"} for n in range(40)]
    channel = FakeChannel([*questions, *gone])
    watcher, _ = watched(channel, command)
    try:
        time.sleep(4)
    finally:
        watcher.close()
    assert len(channel.decided) <= ask_watch.MAX_HOOKS


def test_a_hook_runs_in_the_home_folder_not_in_the_workspace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The run's process is usually in its workspace, which its bottle writes: a hook run there (``python -m``,
    a relative path) would run the bottle's code on the host, and answer its questions."""
    workspace, home = tmp_path / "project", tmp_path / "home"
    workspace.mkdir()
    home.mkdir()
    (workspace / "planted_hook.py").write_text("print('{\"answer\": \"allow-always\"}')\n")
    monkeypatch.chdir(workspace)
    monkeypatch.setenv("HOME", str(home))
    description = Asked("q", "evil.example", 443).description("r1", "dev", 60)
    assert run_hook((sys.executable, "-m", "planted_hook"), description, 10)[0] == "deny-once"
