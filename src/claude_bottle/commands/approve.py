"""``approve``: answer a running bottle's held requests (ask mode) from another terminal.

On a terminal it is a live list, single keys: a allow once (this run), A allow always (this run, and the
agent's file once its diff is confirmed, as ``allow --save``), d deny once, D deny always (this run), j/k or
the arrows to select, q to quit. Without a terminal it is a line mode for scripts: each question is printed
as a line (``asked ID RUN HOST:PORT [METHOD PATH] waited N s``), each answer read as a line ``ANSWER ID``, or
``ANSWER ID RUN`` where runs share an id (ANSWER: a, A, d, D or the answer's name), until standard input ends.

One board answers every run of the agent on the workspace (parallel Agent SDK queries each have a run and a
gate of their own), those that start while it is open included; ``--run`` picks one. A question is one run's:
its answer goes to that run's gate only.

The questions come from each gate's ``watch`` (runtime/ask_watch.py), the answers go to its ``decide`` as
``by = "terminal"``. Whoever answers first (this, another ``approve``, the hook, the timeout) decides; a
question answered elsewhere leaves the list.
"""

from __future__ import annotations

import contextlib
import functools
import os
import select
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from claude_bottle.errors import BottleError, DockerError

if TYPE_CHECKING:
    from claude_bottle.runtime.ask_watch import Asked, Channel, WatchProcess
    from claude_bottle.runtime.seam import ContainerInfo, Engine

KEYS = {"a": "allow-once", "A": "allow-always", "d": "deny-once", "D": "deny-always"}
MOVES = {"j": 1, "k": -1, "\x1b[B": 1, "\x1b[A": -1, "\x1bOB": 1, "\x1bOA": -1}
QUIT = ("q", "\x03", "\x04")
REDRAW_SECONDS = 1.0  # the waited times tick this often
# How long a request is on the screen, selected, before a key answers it. The request that takes the selection
# after an answer is the bottle's choice: a key pressed twice, or held, must not answer it unseen.
ANSWER_DELAY = 0.5
MAX_PENDING_BYTES = 1 << 20  # a watch line is far shorter: more without a newline is not the gate's
LOOK_SECONDS = 2.0  # how often the board looks for runs of the agent that started since


Key = tuple[str, str]  # a question on the board: its run, and its id in that run's gate


@dataclass
class Board:
    """What ``approve`` shows: the runs' questions in the order they came (each with when it was seen here),
    the selected one, and the last outcome. The selection stays on its question while others come and go; once
    that question leaves the list otherwise than by an answer from here (answered elsewhere, timed out, or
    withdrawn, which the bottle does when it likes), nothing is selected until the user moves (``lost``): a key
    pressed for it must not answer the question that slid into its place. Questions are told apart by run and
    id: each gate counts its own."""

    agent: str
    runs: list[str]  # on the board, in the order they joined it
    questions: dict[Key, tuple[Asked, float]] = field(default_factory=dict)
    selected: int = 0
    status: str = ""
    lost: bool = False
    shown: tuple[Key, float] = (("", ""), 0.0)  # the selected question as last drawn, and since when

    def apply(self, run: str, event: dict[str, Any], now: float) -> Asked | None:
        """Take one of run ``run``'s watch events in; the question it adds, if new."""
        from claude_bottle.display import printable
        from claude_bottle.runtime.ask_watch import SHOWN, Asked

        if event.get("event") == "asked" and (asked := Asked.from_fields(event)) is not None:
            if (run, asked.id) not in self.questions:
                self.questions[run, asked.id] = (asked, now)
                return asked
        elif event.get("event") == "decided" and (run, str(event.get("id"))) in self.questions:
            asked = self._drop((run, str(event.get("id"))))
            self.status = printable(f"{asked.summary()}: {event.get('answer')} by {event.get('by')}", SHOWN)
        return None

    def keep(self, run: str, pending: set[str]) -> None:
        """Of run ``run``'s questions only those in ``pending`` stay (a new watch's view: the others were
        decided meanwhile)."""
        for key in [key for key in self.questions if key[0] == run and key[1] not in pending]:
            self._drop(key)

    def join(self, run: str) -> None:
        if run not in self.runs:
            self.runs.append(run)

    def leave(self, run: str, why: str) -> None:
        """Run ``run`` is off the board (its watch ended: the run is over), its questions with it."""
        from claude_bottle.display import printable
        from claude_bottle.runtime.ask_watch import SHOWN

        self.keep(run, set())
        self.runs.remove(run)
        self.status = printable(f"run {run}: {why}", SHOWN)

    def _drop(self, key: Key) -> Asked:
        at = list(self.questions).index(key)
        asked, _ = self.questions.pop(key)
        if at < self.selected:
            self.selected -= 1
        elif at == self.selected:
            self.lost = True
        self.selected = min(self.selected, max(0, len(self.questions) - 1))
        return asked

    def answered(self, key: Key) -> None:
        """``key`` answered from here: off the list, the selection on the one now in its place."""
        self.questions.pop(key, None)
        self.selected = min(self.selected, max(0, len(self.questions) - 1))

    def current(self) -> tuple[Key, Asked] | None:
        ordered = list(self.questions.items())
        if not ordered or self.lost:
            return None
        key, (asked, _) = ordered[self.selected]
        return key, asked

    def answerable(self, now: float) -> tuple[Key, Asked] | None:
        """The selected question, once it has been drawn selected for ``ANSWER_DELAY``."""
        selected = self.current()
        if selected is None or self.shown[0] != selected[0] or now - self.shown[1] < ANSWER_DELAY:
            return None
        return selected

    def move(self, delta: int) -> None:
        self.lost = False
        self.selected = max(0, min(len(self.questions) - 1, self.selected + delta))

    def waited(self, key: Key, now: float) -> float:
        asked, seen = self.questions[key]
        return asked.waited + now - seen

    def render(self, now: float, width: int = 100) -> str:
        """The screen: a header with the keys, one row per question (the selected one marked; its run's id first
        when the board has several), the status. A row longer than ``width`` has its method and path cut, never
        its destination (ask_watch.Asked)."""
        from claude_bottle.display import printable

        several = len(self.runs) > 1
        runs = f"{len(self.runs)} runs ({', '.join(self.runs)})" if several else f"run {''.join(self.runs)}"
        lines = [printable(f"claude-bottle approve: {runs} (agent {self.agent})"),
                 "a allow once  A allow always  d deny once  D deny always  j/k select  q quit", ""]
        if not self.questions:
            lines.append("  no request is waiting")
        for i, (key, (asked, _)) in enumerate(self.questions.items()):
            mark = ">" if i == self.selected and not self.lost else " "
            head = f"{mark} {printable(key[0]) + '  ' if several else ''}{printable(asked.target)}"
            tail = (f" ({asked.waiting} requests)" if asked.waiting > 1 else "") + \
                f"  waited {self.waited(key, now):.0f}s"
            lines.append(f"{head}{asked.request(width - len(head) - len(tail))}{tail}")
        if (selected := self.current()) is not None and selected[0] != self.shown[0]:
            self.shown = (selected[0], now)
        hint = "; j/k selects another request" if self.lost and self.questions else ""
        lines += ["", (self.status + hint)[:width]]
        return "\x1b[H\x1b[2J" + "\r\n".join(lines) + "\r\n"


def keys_of(data: str) -> Iterator[str]:
    """The keys in what the terminal sent: escape sequences for the arrows kept whole."""
    i = 0
    while i < len(data):
        three = data[i : i + 3]
        if three in MOVES:
            yield three
            i += 3
        else:
            yield data[i]
            i += 1


def answer_of(word: str) -> str | None:
    """An answer's key (a, A, d, D) or name as itself; None for anything else."""
    from claude_bottle.runtime.ask_watch import ANSWERS

    return KEYS.get(word) or (word if word in ANSWERS else None)


Save = Callable[[str], str]


def decide(channel: Channel, board: Board, key: Key, asked: Asked, answer: str, save: Save) -> str:
    """Send ``answer`` to ``asked`` (``key`` on the board) from the terminal, on its run's ``channel``; the
    outcome's line. An allow-always is also offered to the agent's file (``save`` with the entry: what it did)."""
    try:
        reply = channel.decide(asked.id, answer, "terminal")
    except (OSError, ValueError, BottleError) as exc:
        return f"{asked.summary()}: not sent ({exc})"
    if not reply.get("ok"):
        return f"{asked.summary()}: {reply.get('error', 'refused by the gate')}"
    board.answered(key)
    said = str(reply.get("message") or f"{answer} {asked.target}")
    if answer == "allow-always":
        try:
            said += f"; {save(str(reply.get('entry') or asked.target))}"
        except BottleError as exc:
            said += f"; the agent's file unchanged: {exc}"
    return said


class Lines:
    """Whole lines out of a descriptor read in pieces."""

    def __init__(self) -> None:
        self.partial = b""

    def feed(self, data: bytes) -> list[bytes]:
        *whole, self.partial = (self.partial + data).split(b"\n")
        if len(self.partial) > MAX_PENDING_BYTES:
            self.partial = b""
        return whole


@dataclass
class Watched:
    """One run's gate as the board watches it: its channel, its watch process, the lines read so far, and
    whether an event came on this watch (it worked, so its end may be the gate dropping a slow watcher)."""

    channel: Channel
    process: WatchProcess
    lines: Lines = field(default_factory=Lines)
    heard: bool = False


Look = Callable[[], "dict[str, Channel]"]  # the runs to answer now, by run id: those running and asking


def loop(channels: dict[str, Channel], board: Board, fd: int, write: Callable[[str], None], terminal: bool,
         save: Save, on_terminal: Callable[[], contextlib.AbstractContextManager[None]] | None = None,
         look: Look | None = None) -> None:
    """Show ``board``'s questions as they come from the runs' ``channels`` and answer them from ``fd`` (single
    keys when ``terminal``, else lines), until q, the end of ``fd``, or the end of every run's watch. ``look``
    (every ``LOOK_SECONDS``, and when the last watch ends) finds runs that started since: each joins the board.
    ``on_terminal``: leaves the terminal's key mode around ``save`` (its confirmation reads a whole line)."""
    from claude_bottle.runtime.ask_watch import WatchProcess, parse_event, refused

    watched: dict[str, Watched] = {}
    done: set[str] = set()  # runs whose watch ended or was refused: not watched again
    typed = Lines()

    def watch(found: dict[str, Channel]) -> None:
        for run, channel in found.items():
            if run not in watched and run not in done:
                watched[run] = Watched(channel, WatchProcess(channel))
                board.join(run)

    def looked() -> dict[str, Channel]:
        """The runs ``look`` finds; none, said on the board, when the engine does not answer this time."""
        try:
            return look() if look is not None else {}
        except BottleError as exc:
            board.status = f"could not look for runs that started since: {exc}"
            return {}

    def end(run: str, why: str) -> bool:
        """Run ``run`` off the board; whether the board ends with it (no run left to answer)."""
        watched.pop(run).process.stop()
        done.add(run)
        board.leave(run, why)
        if not watched:
            watch(looked())
        if not watched:
            write(f"{why}\r\n")
        return not watched

    watch(channels)
    last_look = time.monotonic()
    try:
        while True:
            if terminal:
                write(board.render(time.monotonic()))
            ready, _, _ = select.select([fd, *(w.process.fileno for w in watched.values())], [], [],
                                        REDRAW_SECONDS)
            for run, seen in list(watched.items()):
                if seen.process.fileno not in ready:
                    continue
                data = os.read(seen.process.fileno, 65536)
                if not data:
                    if seen.heard and (again := watched_again(seen.channel, board, run)) is not None:
                        seen.process.stop()
                        watched[run] = Watched(seen.channel, again)
                    elif end(run, "the gate's watch ended: the run is over, or its gate has no ask mode"):
                        return
                    continue
                for line in seen.lines.feed(data):
                    if (event := parse_event(line)) is None:
                        if refusal := refused(line):
                            if end(run, f"the gate refused to be watched: {refusal}"):
                                return
                            break
                        continue
                    seen.heard = True
                    shown = event.get("event") == "decided" and (run, str(event.get("id"))) in board.questions
                    added = board.apply(run, event, time.monotonic())
                    if not terminal and added is not None:
                        write(asked_line(run, added))
                    elif not terminal and shown:
                        write(f"decided {board.status}\n")
            if look is not None and time.monotonic() - last_look >= LOOK_SECONDS:
                watch(looked())
                last_look = time.monotonic()
            if fd not in ready:
                continue
            data = os.read(fd, 4096)
            if not data:
                return
            if terminal:
                for key in keys_of(data.decode("utf-8", "replace")):
                    if key in QUIT:
                        return
                    if key in MOVES:
                        board.move(MOVES[key])
                    elif key in KEYS and (selected := board.answerable(time.monotonic())) is not None:
                        guard = on_terminal() if on_terminal is not None and key == "A" else contextlib.nullcontext()
                        with guard:
                            board.status = answer_on(watched, board, *selected, KEYS[key], save)
                    elif key in KEYS and board.current() is not None:
                        board.status = f"{key}: not taken; look at the selected request, then press it again"
            else:
                for line in typed.feed(data):
                    write(typed_answer(watched, board, line.decode("utf-8", "replace"), save) + "\n")
    finally:
        for seen in watched.values():
            seen.process.stop()


def answer_on(watched: dict[str, Watched], board: Board, key: Key, asked: Asked, answer: str, save: Save) -> str:
    """``decide`` on the channel of the question's run."""
    if key[0] not in watched:  # its run left the board meanwhile
        return f"{asked.summary()}: not sent (run {key[0]} is over)"
    return decide(watched[key[0]].channel, board, key, asked, answer, save)


def watched_again(channel: Channel, board: Board, run: str) -> WatchProcess | None:
    """A new watch of run ``run``, once the gate ended one that worked: a gate drops a watcher that falls
    behind (a bottle asking in a flood while the user reads a diff), and the run goes on. The run's questions
    decided meanwhile leave the board; the pending ones come again as the new watch's first events. None when
    the gate does not answer (the run is over)."""
    from claude_bottle.runtime.ask_watch import WatchProcess

    watch = WatchProcess(channel)
    try:
        pending = channel.pending()  # asked after the new watch began: nothing decided in between is missed
    except BottleError:
        watch.stop()
        return None
    board.keep(run, {asked.id for asked in pending})
    return watch


def asked_line(run: str, asked: Asked) -> str:
    """A question in the line mode: its destination whole, its method and path cut (ask_watch.Asked)."""
    from claude_bottle.display import printable

    return f"{printable(f'asked {asked.id} {run}')} {asked.summary()} waited {asked.waited:.0f}s\n"


def typed_answer(watched: dict[str, Watched], board: Board, line: str, save: Save) -> str:
    """The outcome of one typed line ``ANSWER ID`` or ``ANSWER ID RUN``."""
    words = line.split()
    if not words:
        return ""
    if len(words) not in (2, 3) or (answer := answer_of(words[0])) is None:
        return "error: type ANSWER ID, or ANSWER ID RUN (ANSWER: a, A, d, D, allow-once, allow-always, deny-once, " \
               "deny-always)"
    keys = [key for key in board.questions if key[1] == words[1] and (len(words) == 2 or key[0] == words[2])]
    if not keys:
        return f"error: no request {' of run '.join(words[1:])} is waiting"
    if len(keys) > 1:
        runs = ", ".join(sorted(run for run, _ in keys))
        return f"error: request {words[1]} waits in runs {runs}: type ANSWER ID RUN"
    return answer_on(watched, board, keys[0], board.questions[keys[0]][0], answer, save)


def saver(agent: str, yes: bool) -> Save:
    """Adds an entry to agent ``agent``'s file as ``allow --save`` does (the diff shown, confirmed)."""
    from claude_bottle import suggest
    from claude_bottle.commands import agent_file

    def save(entry: str) -> str:
        host, _, port = entry.rpartition(":")
        written = host if port in ("443", "80") else entry
        if written in agent_file.allowlist(agent).texts() or entry in agent_file.allowlist(agent).texts():
            return f"agent {agent} already lists it"
        agent_file.add(agent, suggest.host_table(written, "added by `claude-bottle approve`"), yes)
        return f"added to agent {agent}'s file"

    return save


@contextlib.contextmanager
def cbreak(fd: int) -> Iterator[Callable[[], contextlib.AbstractContextManager[None]]]:
    """The terminal in key-at-a-time mode for the block (restored on the way out); yields how to leave that
    mode for a moment (around a confirmation)."""
    import termios
    import tty

    saved = termios.tcgetattr(fd)

    @contextlib.contextmanager
    def cooked() -> Iterator[None]:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)
        try:
            click.echo("\x1b[H\x1b[2J", nl=False)
            yield
        finally:
            tty.setcbreak(fd)

    tty.setcbreak(fd)
    try:
        yield cooked
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def gates_to_answer(engine: Engine, agent: str | None, workspace: Path, run: str | None) -> list[ContainerInfo]:
    """The gate of run ``run``, else the gates of ``agent``'s running bottles (this workspace's, else anywhere;
    or the only bottle's): runs of one agent on one workspace at once (parallel Agent SDK queries) each ask their
    own questions, and one board answers them all."""
    from claude_bottle.runtime.listing import gates_of, runs
    from claude_bottle.runtime.names import RunNames

    if run is None:
        return gates_of(engine, agent, workspace)
    found = next((r for r in runs(engine) if r["run"] == run), None)
    if found is None:
        raise DockerError(f"no run {run} is running; see `claude-bottle ls`")
    if agent and found["agent"] != agent:
        raise DockerError(f"run {run} is agent {found['agent'] or '(none)'}'s, not {agent}'s")
    gate = engine.container(RunNames(run).gate)
    if gate is None:
        raise DockerError(f"run {run} has no gate container; remove it with `claude-bottle stop`")
    return [gate]


def runs_asking(engine: Engine, agent: str, workspaces: set[str]) -> dict[str, Channel]:
    """The channels of ``agent``'s runs on ``workspaces`` now, by run id (a run without its gate is left out)."""
    from claude_bottle.runtime.ask_watch import GateChannel
    from claude_bottle.runtime.listing import runs
    from claude_bottle.runtime.names import RunNames

    found: dict[str, Channel] = {}
    for entry in runs(engine):
        if entry["agent"] == agent and entry["workspace"] in workspaces and \
                (gate := engine.container(RunNames(entry["run"]).gate)) is not None:
            found[entry["run"]] = GateChannel(engine, gate)
    return found


def approve(agent: str | None, workspace: str | None, yes: bool, run: str | None = None) -> None:
    """Answer the held requests of run ``run``, else of ``agent``'s running bottles (``gates_to_answer``), and
    of those that start while the board is open."""
    from claude_bottle.runtime.ask_watch import GateChannel
    from claude_bottle.runtime.engines import open_engine
    from claude_bottle.runtime.listing import runs

    engine = open_engine()
    gates = gates_to_answer(engine, agent, Path(workspace or os.getcwd()).expanduser().resolve(), run)
    opened = [GateChannel(engine, gate) for gate in gates]
    channels: dict[str, Channel] = {channel.run: channel for channel in opened}
    name = opened[0].agent or agent or ""
    places = {entry["workspace"] for entry in runs(engine) if entry["run"] in channels}
    look = None if run else functools.partial(runs_asking, engine, name, places)
    board = Board(name, [])
    save = saver(name, yes)
    fd = sys.stdin.fileno()
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        loop(channels, board, fd, out, False, save, look=look)
        return
    with cbreak(fd) as cooked:
        loop(channels, board, fd, out, True, save, cooked, look)
    click.echo(board.status)


def out(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()
