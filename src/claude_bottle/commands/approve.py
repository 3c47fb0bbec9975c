"""``approve``: answer a running bottle's held requests (ask mode) from another terminal.

On a terminal it is a live list, single keys: a allow once (this run), A allow always (this run, and the
agent's file once its diff is confirmed, as ``allow --save``), d deny once, D deny always (this run), j/k or
the arrows to select, q to quit. Without a terminal it is a line mode for scripts: each question is printed
as a line (``asked ID RUN HOST:PORT [METHOD PATH] waited N s``), each answer read as a line ``ANSWER ID``
(ANSWER: a, A, d, D or the answer's name), until standard input ends.

The questions come from the gate's ``watch`` (runtime/ask_watch.py), the answers go to its ``decide`` as
``by = "terminal"``. Whoever answers first (this, another ``approve``, the hook, the timeout) decides; a
question answered elsewhere leaves the list.
"""

from __future__ import annotations

import contextlib
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


@dataclass
class Board:
    """What ``approve`` shows: the run's questions in the order they came (each with when it was seen here),
    the selected one, and the last outcome. The selection stays on its question while others come and go; once
    that question leaves the list otherwise than by an answer from here (answered elsewhere, timed out, or
    withdrawn, which the bottle does when it likes), nothing is selected until the user moves (``lost``): a key
    pressed for it must not answer the question that slid into its place."""

    run: str
    agent: str
    questions: dict[str, tuple[Asked, float]] = field(default_factory=dict)
    selected: int = 0
    status: str = ""
    lost: bool = False
    shown: tuple[str, float] = ("", 0.0)  # the selected question's id as last drawn, and since when

    def apply(self, event: dict[str, Any], now: float) -> Asked | None:
        """Take one watch event in; the question it adds, if new."""
        from claude_bottle.display import printable
        from claude_bottle.runtime.ask_watch import SHOWN, Asked

        if event.get("event") == "asked" and (asked := Asked.from_fields(event)) is not None:
            if asked.id not in self.questions:
                self.questions[asked.id] = (asked, now)
                return asked
        elif event.get("event") == "decided" and str(event.get("id")) in self.questions:
            asked = self._drop(str(event.get("id")))
            self.status = printable(f"{asked.summary()}: {event.get('answer')} by {event.get('by')}", SHOWN)
        return None

    def keep(self, pending: set[str]) -> None:
        """Only the questions in ``pending`` stay (a new watch's view: the others were decided meanwhile)."""
        for question in [q for q in self.questions if q not in pending]:
            self._drop(question)

    def _drop(self, question: str) -> Asked:
        at = list(self.questions).index(question)
        asked, _ = self.questions.pop(question)
        if at < self.selected:
            self.selected -= 1
        elif at == self.selected:
            self.lost = True
        self.selected = min(self.selected, max(0, len(self.questions) - 1))
        return asked

    def current(self) -> Asked | None:
        ordered = list(self.questions.values())
        return ordered[self.selected][0] if ordered and not self.lost else None

    def answerable(self, now: float) -> Asked | None:
        """The selected question, once it has been drawn selected for ``ANSWER_DELAY``."""
        asked = self.current()
        if asked is None or self.shown[0] != asked.id or now - self.shown[1] < ANSWER_DELAY:
            return None
        return asked

    def move(self, delta: int) -> None:
        self.lost = False
        self.selected = max(0, min(len(self.questions) - 1, self.selected + delta))

    def waited(self, asked: Asked, now: float) -> float:
        return asked.waited + now - self.questions[asked.id][1]

    def render(self, now: float, width: int = 100) -> str:
        """The screen: a header with the keys, one row per question (the selected one marked), the status. A
        row longer than ``width`` has its method and path cut, never its destination (ask_watch.Asked)."""
        from claude_bottle.display import printable

        lines = [f"claude-bottle approve: run {self.run} (agent {self.agent})",
                 "a allow once  A allow always  d deny once  D deny always  j/k select  q quit", ""]
        if not self.questions:
            lines.append("  no request is waiting")
        for i, (asked, _) in enumerate(self.questions.values()):
            mark = ">" if i == self.selected and not self.lost else " "
            target = printable(asked.target)
            tail = (f" ({asked.waiting} requests)" if asked.waiting > 1 else "") + \
                f"  waited {self.waited(asked, now):.0f}s"
            lines.append(f"{mark} {target}{asked.request(width - 2 - len(target) - len(tail))}{tail}")
        if (selected := self.current()) is not None and selected.id != self.shown[0]:
            self.shown = (selected.id, now)
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


def decide(channel: Channel, board: Board, asked: Asked, answer: str, save: Save) -> str:
    """Send ``answer`` to ``asked`` from the terminal; the outcome's line. An allow-always is also offered to
    the agent's file (``save`` with the entry: what it did)."""
    try:
        reply = channel.decide(asked.id, answer, "terminal")
    except (OSError, ValueError, BottleError) as exc:
        return f"{asked.summary()}: not sent ({exc})"
    if not reply.get("ok"):
        return f"{asked.summary()}: {reply.get('error', 'refused by the gate')}"
    board.questions.pop(asked.id, None)
    board.selected = min(board.selected, max(0, len(board.questions) - 1))
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


def loop(channel: Channel, board: Board, fd: int, write: Callable[[str], None], terminal: bool,
         save: Save, on_terminal: Callable[[], contextlib.AbstractContextManager[None]] | None = None) -> None:
    """Show ``board``'s questions as they come from ``channel`` and answer them from ``fd`` (single keys when
    ``terminal``, else lines), until q, the end of ``fd``, or the end of the gate's watch. ``on_terminal``:
    leaves the terminal's key mode around ``save`` (its confirmation reads a whole line)."""
    from claude_bottle.runtime.ask_watch import WatchProcess, parse_event, refused

    watch = WatchProcess(channel)
    events, typed = Lines(), Lines()
    heard = False  # an event came on this watch: it worked, so its end may be the gate dropping it
    try:
        while True:
            if terminal:
                write(board.render(time.monotonic()))
            ready, _, _ = select.select([fd, watch.fileno], [], [], REDRAW_SECONDS)
            if watch.fileno in ready:
                data = os.read(watch.fileno, 65536)
                if not data:
                    if heard and (again := watched_again(channel, board)) is not None:
                        watch.stop()
                        watch, events, heard = again, Lines(), False
                        continue
                    write("the gate's watch ended: the run is over, or its gate has no ask mode\r\n")
                    return
                for line in events.feed(data):
                    if (event := parse_event(line)) is None:
                        if refusal := refused(line):
                            write(f"the gate refused to be watched: {refusal}\r\n")
                            return
                        continue
                    heard = True
                    shown = event.get("event") == "decided" and str(event.get("id")) in board.questions
                    added = board.apply(event, time.monotonic())
                    if not terminal and added is not None:
                        write(asked_line(board, added))
                    elif not terminal and shown:
                        write(f"decided {board.status}\n")
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
                    elif key in KEYS and (asked := board.answerable(time.monotonic())) is not None:
                        guard = on_terminal() if on_terminal is not None and key == "A" else contextlib.nullcontext()
                        with guard:
                            board.status = decide(channel, board, asked, KEYS[key], save)
                    elif key in KEYS and board.current() is not None:
                        board.status = f"{key}: not taken; look at the selected request, then press it again"
            else:
                for line in typed.feed(data):
                    write(typed_answer(channel, board, line.decode("utf-8", "replace"), save) + "\n")
    finally:
        watch.stop()


def watched_again(channel: Channel, board: Board) -> WatchProcess | None:
    """A new watch, once the gate ended one that worked: a gate drops a watcher that falls behind (a bottle
    asking in a flood while the user reads a diff), and the run goes on. The questions decided meanwhile leave
    the board; the pending ones come again as the new watch's first events. None when the gate does not answer
    (the run is over)."""
    from claude_bottle.runtime.ask_watch import WatchProcess

    watch = WatchProcess(channel)
    try:
        pending = channel.pending()  # asked after the new watch began: nothing decided in between is missed
    except BottleError:
        watch.stop()
        return None
    board.keep({asked.id for asked in pending})
    return watch


def asked_line(board: Board, asked: Asked) -> str:
    """A question in the line mode: its destination whole, its method and path cut (ask_watch.Asked)."""
    from claude_bottle.display import printable

    return f"{printable(f'asked {asked.id} {board.run}')} {asked.summary()} waited {asked.waited:.0f}s\n"


def typed_answer(channel: Channel, board: Board, line: str, save: Save) -> str:
    """The outcome of one typed line ``ANSWER ID``."""
    words = line.split()
    if not words:
        return ""
    if len(words) != 2 or (answer := answer_of(words[0])) is None:
        return "error: type ANSWER ID (ANSWER: a, A, d, D, allow-once, allow-always, deny-once, deny-always)"
    if words[1] not in board.questions:
        return f"error: no request {words[1]} is waiting"
    return decide(channel, board, board.questions[words[1]][0], answer, save)


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


def gate_to_answer(engine: Engine, agent: str | None, workspace: Path, run: str | None) -> ContainerInfo:
    """The gate of run ``run``, else of ``agent``'s running bottle (this workspace's, else anywhere; or the only
    one). Runs of one agent on one workspace at once (parallel Agent SDK queries) each ask their own questions:
    then the run must be named, as each run's notices name it."""
    from claude_bottle.runtime.listing import gates_of, runs
    from claude_bottle.runtime.names import RunNames, run_of

    if run is None:
        gates = gates_of(engine, agent, workspace)
        if len(gates) > 1:
            raise DockerError(f"{len(gates)} runs of agent {agent} are running, each with its own questions: "
                              f"{', '.join(run_of(g.name) for g in gates)}; answer one with `claude-bottle "
                              "approve --run RUN` (a terminal each)")
        return gates[0]
    found = next((r for r in runs(engine) if r["run"] == run), None)
    if found is None:
        raise DockerError(f"no run {run} is running; see `claude-bottle ls`")
    if agent and found["agent"] != agent:
        raise DockerError(f"run {run} is agent {found['agent'] or '(none)'}'s, not {agent}'s")
    gate = engine.container(RunNames(run).gate)
    if gate is None:
        raise DockerError(f"run {run} has no gate container; remove it with `claude-bottle stop`")
    return gate


def approve(agent: str | None, workspace: str | None, yes: bool, run: str | None = None) -> None:
    """Answer the held requests of run ``run``, else of ``agent``'s running bottle (``gate_to_answer``)."""
    from claude_bottle.runtime.ask_watch import GateChannel
    from claude_bottle.runtime.engines import open_engine

    engine = open_engine()
    gate = gate_to_answer(engine, agent, Path(workspace or os.getcwd()).expanduser().resolve(), run)
    channel = GateChannel(engine, gate)
    name = channel.agent or agent or ""
    board = Board(channel.run, name)
    save = saver(name, yes)
    fd = sys.stdin.fileno()
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        loop(channel, board, fd, out, False, save)
        return
    with cbreak(fd) as cooked:
        loop(channel, board, fd, out, True, save, cooked)
    click.echo(board.status)


def out(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()
