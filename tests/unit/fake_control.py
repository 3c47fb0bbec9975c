"""A fake of a gate's ask channel for the host's side of ask mode: a watch process that prints given events
(then, like the gate's, waits for its standard input to close), and decisions recorded in memory."""

from __future__ import annotations

import json
import sys
import threading
from dataclasses import dataclass, field
from typing import Any

from claude_bottle.runtime.ask_watch import Asked

# Prints each argument (a JSON event) as a line, then reads standard input to its end, as the gate's watch does.
WATCH_SCRIPT = "import sys\nfor a in sys.argv[1:]:\n    print(a, flush=True)\nsys.stdin.read()\n"
# The same, ended by the gate after its events (as when it drops a watcher that fell behind).
DROPPED_SCRIPT = "import sys\nfor a in sys.argv[1:]:\n    print(a, flush=True)\nsys.exit(1)\n"


def asked(question: str, host: str, port: int = 443, **more: Any) -> dict[str, Any]:
    return {"event": "asked", "id": question, "host": host, "port": port, "kind": "connect", "method": None,
            "path": None, "waited": 0.0, "waiting": 1, **more}


@dataclass
class FakeChannel:
    """``events`` printed by its watch; each ``decide`` recorded as (id, answer, by) and answered ``reply``."""

    events: list[dict[str, Any]]
    reply: dict[str, Any] = field(default_factory=lambda: {"ok": True, "message": "decided", "entry": "x:443"})
    decided: list[tuple[str, str, str]] = field(default_factory=list)
    done: threading.Event = field(default_factory=threading.Event)
    expected: int = 1

    def watch_command(self) -> list[str]:
        return [sys.executable, "-c", WATCH_SCRIPT, *(json.dumps(e) for e in self.events)]

    def pending(self) -> list[Asked]:
        """The questions in ``events`` not yet decided here."""
        answered = {question for question, _, _ in self.decided}
        found = (Asked.from_fields(e) for e in self.events if e.get("event") == "asked")
        return [a for a in found if a is not None and a.id not in answered]

    def decide(self, question: str, answer: str, by: str) -> dict[str, Any]:
        self.decided.append((question, answer, by))
        if len(self.decided) >= self.expected:
            self.done.set()
        return dict(self.reply, entry=next((f"{e['host']}:{e['port']}" for e in self.events
                                            if e.get("id") == question), "x:443"))
