"""``approve`` against a fake gate channel: the live list on a pseudo-terminal (single keys), the line mode
without one, and allow-always written to the agent's file."""

from __future__ import annotations

import contextlib
import json
import os
import pty
import sys
import threading
import time
import tty
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from claude_bottle.commands import approve
from claude_bottle.commands.approve import Board, gates_to_answer, keys_of, loop, runs_asking, saver
from claude_bottle.errors import ConfigError, DockerError
from claude_bottle.runtime.ask_watch import Asked
from claude_bottle.runtime.names import RunNames
from tests.fake_engine import FakeEngine
from tests.unit.fake_control import DROPPED_SCRIPT, WATCH_SCRIPT, FakeChannel, asked


def selected(board: Board) -> Asked | None:
    """The selected question, without its key."""
    current = board.current()
    return current[1] if current else None


def test_the_board_lists_questions_in_order_and_drops_those_decided_elsewhere() -> None:
    board = Board("dev", ["dev-1234"])
    assert board.apply("dev-1234", asked("q1", "one.example"), 0.0) == Asked("q1", "one.example", 443)
    assert board.apply("dev-1234", asked("q1", "one.example"), 1.0) is None  # the watch's first lines repeat what is pending
    board.apply("dev-1234", asked("q2", "two.example", 80, kind="http", method="GET", path="/x", waited=4.0, waiting=3), 0.0)
    board.move(5)
    assert selected(board) == Asked("q2", "two.example", 80, "http", "GET", "/x", 4.0, 3)
    screen = board.render(10.0)
    assert "  one.example:443  waited 10s" in screen
    assert "> two.example:80 GET /x (3 requests)  waited 14s" in screen
    board.apply("dev-1234", {"event": "decided", "id": "q2", "answer": "deny-once", "by": "hook"}, 11.0)
    assert board.current() is None  # the selected one went: nothing is, until the user moves
    assert board.status == "two.example:80 GET /x: deny-once by hook"
    assert "two.example:80 GET /x: deny-once by hook; j/k selects another request" in board.render(11.0)
    board.move(-1)
    assert selected(board) == Asked("q1", "one.example", 443) and board.selected == 0
    board.apply("dev-1234", {"event": "decided", "id": "q1", "answer": "allow-once", "by": "timeout"}, 11.0)
    assert board.current() is None and "no request is waiting" in board.render(12.0)


# A name as long as DNS allows (253 characters) whose first labels are a host the user trusts: cut where the
# row or the line ends, the domain it is in (the part that decides where the data goes) and the port vanish.
LONG_HOST = "registry.npmjs.org." + ".".join(["mirror-cache-edge-node-0123456789-us-east-1"] * 4) + ".exfil.example"


def test_a_long_destination_is_shown_whole_in_the_list_and_only_its_path_is_cut() -> None:
    assert len(LONG_HOST) <= 253
    board = Board("dev", ["dev-1234"])
    board.apply("dev-1234", asked("q1", LONG_HOST, 8443, kind="http", method="POST", path="/" + "p" * 500), 0.0)
    screen = board.render(1.0)
    assert f"> {LONG_HOST}:8443…  waited 1s" in screen  # no room left for the path: the name fills the row
    assert "p" * 300 not in screen


def test_a_long_destination_is_shown_whole_in_the_line_mode() -> None:
    board = Board("dev", ["dev-1234"])
    added = board.apply("dev-1234", asked("q1", LONG_HOST, 8443, kind="http", method="GET", path="/" + "p" * 500), 0.0)
    assert added is not None
    line = approve.asked_line("dev-1234", added)
    assert line.startswith(f"asked q1 dev-1234 {LONG_HOST}:8443 GET /ppp") and line.endswith(" waited 0s\n")
    assert "p" * 300 not in line


def test_the_selection_never_moves_to_another_request_on_its_own() -> None:
    # The bottle ends a question when it likes (its held requests go away): the key the user is pressing for
    # the selected request must not answer the one that slid into its place.
    board = Board("dev", ["dev-1234"])
    for question, host in (("q1", "first.example"), ("q2", "pypi.org"), ("q3", "exfil.example")):
        board.apply("dev-1234", asked(question, host), 0.0)
    board.move(1)
    board.apply("dev-1234", {"event": "decided", "id": "q1", "answer": "deny-once", "by": "gone"}, 1.0)
    assert selected(board) == Asked("q2", "pypi.org", 443)
    assert "> pypi.org:443" in board.render(1.0)
    board.apply("dev-1234", {"event": "decided", "id": "q2", "answer": "deny-once", "by": "gone"}, 2.0)
    assert board.current() is None and "> " not in board.render(2.0)
    board.apply("dev-1234", {"event": "decided", "id": "q3", "answer": "deny-once", "by": "gone"}, 3.0)
    board.apply("dev-1234", asked("q4", "exfil.example"), 3.0)
    assert board.current() is None  # nor to one asked after it
    board.move(0)
    assert selected(board) == Asked("q4", "exfil.example", 443)


def test_keys_keep_arrows_whole() -> None:
    assert list(keys_of("j\x1b[Ak\x1bOBaq")) == ["j", "\x1b[A", "k", "\x1bOB", "a", "q"]


class Screen:
    """What the loop wrote, with a wait for a piece of it."""

    def __init__(self) -> None:
        self.text = ""
        self.changed = threading.Condition()

    def write(self, text: str) -> None:
        with self.changed:
            self.text += text
            self.changed.notify_all()

    def wait_for(self, piece: str, seconds: float = 20) -> None:
        with self.changed:
            assert self.changed.wait_for(lambda: piece in self.text, seconds), self.text[-2000:]


@pytest.fixture
def running() -> Iterator[Callable[..., tuple[Screen, int, threading.Thread]]]:
    """Runs ``loop`` in a thread: the screen, the descriptor to type on, the thread."""
    started: list[tuple[threading.Thread, list[int]]] = []

    def run(channel: FakeChannel | dict[str, FakeChannel], terminal: bool,
            save: Callable[[str], str] = lambda entry: "saved", board: Board | None = None,
            look: Callable[[], dict[str, Any]] | None = None) -> tuple[Screen, int, threading.Thread]:
        screen = Screen()
        if terminal:
            typing, fd = pty.openpty()
            tty.setcbreak(fd)  # as approve's own ``cbreak`` does: keys come one at a time
        else:
            fd, typing = os.pipe()
        channels = channel if isinstance(channel, dict) else {"r1": channel}
        thread = threading.Thread(target=loop, args=(channels, board or Board("dev", []), fd, screen.write,
                                                     terminal, save, None, look), daemon=True)
        thread.start()
        started.append((thread, [typing, fd]))
        return screen, typing, thread

    yield run
    for thread, fds in started:
        thread.join(10)
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)


def answer(typing: int, keys: bytes) -> None:
    """Keys typed once what is selected has been on the screen long enough to be read."""
    time.sleep(approve.ANSWER_DELAY + 0.2)
    os.write(typing, keys)


def test_on_a_terminal_keys_answer_the_selected_request(running: Callable[..., tuple[Screen, int, threading.Thread]]
                                                        ) -> None:
    channel = FakeChannel([asked("q1", "one.example"), asked("q2", "two.example")])
    screen, typing, thread = running(channel, True)
    screen.wait_for("two.example:443")
    os.write(typing, b"j")
    answer(typing, b"d")
    screen.wait_for("decided")  # the fake's reply message
    os.write(typing, b"\x1b[A")
    answer(typing, b"a")
    deadline = time.monotonic() + 20
    while len(channel.decided) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    os.write(typing, b"q")
    thread.join(10)
    assert not thread.is_alive()
    assert channel.decided == [("q2", "deny-once", "terminal"), ("q1", "allow-once", "terminal")]


def test_a_key_answers_only_what_was_on_the_screen_long_enough_to_read(
        running: Callable[..., tuple[Screen, int, threading.Thread]]) -> None:
    """After an answer the next request takes the selection, and the bottle chose it: a key pressed twice, or
    held, answers the first request only; so does a key pressed together with a move."""
    channel = FakeChannel([asked("q1", "pypi.org"), asked("q2", "exfil.example"), asked("q3", "other.example")])
    screen, typing, thread = running(channel, True)
    screen.wait_for("other.example:443")
    answer(typing, b"aa")
    screen.wait_for("not taken")
    answer(typing, b"ja")
    time.sleep(approve.ANSWER_DELAY + 0.2)
    os.write(typing, b"q")
    thread.join(10)
    assert channel.decided == [("q1", "allow-once", "terminal")]


def test_allow_always_is_offered_to_the_agents_file(running: Callable[..., tuple[Screen, int, threading.Thread]]
                                                    ) -> None:
    saved: list[str] = []

    def save(entry: str) -> str:
        saved.append(entry)
        raise ConfigError("not written")

    channel = FakeChannel([asked("q1", "pypi.org")])
    screen, typing, thread = running(channel, True, save)
    screen.wait_for("pypi.org:443")
    answer(typing, b"A")
    screen.wait_for("the agent's file unchanged: not written")
    os.write(typing, b"q")
    thread.join(10)
    assert channel.decided == [("q1", "allow-always", "terminal")] and saved == ["pypi.org:443"]


def test_without_a_terminal_questions_are_lines_and_answers_typed_lines(
        running: Callable[..., tuple[Screen, int, threading.Thread]]) -> None:
    channel = FakeChannel([asked("q1", "one.example"), asked("q2", "two.example", 80, kind="http", method="POST",
                                                               path="/up", waited=2.0)], expected=2)
    screen, typing, thread = running(channel, False)
    screen.wait_for("asked q2 r1 two.example:80 POST /up waited 2s\n")
    assert "asked q1 r1 one.example:443 waited 0s\n" in screen.text
    os.write(typing, b"D q2\nmaybe q1\nd q9\n\nallow-once q1\n")
    assert channel.done.wait(20)
    screen.wait_for("error: no request q9 is waiting")
    os.close(typing)  # the end of standard input ends it
    thread.join(10)
    assert not thread.is_alive()
    assert channel.decided == [("q2", "deny-always", "terminal"), ("q1", "allow-once", "terminal")]
    assert "error: type ANSWER ID" in screen.text


def test_the_end_of_the_gates_watch_ends_it(running: Callable[..., tuple[Screen, int, threading.Thread]]) -> None:
    channel = FakeChannel([])
    channel.watch_command = lambda: [sys.executable, "-c", "print('{}')"]  # type: ignore[method-assign]
    screen, _, thread = running(channel, False)
    thread.join(10)
    assert not thread.is_alive() and "the gate's watch ended" in screen.text


def test_a_watch_the_gate_dropped_is_watched_again(running: Callable[..., tuple[Screen, int, threading.Thread]]
                                                   ) -> None:
    """The gate drops a watcher that falls behind, which a bottle asking in a flood brings about: ``approve``
    watches again, and what was decided meanwhile leaves its list."""
    channel = FakeChannel([asked("q2", "two.example"), asked("q3", "three.example")])
    watches = iter([[sys.executable, "-c", DROPPED_SCRIPT, json.dumps(asked("q1", "one.example")),
                     json.dumps(asked("q2", "two.example"))],
                    [sys.executable, "-c", WATCH_SCRIPT, *(json.dumps(e) for e in channel.events)]])
    channel.watch_command = lambda: next(watches)  # type: ignore[method-assign]
    screen, typing, thread = running(channel, False)
    screen.wait_for("asked q3 r1 three.example:443")
    os.write(typing, b"a q1\na q3\n")
    assert channel.done.wait(20)
    screen.wait_for("error: no request q1 is waiting")
    os.close(typing)
    thread.join(10)
    assert not thread.is_alive() and "watch ended" not in screen.text
    assert channel.decided == [("q3", "allow-once", "terminal")]
    assert screen.text.count("asked q2") == 1


def test_a_refused_answer_is_shown(running: Callable[..., tuple[Screen, int, threading.Thread]]) -> None:
    channel = FakeChannel([asked("q1", "one.example")], reply={"ok": False, "error": "already decided"})
    screen, typing, thread = running(channel, False)
    screen.wait_for("asked q1")
    os.write(typing, b"a q1\n")
    screen.wait_for("one.example:443: already decided")
    os.close(typing)
    thread.join(10)


def test_allow_always_writes_the_agents_file_as_allow_save_does(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.chdir(tmp_path)
    save = saver("dev", yes=True)
    assert save("pypi.org:443") == "added to agent dev's file"
    text = (tmp_path / "config" / "claude-bottle" / "agents" / "dev.toml").read_text()
    assert 'host = "pypi.org"' in text and "added by `claude-bottle approve`" in text
    assert save("pypi.org:443") == "agent dev already lists it"
    save("git.example.com:8443")
    assert 'host = "git.example.com:8443"' in (tmp_path / "config" / "claude-bottle" / "agents" / "dev.toml").read_text()


def test_allow_always_in_a_run_without_an_agent_name_writes_no_file_it_would_not_read(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=r"not saved: this run was started without an agent's name.*"
                                          r"\.claude-bottle\.toml"):
        saver("default", yes=True)("pypi.org:443")
    assert not (tmp_path / "config" / "claude-bottle" / "agents" / "default.toml").exists()


def test_without_yes_and_no_terminal_nothing_is_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "stdin", open(os.devnull))  # noqa: SIM115
    with pytest.raises(ConfigError, match="--yes"):
        saver("dev", yes=False)("pypi.org:443")
    assert not (tmp_path / "config" / "claude-bottle" / "agents" / "dev.toml").exists()


def test_answers_by_key_or_name() -> None:
    assert [approve.answer_of(w) for w in ("a", "A", "d", "D", "deny-always", "x")] == \
        ["allow-once", "allow-always", "deny-once", "deny-always", "deny-always", None]


def test_a_gate_without_ask_mode_says_so(running: Callable[..., tuple[Screen, int, threading.Thread]]) -> None:
    channel = FakeChannel([])
    channel.watch_command = lambda: [  # type: ignore[method-assign]
        sys.executable, "-c", "print('{\"ok\": false, \"error\": \"watch: this gate does not ask\"}')"]
    screen, _, thread = running(channel, False)
    thread.join(10)
    assert "the gate refused to be watched: watch: this gate does not ask" in screen.text


def test_every_run_of_the_agent_on_the_workspace_is_answered_unless_one_is_named() -> None:
    """Parallel Agent SDK queries: each run holds its own questions; one board takes them all, ``--run`` one."""
    engine = FakeEngine()
    app = Path("/src/app")
    first, second, ops = RunNames.new("dev", app), RunNames.new("dev", app), RunNames.new("ops", app)
    for run in (first, ops):
        engine.add_container(run.gate, run.labels)
    assert [g.name for g in gates_to_answer(engine, "dev", app, None)] == [first.gate]
    engine.add_container(second.gate, second.labels)
    assert {g.name for g in gates_to_answer(engine, "dev", app, None)} == {first.gate, second.gate}
    assert runs_asking(engine, "dev", {str(app)}).keys() == {first.id, second.id}
    assert runs_asking(engine, "dev", {"/elsewhere"}) == {}
    with pytest.raises(DockerError, match="several bottles are running; name the AGENT"):
        gates_to_answer(engine, None, app, None)
    assert [g.name for g in gates_to_answer(engine, None, app, second.id)] == [second.gate]
    assert [g.name for g in gates_to_answer(engine, "dev", Path("/elsewhere"), first.id)] == [first.gate]
    with pytest.raises(DockerError, match=rf"run {ops.id} is agent ops's, not dev's"):
        gates_to_answer(engine, "dev", app, ops.id)
    with pytest.raises(DockerError, match=r"no run dev-0000 is running; see `claude-bottle ls`"):
        gates_to_answer(engine, None, app, "dev-0000")


def test_one_board_shows_each_runs_questions_with_its_run_and_answers_on_that_runs_gate(
        running: Callable[..., tuple[Screen, int, threading.Thread]]) -> None:
    """Each gate counts its questions from 1: the same id in two runs is two questions, each answered on its
    own run's gate, and a key held after one is answered does not answer the other unseen."""
    one = FakeChannel([asked("1", "pypi.org")])
    two = FakeChannel([asked("1", "exfil.example")])
    screen, typing, thread = running({"dev-aaaa": one, "dev-bbbb": two}, True)
    screen.wait_for("exfil.example:443")
    screen.wait_for("pypi.org:443")
    time.sleep(0.2)
    frame = screen.text.rsplit("\x1b[H\x1b[2J", 1)[-1]
    assert "claude-bottle approve: 2 runs (dev-aaaa, dev-bbbb) (agent dev)" in frame
    rows = [row for row in frame.split("\r\n") if row.startswith(("> dev-", "  dev-"))]
    assert sorted(row[2:].split("  waited")[0] for row in rows) == ["dev-aaaa  pypi.org:443",
                                                                      "dev-bbbb  exfil.example:443"]
    first = one if rows[0].startswith("> dev-aaaa") else two  # the board lists them as they came
    answer(typing, b"aa")  # the second a is for what slid into the selection: not taken
    screen.wait_for("not taken")
    os.write(typing, b"q")
    thread.join(10)
    assert first.decided == [("1", "allow-once", "terminal")] and (one.decided + two.decided) == first.decided


def test_in_the_line_mode_an_id_two_runs_share_needs_its_run(
        running: Callable[..., tuple[Screen, int, threading.Thread]]) -> None:
    one, two = FakeChannel([asked("1", "pypi.org")]), FakeChannel([asked("1", "exfil.example")])
    screen, typing, thread = running({"dev-aaaa": one, "dev-bbbb": two}, False)
    screen.wait_for("asked 1 dev-bbbb exfil.example:443")
    screen.wait_for("asked 1 dev-aaaa pypi.org:443")
    os.write(typing, b"a 1\nd 1 dev-bbbb\na 1 dev-cccc\n")
    assert two.done.wait(20)
    screen.wait_for("error: no request 1 of run dev-cccc is waiting")
    assert "error: request 1 waits in runs dev-aaaa, dev-bbbb: type ANSWER ID RUN" in screen.text
    os.write(typing, b"a 1\n")  # now only one run holds a request 1
    assert one.done.wait(20)
    os.close(typing)
    thread.join(10)
    assert one.decided == [("1", "allow-once", "terminal")] and two.decided == [("1", "deny-once", "terminal")]


def test_a_run_that_ends_leaves_the_board_and_one_that_starts_joins_it(
        running: Callable[..., tuple[Screen, int, threading.Thread]], monkeypatch: pytest.MonkeyPatch) -> None:
    """Its watch's end takes a run's questions off the board and the board goes on with the others; a run that
    starts while it is open is found and watched; the board ends with the last run."""
    monkeypatch.setattr(approve, "LOOK_SECONDS", 0.2)
    staying = FakeChannel([asked("1", "pypi.org")])
    ending = FakeChannel([asked("1", "gone.example")])
    ending.watch_command = lambda: [  # type: ignore[method-assign]
        sys.executable, "-c", DROPPED_SCRIPT, json.dumps(asked("1", "gone.example"))]
    ending.pending = lambda: (_ for _ in ()).throw(ConfigError("no gate"))  # type: ignore[method-assign]
    later = FakeChannel([asked("7", "later.example")])
    found: dict[str, Any] = {"dev-aaaa": staying}
    screen, typing, thread = running({"dev-aaaa": staying, "dev-zzzz": ending}, False, look=lambda: dict(found))
    screen.wait_for("asked 1 dev-zzzz gone.example:443")
    found["dev-cccc"] = later
    screen.wait_for("asked 7 dev-cccc later.example:443")
    os.write(typing, b"a 1\nd 7\n")
    assert staying.done.wait(20) and later.done.wait(20)
    assert "error" not in screen.text, screen.text  # request 1 is dev-aaaa's alone: dev-zzzz left the board
    found.clear()
    os.close(typing)
    thread.join(10)
    assert not thread.is_alive()


def test_an_engine_that_does_not_answer_a_look_for_new_runs_leaves_the_board_open(
        running: Callable[..., tuple[Screen, int, threading.Thread]], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(approve, "LOOK_SECONDS", 0.2)
    looks = iter([DockerError("the engine did not answer")])

    def look() -> dict[str, Any]:
        failure = next(looks, None)
        if failure is not None:
            raise failure
        return {"dev-cccc": FakeChannel([asked("7", "later.example")])}

    screen, typing, thread = running({"dev-aaaa": FakeChannel([asked("1", "pypi.org")])}, True, look=look)
    screen.wait_for("could not look for runs that started since: the engine did not answer")
    screen.wait_for("dev-cccc  later.example:443")
    os.write(typing, b"q")
    thread.join(10)
    assert not thread.is_alive()
