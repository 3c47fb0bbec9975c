"""The gate's control channel: the host changes the allowlist while the gate runs, and answers ask mode.

The channel is a unix socket in the gate's own file system (``--control-socket``, mode 0600, owned by the
gate's user), never a TCP listener: nothing on any network reaches it, and a bottle, which shares no file
system with its gate, cannot open it. The host reaches it through the container engine, running this
module inside the gate container (``docker exec``: ``python -m claude_bottle.gate.control SOCKET OP ...``),
which only whoever holds the engine can do.

One request per connection, one JSON line; one JSON line back, except for ``watch``:

    {"op": "allow" | "deny" | "show", "entry": "host[:port]"}
        -> {"ok": true, "message": "...", "policy": {...}}
    {"op": "pending"}
        -> {"ok": true, "pending": [{"id": "3", "host": "...", "port": 443, "kind": "connect" | "http",
                                     "method": "GET" | null, "path": "/x" | null, "waited": 3.2, "waiting": 2}]}
    {"op": "watch"}
        -> one line per event while the client keeps the connection open: first {"event": "asked", <pending
           fields>} for each pending question, then {"event": "asked", ...} and {"event": "decided", "id": ...,
           "answer": ..., "by": ...} as they happen (at most a few watchers at once)
    {"op": "decide", "id": "3", "answer": "allow-once" | "allow-always" | "deny-once" | "deny-always",
     "by": "terminal" | "hook" | "notification" | "<short text>"}
        -> {"ok": true, "message": "...", "entry": "host:port", "policy": {...}} (the policy the answer left:
           every answer acts on the run's policy, gate/ask.py)
    any error -> {"ok": false, "error": "..."}

``allow`` adds an allowlist entry (patterns as ``--allow`` takes them) and lifts a ``deny`` of the same
entry; ``deny`` removes the entry from the allowlist and refuses what it matches from then on, even what a
wider pattern or learn mode would let through. Tunnels already open are not cut. Each change is an audit
line (listener ``control``). ``pending``, ``watch`` and ``decide`` are ask mode's (gate/ask.py): a gate
without ``--ask`` answers them with an error.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import errno
import json
import os
import selectors
import socket
import stat
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from claude_bottle.policy.decide import Decision, EgressPolicy
from claude_bottle.policy.hosts import Allowlist, InvalidHost, parse_pattern

MAX_REQUEST = 4096
TIMEOUT = 5.0
OPERATIONS = ("allow", "deny", "show")  # the policy's operations (``apply``)
ASK_OPERATIONS = ("pending", "watch", "decide")  # ask mode's (gate/ask.py)
WATCH_WRITE_TIMEOUT = 5.0  # a watcher that stops reading for this long is dropped


class ControlError(ValueError):
    """A control request that cannot be applied; the message says why."""


@dataclasses.dataclass(frozen=True)
class ControlRequest:
    """One request: ``op`` and the fields it takes (``entry`` for the policy's operations; ``id``, ``answer``
    and ``by`` for ``decide``); a field a request leaves out is ""."""

    op: str
    entry: str = ""
    id: str = ""
    answer: str = ""
    by: str = ""


# What a handler returns: the reply's fields, or for ``watch`` the events to stream (None in the queue ends it).
Events = contextlib.AbstractAsyncContextManager["asyncio.Queue[dict[str, Any] | None]"]
Handler = Callable[[ControlRequest], "dict[str, Any] | Events"]


@dataclasses.dataclass(frozen=True)
class Change:
    """What a control request did: the policy in effect after it; ``decision``, the change as the audit
    records it (the entry allowed or refused from now on, with the reason), None for ``show``, which changes
    nothing; ``message``, the reply's sentence ("allowed pypi.org", "denied pypi.org")."""

    policy: EgressPolicy
    message: str
    decision: Decision | None = None


def apply(policy: EgressPolicy, op: str, entry: str) -> Change:
    """The policy after ``op`` on ``entry``, and the decision it amounts to. Pure; ControlError for an
    unknown operation, a pattern the allowlist refuses, or the API upstream's host."""
    if op == "show":
        return Change(policy, "the policy in effect")
    if op not in OPERATIONS:
        raise ControlError(f"unknown operation {op!r} (known: {', '.join(OPERATIONS)})")
    try:
        pattern = parse_pattern(entry)
    except InvalidHost as exc:
        raise ControlError(str(exc)) from None
    if pattern.host in policy.protected_hosts:
        raise ControlError(f"{pattern.host} is the API upstream: the bottle reaches it through the gate's API "
                           "route only, never through the proxy")
    allowed = tuple(p for p in policy.allowlist.patterns if p != pattern)
    denied = tuple(p for p in policy.denied.patterns if p != pattern)
    if op == "allow":
        changed = dataclasses.replace(policy, allowlist=Allowlist((*allowed, pattern)), denied=Allowlist(denied))
        message = f"allowed {pattern}"
    else:
        changed = dataclasses.replace(policy, allowlist=Allowlist(allowed), denied=Allowlist((*denied, pattern)))
        message = f"denied {pattern}"
    return Change(changed, message, Decision(op == "allow", f"the user {message} while the gate runs"))


def parse_request(line: bytes) -> ControlRequest:
    """The request on a line; ControlError if it is not one."""
    try:
        request = json.loads(line)
    except (ValueError, RecursionError):  # RecursionError: nesting deeper than the parser's stack
        raise ControlError("a request is one JSON object on one line") from None
    names = ("entry", "id", "answer", "by")
    if not isinstance(request, dict) or not isinstance(request.get("op"), str) \
            or not all(isinstance(request.get(name, ""), str) for name in names):
        raise ControlError('a request is {"op": "allow" | "deny" | "show", "entry": "host[:port]"}, {"op": '
                           '"pending" | "watch"} or {"op": "decide", "id": "...", "answer": "...", "by": "..."}')
    return ControlRequest(request["op"], **{name: request.get(name, "") for name in names})


async def serve(path: Path, handle: Handler) -> asyncio.Server:
    """Listen on the unix socket ``path`` (replacing a stale socket, never another kind of file), readable
    and writable by this user only. ``handle(request)`` returns the reply's fields, or the events to stream
    until the client closes (``watch``), or raises ControlError."""
    with contextlib.suppress(FileNotFoundError):
        if not stat.S_ISSOCK(os.lstat(path).st_mode):
            raise FileExistsError(errno.EEXIST, "exists and is not a socket")
        os.unlink(path)

    async def one(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(TIMEOUT):
                line = await reader.readline()
            if len(line) > MAX_REQUEST:
                raise ControlError(f"a request is at most {MAX_REQUEST} bytes")
            handled = handle(parse_request(line))
            if not isinstance(handled, dict):
                async with handled as events:
                    await _stream(reader, writer, events)
                writer.close()
                return
            reply = {"ok": True, **handled}
        except ControlError as exc:
            reply = {"ok": False, "error": str(exc)}
        except (TimeoutError, ValueError, OSError):
            reply = {"ok": False, "error": "no complete request line"}
        with contextlib.suppress(OSError):
            writer.write(json.dumps(reply).encode() + b"\n")
            await writer.drain()
            writer.close()

    previous = os.umask(0o177)
    try:
        server = await asyncio.start_unix_server(one, str(path), limit=MAX_REQUEST * 2)
    finally:
        os.umask(previous)
    os.chmod(path, 0o600)
    return server


async def _stream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                  events: asyncio.Queue[dict[str, Any] | None]) -> None:
    """Write ``events`` one line each until the client closes its side (or sends anything else: a watch
    takes no more requests), the events end (None), or the client stops reading."""
    closed = asyncio.ensure_future(reader.read(1))
    try:
        while True:
            event = asyncio.ensure_future(events.get())
            await asyncio.wait((event, closed), return_when=asyncio.FIRST_COMPLETED)
            if closed.done():
                event.cancel()
                return
            line = event.result()
            if line is None:
                return
            writer.write(json.dumps(line).encode() + b"\n")
            async with asyncio.timeout(WATCH_WRITE_TIMEOUT):
                await writer.drain()
    except (OSError, TimeoutError):
        return
    finally:
        closed.cancel()


def _connect(path: Path, fields: dict[str, str]) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(TIMEOUT)
        sock.connect(str(path))
        sock.sendall(json.dumps(fields).encode() + b"\n")
    except OSError:
        sock.close()
        raise
    return sock


def request(path: Path, op: str, entry: str = "", **fields: str) -> dict[str, Any]:
    """Send one request to the control socket at ``path`` (``fields``: ``decide``'s ``id``, ``answer`` and
    ``by``); the reply (OSError if it cannot be reached)."""
    with _connect(path, {"op": op, "entry": entry, **fields}) as sock:
        data = b""
        while not data.endswith(b"\n"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    reply = json.loads(data)
    if not isinstance(reply, dict):
        raise ValueError("the gate's reply is not a JSON object")
    return reply


def watch(path: Path, out: TextIO, stdin_fd: int = 0) -> int:
    """Stream the gate's ask events to ``out``, one JSON line each, until standard input (``stdin_fd``)
    closes (0) or the gate ends the stream or refuses it (1). The host runs it with standard input held open
    (``docker exec -i``) and ends it by closing that, or by killing it."""
    with _connect(path, {"op": "watch"}) as sock, selectors.DefaultSelector() as selector:
        sock.settimeout(None)
        selector.register(sock, selectors.EVENT_READ)
        selector.register(stdin_fd, selectors.EVENT_READ)
        pending = b""
        while True:  # bounded by the two ends: each pass reads from one of them, and an end returns
            for key, _ in selector.select():
                if key.fileobj == stdin_fd:
                    if not os.read(stdin_fd, 4096):
                        return 0
                    continue
                chunk = sock.recv(65536)
                if not chunk:
                    return 1
                lines = (pending + chunk).split(b"\n")
                pending = lines.pop()
                for line in lines:
                    out.write(line.decode() + "\n")
                out.flush()


USAGE = ("usage: python -m claude_bottle.gate.control SOCKET allow|deny|show [HOST[:PORT]]\n"
         "       python -m claude_bottle.gate.control SOCKET pending\n"
         "       python -m claude_bottle.gate.control SOCKET watch        (until standard input closes)\n"
         "       python -m claude_bottle.gate.control SOCKET decide ID allow-once|allow-always|deny-once|deny-always "
         "[BY]")


def main(argv: list[str]) -> int:
    """``python -m claude_bottle.gate.control SOCKET OP [ARGS]``: print the reply (``watch``: the events, one
    line each); exit 0 if it applied, 1 if not, 2 for a wrong command line."""
    op, args = (argv[1], argv[2:]) if len(argv) >= 2 else ("", [])
    while args and not args[-1]:
        args.pop()  # an empty ENTRY, as callers that always pass one send it, is no argument
    fields: dict[str, str]
    if op in ("allow", "deny", "show") and len(args) <= 1:
        fields = {"entry": args[0] if args else ""}
    elif op in ("pending", "watch") and not args:
        fields = {}
    elif op == "decide" and len(args) in (2, 3):
        fields = {"id": args[0], "answer": args[1], "by": args[2] if len(args) == 3 else "host"}
    else:
        print(USAGE, file=sys.stderr)
        return 2
    try:
        if op == "watch":
            return watch(Path(argv[0]), sys.stdout)
        reply = request(Path(argv[0]), op, **fields)
    except (OSError, ValueError) as exc:
        reply = {"ok": False, "error": f"cannot reach the gate's control socket {argv[0]}: {exc}"}
    print(json.dumps(reply))
    return 0 if reply.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
