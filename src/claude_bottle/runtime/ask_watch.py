"""The host's side of ask mode: the gate's questions as they come, and who answers them besides ``approve``.

A gate in ask mode holds a request to a destination outside the allowlist and asks (gate/control.py: the
``watch``, ``pending`` and ``decide`` operations of its control socket, reached through the engine like
``allow``). The run's own CLI process watches its gate (``watching``) and, for each question,

- shows a desktop notification where the host has a notifier (notify-send, osascript): best effort, a
  notifier that is missing or fails changes nothing;
- runs the agent's ``ask_command`` hook, if it has one, on the host: a JSON description of the request on its
  standard input; it decides by its exit code or by one JSON line on its standard output (``hook_answer``)
  within the ask timeout, and its decision goes to the gate as ``by = "hook"``. A hook that fails, hangs
  (killed at the timeout) or prints anything else denies (once).

Nothing here can fail the run: a gate without ask mode's operations, a watch that ends, a hook that cannot
start all leave the questions to ``approve`` and the gate's timeout.
"""

from __future__ import annotations

import contextlib
import html
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

from claude_bottle.display import printable
from claude_bottle.errors import BottleError
from claude_bottle.paths import host_command_dir
from claude_bottle.runtime.files import write_policy
from claude_bottle.runtime.gate import control_command, control_reply
from claude_bottle.runtime.names import RunNames
from claude_bottle.runtime.seam import ContainerInfo, Engine

ANSWERS = ("allow-once", "allow-always", "deny-once", "deny-always")
PASS = "pass"  # a hook's answer that leaves the question to the others (approve, the timeout)
DEFAULT_TIMEOUT = 60.0  # the gate's --ask-timeout default
MAX_LINE = 64 * 1024  # a watch line longer than this is not one of the gate's
MAX_HOOKS = 16  # hooks running at once (the gate holds at most --ask-limit questions per run, 16 by default)
# Notifications in NOTIFY_WINDOW seconds; past them a question gets none (``approve`` lists it). A bottle asks
# as often as it likes (a question it withdraws, it asks again), and each notification is a process and a
# bubble on the desktop.
MAX_NOTIFICATIONS = 4
NOTIFY_WINDOW = 10.0
NOTIFY_SECONDS = 5.0
RESTART_SECONDS = 1.0  # between a watch that ended and the next
MAX_RESTARTS = 30  # in a row without an event: about the time a gate has to become ready
SHOWN = 200  # characters of a bottle's words (a destination, a refusal) shown in a question or a notice

Say = Callable[[str], None]


@dataclass(frozen=True)
class Asked:
    """One held question as the gate describes it: ``id``, the destination (``host``, ``port``), ``kind``
    ("connect" for a tunnel, "http" for a plain-HTTP request, with its ``method`` and ``path``), how long it has
    waited (``waited`` seconds, when the gate said it) and how many held requests share it (``waiting``)."""

    id: str
    host: str
    port: int
    kind: str = "connect"
    method: str | None = None
    path: str | None = None
    waited: float = 0.0
    waiting: int = 1

    @classmethod
    def from_fields(cls, fields: dict[str, Any]) -> Asked | None:
        """The question in a ``pending`` entry or an ``asked`` event; None for anything that is not one."""
        try:
            asked = cls(id=str(fields["id"]), host=str(fields["host"]), port=int(fields["port"]),
                        kind=str(fields.get("kind") or "connect"),
                        method=str(fields["method"]) if fields.get("method") else None,
                        path=str(fields["path"]) if fields.get("path") else None,
                        waited=float(fields.get("waited") or 0.0), waiting=int(fields.get("waiting") or 1))
        except (KeyError, TypeError, ValueError):
            return None
        return asked if asked.id and asked.host else None

    @property
    def target(self) -> str:
        """``host:port``, the allowlist entry an "always" answer adds or refuses; an IPv6 address in brackets
        (``2001:db8::1:443`` would name another address, on the default port)."""
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    def summary(self) -> str:
        """One line for people: the destination, and for plain HTTP the method and path."""
        return printable(self.target) + self.request()

    def request(self, limit: int = SHOWN) -> str:
        """For plain HTTP, `` METHOD PATH`` as shown, cut to ``limit`` characters ("…" marks the cut); else "".
        Only this is ever cut, never the destination: the gate takes a name of at most 253 characters, and the
        end of a long one (``pypi.org.<padding>.attacker.example``) is the domain it is in."""
        if self.kind != "http":
            return ""
        text = printable(f" {self.method or ''} {self.path or ''}".rstrip())
        return text if len(text) <= limit else text[: max(limit - 1, 0)] + "…"

    def description(self, run: str, agent: str, timeout: float) -> dict[str, Any]:
        """What a hook reads on its standard input."""
        return {"run": run, "agent": agent, "id": self.id, "host": self.host, "port": self.port,
                "kind": self.kind, "method": self.method, "path": self.path, "waited": self.waited,
                "waiting": self.waiting, "timeout": timeout}


def parse_event(line: bytes) -> dict[str, Any] | None:
    """One watch line as an event (a JSON object with an ``event``), or None."""
    try:
        event = json.loads(line)
    except ValueError:
        return None
    return event if isinstance(event, dict) and isinstance(event.get("event"), str) else None


def refused(line: bytes) -> str:
    """The error of a reply line the gate sent instead of events (no ask mode, too many watchers), or ""."""
    try:
        reply = json.loads(line)
    except ValueError:
        return ""
    return printable(str(reply.get("error", "")), SHOWN) if isinstance(reply, dict) and reply.get("ok") is False else ""


class Channel(Protocol):
    """Where a run's questions are read and answered: its gate's control socket, or a test's fake."""

    def watch_command(self) -> list[str]:
        """A command that prints the gate's events, one JSON line each, until its standard input closes."""

    def decide(self, question: str, answer: str, by: str) -> dict[str, Any]:
        """Answer question ``question``: the gate's reply (``ok`` false with its ``error`` when refused)."""

    def pending(self) -> list[Asked]:
        """The questions held now; a BottleError when the gate does not answer."""


@dataclass(frozen=True)
class GateChannel:
    """A running gate's control socket, reached through ``engine`` (runtime/gate.py ``control_reply``)."""

    engine: Engine
    gate: ContainerInfo

    @property
    def run(self) -> str:
        return RunNames.from_labels(self.gate.labels).id

    @property
    def agent(self) -> str:
        return RunNames.from_labels(self.gate.labels).agent

    def watch_command(self) -> list[str]:
        return self.engine.exec_command(self.gate.name, control_command(self.gate, ["watch"]), tty=False)

    def decide(self, question: str, answer: str, by: str) -> dict[str, Any]:
        """The answer sent; an answer changes the run's policy, so the bottle's policy file is rewritten (from
        the reply, or when it carries none from the gate's ``show``: best effort, the answer stands)."""
        reply = control_reply(self.engine, self.gate, ["decide", question, answer, by])
        if reply.get("ok") and "policy" not in reply:
            with contextlib.suppress(BottleError):
                shown = control_reply(self.engine, self.gate, ["show"])
                if shown.get("ok") and isinstance(shown.get("policy"), dict):
                    write_policy(self.run, shown["policy"])
        return reply

    def pending(self) -> list[Asked]:
        """The questions held now; a BottleError when the gate has no ask mode or refuses."""
        reply = control_reply(self.engine, self.gate, ["pending"])
        if not reply.get("ok"):
            raise BottleError(f"the gate {self.gate.name}: {reply.get('error', 'no pending list')}")
        found = (Asked.from_fields(entry) for entry in reply.get("pending") or [] if isinstance(entry, dict))
        return [asked for asked in found if asked is not None]


class WatchProcess:
    """The channel's events as they come, from a watch process of its own (its own session: a Ctrl-C at the
    terminal is not its). ``stop`` (from any thread, more than once) ends it: its standard input closed,
    which ends the gate's watch, then killed if need be."""

    def __init__(self, channel: Channel) -> None:
        self.errors = tempfile.TemporaryFile()  # noqa: SIM115 (lives as long as the process) a file, not a pipe: read at the end
        self.process = subprocess.Popen(channel.watch_command(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=self.errors, start_new_session=True)
        self.lock = threading.Lock()
        self.refusal = ""  # the error the gate answered instead of events, if it did

    def why_ended(self) -> str:
        """Its exit code and the last line it said on standard error, once it has ended."""
        code = self.process.wait()
        self.errors.seek(0)
        lines = self.errors.read()[-4096:].decode("utf-8", "replace").strip().splitlines()
        said = self.refusal or (printable(lines[-1], SHOWN) if lines else "")
        return f"exit {code}" + (f": {said}" if said else "")

    @property
    def fileno(self) -> int:
        """The descriptor its lines arrive on (for ``select``)."""
        assert self.process.stdout is not None
        return self.process.stdout.fileno()

    def lines(self) -> Iterator[dict[str, Any]]:
        """Its events until it ends (lines that are not events skipped)."""
        assert self.process.stdout is not None
        with contextlib.suppress(OSError, ValueError):  # ValueError: stopped from another thread
            while line := self.process.stdout.readline(MAX_LINE):
                if (event := parse_event(line)) is not None:
                    yield event
                elif refusal := refused(line):
                    self.refusal = refusal

    def stop(self) -> None:
        with self.lock:
            with contextlib.suppress(OSError):
                if self.process.stdin is not None:
                    self.process.stdin.close()
            try:
                self.process.wait(timeout=1.0)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def hook_answer(returncode: int | None, output: bytes) -> str | None:
    """What a hook decided: ``returncode`` None (it hung, killed at the timeout) or not 0 denies once; 0 with
    nothing on its standard output allows once; 0 with one JSON line ``{"answer": ANSWER}`` (ANSWER one of
    ``ANSWERS`` or "pass") answers that, "pass" meaning no decision (None); anything else printed denies."""
    if returncode != 0:
        return "deny-once"
    text = output.strip()
    if not text:
        return "allow-once"
    try:
        said = json.loads(text)
    except ValueError:
        return "deny-once"
    answer = said.get("answer") if isinstance(said, dict) else None
    if answer == PASS:
        return None
    return answer if answer in ANSWERS else "deny-once"


def run_hook(command: tuple[str, ...], description: dict[str, Any], timeout: float,
             running: set[subprocess.Popen[bytes]] | None = None) -> tuple[str | None, str]:
    """Run the hook ``command`` with ``description`` as JSON on its standard input, killed after ``timeout``
    seconds: its answer (``hook_answer``) and, when it failed, why. In ``running`` while it runs (for
    ``kill_hook``)."""
    running = set() if running is None else running
    try:
        process = subprocess.Popen(list(command), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                   stderr=subprocess.DEVNULL, start_new_session=True, cwd=host_command_dir())
    except OSError as exc:
        return "deny-once", f"cannot start ({exc.strerror or exc})"
    running.add(process)
    try:
        output, _ = process.communicate(json.dumps(description).encode() + b"\n", timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_hook(process)
        process.communicate()
        return "deny-once", f"no answer within {timeout:.0f}s (killed)"
    finally:
        running.discard(process)
    answer = hook_answer(process.returncode, output[:MAX_LINE])
    why = "" if process.returncode == 0 else f"exited with {process.returncode}"
    if process.returncode == 0 and answer == "deny-once" and output.strip():
        why = "printed something other than one JSON answer line"
    return answer, why


def kill_hook(process: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(OSError):
        os.killpg(process.pid, 9)  # its children too: a hung hook's helpers must not outlive it
    process.kill()


def notifier(which: Callable[[str], str | None] = shutil.which,
             platform: str = sys.platform) -> Callable[[str, str], list[str]] | None:
    """How this host shows a desktop notification (title, text -> argv), or None where it has no notifier.
    The words go in as arguments, never into a script or a shell."""
    if platform == "darwin" and (osascript := which("osascript")):
        script = ["-e", "on run argv", "-e", "display notification (item 2 of argv) with title (item 1 of argv)",
                  "-e", "end run"]
        return lambda title, text: [osascript, *script, title, text]
    if notify_send := which("notify-send"):
        # A freedesktop notification's body is markup: a path's <b> or &#8238; (which reverses what follows)
        # would be read as such. The bottle chose those words, so they are shown as written.
        return lambda title, text: [notify_send, "--app-name=claude-bottle", "--", title, html.escape(text, False)]
    return None


def notify(argv: list[str]) -> None:
    """Run a notifier, best effort: whatever goes wrong is ignored."""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       timeout=NOTIFY_SECONDS, check=False)


class Watcher:
    """A run's questions, each notified and given to the hook, in threads of this process; ``close`` ends it.

    ``say`` hears what the user must know (a hook that failed, a decision the gate refused); ``agent`` is the
    agent's name (for the notification's command and the hook), ``hook`` its ``ask_command`` (empty: none),
    ``timeout`` the gate's ask timeout, ``desktop`` the notifier (``notifier()``; None: none)."""

    def __init__(self, channel: Channel, run: str, agent: str, hook: tuple[str, ...], timeout: float,
                 desktop: Callable[[str, str], list[str]] | None, say: Say) -> None:
        self.channel, self.run, self.agent, self.hook, self.timeout = channel, run, agent, hook, timeout
        self.desktop, self.say = desktop, say
        self.pool = ThreadPoolExecutor(MAX_HOOKS, thread_name_prefix="ask")
        self.closing = threading.Event()
        # What is kept of a question goes once it is decided: a bottle asks as often as it likes, for as long as
        # the run lasts (a question it withdraws, it asks again).
        self.seen: set[str] = set()  # asked and not decided yet (a watch's first lines repeat what is pending)
        self.hooked: set[str] = set()  # handed to the hook, and not through it yet
        self.decided: set[str] = set()  # of those, answered or withdrawn meanwhile: a hook not yet run is not run
        self.questions = threading.Lock()  # the three sets, between the watch's thread and the hooks'
        self.notified: deque[float] = deque(maxlen=MAX_NOTIFICATIONS)  # when the last notifications went out
        self.lock = threading.Lock()  # between starting a watch and closing
        self.hooks: set[subprocess.Popen[bytes]] = set()  # running
        self.watch: WatchProcess | None = None
        self.thread = threading.Thread(target=self._watch, name="ask-watch", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def close(self) -> None:
        """Stop watching; a hook still running is killed (no gate takes its answer now, and this process would
        wait for it at its exit)."""
        self.closing.set()
        with self.lock:
            watch = self.watch
        if watch is not None:
            watch.stop()
        self.thread.join(timeout=2.0)
        self.pool.shutdown(wait=False, cancel_futures=True)
        for process in list(self.hooks):
            kill_hook(process)

    def _watch(self) -> None:
        """Watch until closed. A watch that ends (at start the gate may not listen yet; a gate drops a watcher
        that falls behind) is started again after ``RESTART_SECONDS``, up to ``MAX_RESTARTS`` times in a row
        without an event between; then the user is told."""
        failures, why = 0, ""
        while failures <= MAX_RESTARTS:
            with self.lock:
                if self.closing.is_set():
                    return
                try:
                    self.watch = watch = WatchProcess(self.channel)
                except OSError as exc:
                    why = str(exc)
                    break
            for event in watch.lines():
                failures = 0
                if self.closing.is_set():
                    return
                if event["event"] == "asked" and (asked := Asked.from_fields(event)) is not None:
                    self.asked(asked)
                elif event["event"] == "decided":
                    self.settled(str(event.get("id")))
            why = watch.why_ended()
            failures += 1
            if self.closing.wait(RESTART_SECONDS):
                return
        self.say(f"ask: the gate's questions are no longer watched here ({why}); "
                 f"`{approve_command(self.agent, self.run)}` still answers them")

    def asked(self, asked: Asked) -> None:
        """A new question: notify, and hand it to the hook. A question seen before (the watch's first lines
        repeat what is pending) is not handled twice."""
        with self.questions:
            if asked.id in self.seen:
                return
            self.seen.add(asked.id)
            if self.hook:
                self.hooked.add(asked.id)
        now = time.monotonic()
        if self.desktop is not None and (len(self.notified) < MAX_NOTIFICATIONS
                                         or now - self.notified[0] >= NOTIFY_WINDOW):
            self.notified.append(now)
            argv = self.desktop("claude-bottle: allow?",
                                f"{asked.summary()}: {approve_command(self.agent, self.run)}")
            self.pool.submit(notify, argv)
        if self.hook:
            self.pool.submit(self._ask_hook, asked)

    def settled(self, question: str) -> None:
        """``question`` was answered or withdrawn: forgotten, but for a hook still to run for it, which is not."""
        with self.questions:
            self.seen.discard(question)
            if question in self.hooked:
                self.decided.add(question)

    def _ask_hook(self, asked: Asked) -> None:
        try:
            with self.questions:
                if asked.id in self.decided or self.closing.is_set():
                    return
            self._run_hook(asked)
        finally:
            with self.questions:
                self.hooked.discard(asked.id)
                self.decided.discard(asked.id)

    def _run_hook(self, asked: Asked) -> None:
        seconds = max(1.0, self.timeout - asked.waited)
        answer, why = run_hook(self.hook, asked.description(self.run, self.agent, self.timeout), seconds, self.hooks)
        if self.closing.is_set():
            return
        if why:
            self.say(f"ask: the hook for {asked.summary()} {why}: denied")
        if answer is None:
            return
        try:
            reply = self.channel.decide(asked.id, answer, "hook")
        except (OSError, ValueError, BottleError) as exc:
            self.say(f"ask: the hook's {answer} for {asked.summary()} did not reach the gate ({exc})")
            return
        if not reply.get("ok"):
            self.say(f"ask: the gate refused the hook's {answer} for {asked.summary()}: "
                     f"{reply.get('error', 'no reason given')}")


def approve_command(agent: str, run: str) -> str:
    """The command that answers the run's questions on a terminal: by its id, as runs of one agent on one
    workspace at once (parallel Agent SDK queries) each ask their own."""
    return " ".join(["claude-bottle approve", *([agent] if agent else []), "--run", run])


def where_answered(agent: str, run: str, hook: tuple[str, ...], desktop: bool) -> str:
    """The line a run in ask mode says at start: where its questions are answered."""
    places = [f"`{approve_command(agent, run)}` in another terminal"]
    if hook:
        places.insert(0, f"the hook {printable(' '.join(hook), 80)}")
    if desktop:
        places.append("(desktop notifications on)")
    return ("ask mode: a destination outside the allowlist waits for an answer from " + ", then ".join(places[:2])
            + (f" {places[2]}" if len(places) > 2 else "") + "; unanswered, it is refused at the ask timeout")


@contextlib.contextmanager
def watching(engine: Engine, gate: ContainerInfo, hook: tuple[str, ...], timeout: float, say: Say,
             desktop: Callable[[str, str], list[str]] | None = None) -> Iterator[Watcher]:
    """Watch the run's gate for the length of the block (``Watcher``), having said where questions are
    answered."""
    channel = GateChannel(engine, gate)
    say(where_answered(channel.agent, channel.run, hook, desktop is not None))
    watcher = Watcher(channel, channel.run, channel.agent, hook, timeout, desktop, say)
    watcher.start()
    try:
        yield watcher
    finally:
        watcher.close()
