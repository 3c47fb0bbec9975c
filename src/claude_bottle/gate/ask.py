"""Ask mode: a proxy request to a destination outside the allowlist is held while the host decides.

The gate holds the request (``Asks.ask``) after every check that applies before asking (the API host,
credential hosts, the run's denied entries, and the address guard for an IP address: these are refused, never
asked; a name is looked up only once allowed, gate/proxy.py) and asks one question per pending target:
requests to the same ``host:port`` share it, whatever their kind. The host answers through the control
channel (gate/control.py: ``pending``, ``watch``, ``decide``); only the host can reach it. An answer acts on
the run's policy before the held requests go on, so they and every later request to the target are decided
by it:

- ``allow-once`` / ``allow-always``: the target joins the run's allowlist (as the ``allow`` operation does);
  "once" is this run, "always" is the same here and the host also writes it to the agent's file.
- ``deny-once`` / ``deny-always``: the target is refused for the rest of the run (as ``deny`` does).
- No answer within the timeout: this question's requests are refused with a reason saying the approval
  timed out, and the policy is unchanged: a later request asks again.
- More than ``limit`` questions pending: a new target is refused at once with a reason, never held.

Nothing here blocks: a held request is one awaited future, so the API route is never slowed by asks.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from claude_bottle.gate.control import ControlError
from claude_bottle.policy.hosts import Target

ALLOW_ONCE: Final = "allow-once"
ALLOW_ALWAYS: Final = "allow-always"
DENY_ONCE: Final = "deny-once"
DENY_ALWAYS: Final = "deny-always"
ANSWERS: Final = (ALLOW_ONCE, ALLOW_ALWAYS, DENY_ONCE, DENY_ALWAYS)
# Who answered, when the gate did itself: nobody in time, or too many questions already pending.
BY_TIMEOUT: Final = "timeout"
BY_LIMIT: Final = "limit"
BY_GONE: Final = "gone"  # every request it held went away before an answer: the question is withdrawn
MAX_BY = 40  # characters of a decider's name ("terminal", "hook", "notification", or short text)

DEFAULT_TIMEOUT = 60.0
ASK_TIMEOUT_BOUNDS = (1.0, 86_400.0)  # seconds a question may wait, as --ask-timeout and ask_timeout take it
DEFAULT_LIMIT = 16
MAX_WATCHERS = 4  # watchers at once; one more is refused
WATCH_BACKLOG = 256  # events queued for a watcher that does not read; past it the watcher is dropped

Kind = Literal["connect", "http"]


class AskError(ControlError):
    """A decision the gate cannot take (unknown question, unknown answer); the message says why."""


@dataclass(frozen=True)
class Answer:
    """How a question ended: one of ``ANSWERS`` (a timeout or the limit: ``deny-once``), and who gave it."""

    answer: str
    by: str
    waited: float = 0.0  # seconds the question was pending

    @property
    def allow(self) -> bool:
        return self.answer in (ALLOW_ONCE, ALLOW_ALWAYS)


@dataclass
class Question:
    """One pending target and the requests held for it. ``method`` and ``path`` are the first plain-HTTP
    request's (None for a CONNECT)."""

    id: str
    target: Target
    kind: Kind
    method: str | None
    path: str | None
    client: str  # the first held request's peer, for the audit
    asked: float = field(default_factory=time.monotonic)
    waiting: int = 0
    answered: asyncio.Future[Answer] = field(default_factory=lambda: asyncio.get_running_loop().create_future())

    def fields(self) -> dict[str, Any]:
        """The question as the control channel shows it (``pending``, and ``asked`` events)."""
        return {"id": self.id, "host": self.target.host, "port": self.target.port, "kind": self.kind,
                "method": self.method, "path": self.path, "waited": round(time.monotonic() - self.asked, 1),
                "waiting": self.waiting}


class Asks:
    """The run's pending questions. ``timeout``: seconds a question waits for an answer; ``limit``: questions
    pending at once. ``asked(question)`` is called when a question is asked (to audit it);
    ``decided(question, answer)`` when it ends, by the host or by the gate, before its requests go on: it
    applies the answer to the policy (not a timeout's nor a withdrawal's) and audits it."""

    def __init__(self, timeout: float, limit: int, asked: Callable[[Question], None],
                 decided: Callable[[Question, Answer], None]) -> None:
        self.timeout = timeout
        self.limit = limit
        self._asked = asked
        self._decided = decided
        self._pending: dict[tuple[str, int], Question] = {}
        self._ids = itertools.count(1)
        self._watchers: set[asyncio.Queue[dict[str, Any] | None]] = set()

    def question(self, target: Target, kind: Kind, client: str, method: str | None = None, path: str | None = None
                 ) -> Question | None:
        """The pending question for ``target``, asked now if there is none; None if ``limit`` questions are
        already pending (the request is then refused at once)."""
        key = (target.host, target.port)
        existing = self._pending.get(key)
        if existing is not None:
            return existing
        if len(self._pending) >= self.limit:
            return None
        question = Question(str(next(self._ids)), target, kind, method, path, client)
        self._pending[key] = question
        self._asked(question)
        self._publish({"event": "asked", **question.fields()})
        return question

    async def wait(self, question: Question) -> Answer:
        """Hold one request until ``question`` is answered, or until the timeout (then it is answered
        ``deny-once`` by ``timeout`` for every request it holds)."""
        question.waiting += 1
        try:
            remaining = question.asked + self.timeout - time.monotonic()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(remaining, 0)):
                    return await asyncio.shield(question.answered)
            if not question.answered.done():
                self._end(question, Answer(DENY_ONCE, BY_TIMEOUT, self.timeout))
            return question.answered.result()
        finally:
            question.waiting -= 1
            if question.waiting == 0 and not question.answered.done():
                # Every held request went away (a client gone, the gate stopping): nobody is left to ask for.
                self._end(question, Answer(DENY_ONCE, BY_GONE, round(time.monotonic() - question.asked, 1)))

    def pending(self) -> list[dict[str, Any]]:
        """The pending questions, oldest first, as the control channel shows them."""
        return [question.fields() for question in self._pending.values()]

    def decide(self, question_id: str, answer: str, by: str) -> Question:
        """Answer the pending question ``question_id``: its requests go on as the answer says. AskError for
        an unknown answer or a question that is not pending (answered, timed out, or never asked)."""
        if answer not in ANSWERS:
            raise AskError(f"unknown answer {answer!r} (known: {', '.join(ANSWERS)})")
        by = by.strip()
        if not by or len(by) > MAX_BY or not by.isprintable():
            raise AskError(f'"by" names who decided ("terminal", "hook", "notification"), at most {MAX_BY} '
                           "printable characters")
        question = next((q for q in self._pending.values() if q.id == question_id), None)
        if question is None:
            raise AskError(f"no pending question {question_id!r} (answered, timed out, or never asked)")
        self._end(question, Answer(answer, by, round(time.monotonic() - question.asked, 1)))
        return question

    def _end(self, question: Question, answer: Answer) -> None:
        self._pending.pop((question.target.host, question.target.port), None)
        try:
            self._decided(question, answer)  # the policy changes before any held request goes on
        finally:
            # Even if the policy could not take the answer (an entry the allowlist refuses): the held requests
            # go on, and are decided by the policy as it is, which refuses them.
            question.answered.set_result(answer)
            self._publish({"event": "decided", "id": question.id, "answer": answer.answer, "by": answer.by})

    @contextlib.asynccontextmanager
    async def watch(self) -> AsyncIterator[asyncio.Queue[dict[str, Any] | None]]:
        """Events from now on, first an ``asked`` event for each pending question; None in the queue ends
        the watch (the watcher fell too far behind). AskError if ``MAX_WATCHERS`` already watch."""
        if len(self._watchers) >= MAX_WATCHERS:
            raise AskError(f"at most {MAX_WATCHERS} watchers at once")
        queue: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue(WATCH_BACKLOG + 1)
        for fields in self.pending():
            queue.put_nowait({"event": "asked", **fields})
        self._watchers.add(queue)
        try:
            yield queue
        finally:
            self._watchers.discard(queue)

    def close(self) -> None:
        """End every watch (the gate is stopping): a watcher's connection must not hold the stop up."""
        for queue in self._watchers:
            with contextlib.suppress(asyncio.QueueFull):
                queue.put_nowait(None)
        self._watchers.clear()

    def _publish(self, event: dict[str, Any]) -> None:
        for queue in list(self._watchers):
            if queue.qsize() >= WATCH_BACKLOG:
                self._watchers.discard(queue)
                queue.put_nowait(None)  # the one slot kept free for this
            else:
                queue.put_nowait(event)
