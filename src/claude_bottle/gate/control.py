"""The gate's control channel: the host changes the allowlist while the gate runs.

The channel is a unix socket in the gate's own file system (``--control-socket``, mode 0600, owned by the
gate's user), never a TCP listener: nothing on any network reaches it, and a bottle, which shares no file
system with its gate, cannot open it. The host reaches it through the container engine, running this
module inside the gate container (``docker exec``: ``python -m claude_bottle.gate.control SOCKET OP [ENTRY]``),
which only whoever holds the engine can do.

One request per connection, one JSON line each way:

    {"op": "allow" | "deny" | "show", "entry": "host[:port]"}
    {"ok": true, "message": "...", "policy": {...}}   or   {"ok": false, "error": "..."}

``allow`` adds an allowlist entry (patterns as ``--allow`` takes them) and lifts a ``deny`` of the same
entry; ``deny`` removes the entry from the allowlist and refuses what it matches from then on, even what a
wider pattern or learn mode would let through. Tunnels already open are not cut. Each change is an audit
line (listener ``control``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import errno
import json
import os
import socket
import stat
import sys
from pathlib import Path
from typing import Any

from claude_bottle.policy.decide import Decision, EgressPolicy
from claude_bottle.policy.hosts import Allowlist, InvalidHost, parse_pattern

MAX_REQUEST = 4096
TIMEOUT = 5.0
OPERATIONS = ("allow", "deny", "show")


class ControlError(ValueError):
    """A control request that cannot be applied; the message says why."""


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


def parse_request(line: bytes) -> tuple[str, str]:
    """``(op, entry)`` of a request line; ControlError if it is not one."""
    try:
        request = json.loads(line)
    except (ValueError, RecursionError):  # RecursionError: nesting deeper than the parser's stack
        raise ControlError("a request is one JSON object on one line") from None
    if not isinstance(request, dict) or not isinstance(request.get("op"), str) \
            or not isinstance(request.get("entry", ""), str):
        raise ControlError('a request is {"op": "allow" | "deny" | "show", "entry": "host[:port]"}')
    return request["op"], request.get("entry", "")


async def serve(path: Path, handle: Any) -> asyncio.Server:
    """Listen on the unix socket ``path`` (replacing a stale socket, never another kind of file), readable
    and writable by this user only. ``handle(op, entry)`` returns the reply's fields or raises ControlError."""
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
            reply = {"ok": True, **handle(*parse_request(line))}
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


def request(path: Path, op: str, entry: str = "") -> dict[str, Any]:
    """Send one request to the control socket at ``path``; the reply (OSError if it cannot be reached)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(TIMEOUT)
        sock.connect(str(path))
        sock.sendall(json.dumps({"op": op, "entry": entry}).encode() + b"\n")
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


def main(argv: list[str]) -> int:
    """``python -m claude_bottle.gate.control SOCKET OP [ENTRY]``: print the reply; exit 0 if it applied."""
    if len(argv) not in (2, 3):
        print("usage: python -m claude_bottle.gate.control SOCKET allow|deny|show [HOST[:PORT]]", file=sys.stderr)
        return 2
    try:
        reply = request(Path(argv[0]), argv[1], argv[2] if len(argv) == 3 else "")
    except (OSError, ValueError) as exc:
        reply = {"ok": False, "error": f"cannot reach the gate's control socket {argv[0]}: {exc}"}
    print(json.dumps(reply))
    return 0 if reply.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
