"""One JSON line per gate decision, with fixed field names (see docs/gate.md's audit section).

The record is assembled here and rendered here, from fields: what a reader needs to know (the decision, the
rule, ``would_deny``, ``unlisted``, a tunnel's mode, a failure's side) is a field of its own, and the reason
is words for people, built from the decisions' reasons and never parsed back (``policy suggest`` and ``logs``
read fields only).

A request to a remote MCP server is followed by one line per JSON-RPC message in it (a batch's too): listener
``mcp``, the JSON-RPC method as ``method``, with ``server`` and ``tool``; its decision is the message's own,
except that a message allowed in a request that was refused was not sent, and says so.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Final, Literal, TextIO

from claude_bottle.policy.decide import Decision, RpcCall

REDACTED = "[redacted]"

# The line's format (the ``version`` field, first on every line). A line without it is from a gate before
# it, whose facts may be in the reason only: records.py's ``current`` reads those. Raise it when a field's
# meaning changes, and teach ``current`` to read the older lines.
VERSION: Final = 2

# A tunnel's mode (the ``tunnel`` field), set once the gate has chosen how to carry a CONNECT (after its name
# and address checks): also on one refused for that mode, or failed before or after its 200.
OPAQUE: Final = "opaque"  # TLS relayed unread, its ClientHello checked
RAW_TCP: Final = "raw_tcp"  # any bytes relayed unread: raw TCP is allowed to the target
TERMINATED: Final = "terminated"  # TLS terminated by the gate, each request inside audited on a line of its own
TunnelMode = Literal["opaque", "raw_tcp", "terminated"]

MCP: Final = "mcp"  # the listener of a JSON-RPC message's line, written after its request's

# Whose side a failure was on (the ``side`` field of an ``error`` line); none: a fault of the gate's own.
CLIENT: Final = "client"
UPSTREAM: Final = "upstream"
Side = Literal["client", "upstream"]


@dataclass
class AuditRecord:
    """A decision and what came of it. ``path`` is set where the gate reads requests, never with a query.
    Set through the decision methods below and, for a refusal or a failure, by gate/refusals.py's ``answer``
    (``deny``, ``fail``); the forward and tunnel paths add status, bytes and the tunnel's mode."""

    listener: str  # "api", "proxy", "control", or "ask" (a question asked of the host, and its answer)
    client: str  # peer host:port
    method: str
    target: str  # host:port
    # "allow", "deny" (refused), "error" (a side failed the exchange, or the gate), or on an ask line "ask"
    # (a question asked: its requests are held until its answer's line)
    decision: str = "deny"
    reason: str = ""
    status: int = 0  # HTTP status sent to the client; 0 if the connection closed before one was sent
    path: str | None = None
    rule: str | None = None  # the configured rule that decided (an [[egress]] rule, a [dlp] rule), if one did
    would_deny: bool = False  # let through by learn mode only: a gate without it would have refused this
    unlisted: bool = False  # the target is in no allowlist (refused for that, or let through by learn mode)
    tunnel: TunnelMode | None = None  # a CONNECT past its name and address checks: how its bytes are carried
    side: Side | None = None  # an error: whose side failed (None: the gate's own fault, or no error)
    calls: tuple[RpcCall, ...] = ()  # the JSON-RPC messages in a request to an MCP server: a line each
    # Ask mode (gate/ask.py): the question a request was held for, its answer ("allow-once", ..., "deny-once"
    # for a timeout or the limit) and who gave it ("terminal", "hook", ..., "timeout", "limit", "gone").
    ask: str | None = None
    answer: str | None = None
    by: str | None = None
    bytes_up: int = 0  # client -> upstream, body or tunnel bytes
    bytes_down: int = 0  # upstream -> client
    started: float = field(default_factory=time.time)

    def decided(self, decision: Decision) -> None:
        """The first verdict on the request: allowed or refused, with its reason, rule and whether learn mode
        or a missing allowlist entry made it."""
        self.decision = "allow" if decision.allow else "deny"
        self.reason = decision.reason
        self.rule = decision.rule or None
        self.would_deny = decision.learned
        self.unlisted = decision.unlisted
        self.calls = self.calls or decision.calls

    def passed(self, decision: Decision) -> None:
        """A further check allowed the request: its reason follows the earlier ones; its rule, if it named
        one, is the rule that decided."""
        self.decision = "allow"
        self.reason = f"{self.reason}; {decision.reason}" if self.reason else decision.reason
        if decision.rule:
            self.rule = decision.rule
        self.calls = self.calls or decision.calls

    def note(self, what: str) -> None:
        """Add what came of an allowed exchange (how a tunnel was carried, how it ended) to the reason."""
        self.reason = f"{self.reason}; {what}" if self.reason else what

    def deny(self, reason: str, status: int, rule: str | None = None, unlisted: bool = False) -> None:
        """Refused for ``reason``. Once the client was answered (a tunnel's 200), that status stays and the
        earlier reasons too: the refusal came after them."""
        self.decision, self.rule, self.unlisted = "deny", rule, unlisted
        if self.status:
            self.reason = f"{self.reason}; then refused: {reason}"
        else:
            self.reason, self.status = reason, status

    def fail(self, reason: str, status: int, side: Side | None = None) -> None:
        """Allowed (or not yet decided, e.g. while a body is read), then failed on ``side``. A status already
        sent to the client stays: it is what the client saw."""
        self.decision, self.reason = "error", f"{self.reason}; then {reason}" if self.reason else reason
        self.status = self.status or status
        self.side = side


class AuditLog:
    """Writes records to a text stream, each line numbered (``seq``, from 1): where a log was cut short by its
    size (the engine's cap and the host's keep the newest lines, and a bottle chooses how many it makes), the
    first line kept says how many went before it. Any occurrence of a secret is replaced before writing: the
    audit never carries one, whatever a caller passes in."""

    def __init__(self, stream: TextIO | None, secrets: tuple[str, ...] = ()) -> None:
        self._stream = stream
        self._secrets = tuple(s for s in secrets if s)
        self._written = 0

    def write(self, record: AuditRecord) -> None:
        """The request's line, then one line per JSON-RPC message in it."""
        if self._stream is None:
            return
        self._written += 1
        self._stream.write(self._line(_request_fields(record, self._written)))
        for call in record.calls:
            self._written += 1
            self._stream.write(self._line(_call_fields(record, call, self._written)))
        self._stream.flush()

    def _line(self, fields: dict[str, object]) -> str:
        line = json.dumps(fields, ensure_ascii=False)
        for secret in self._secrets:
            if secret in line:
                line = line.replace(secret, REDACTED)
        return line + "\n"


def _request_fields(record: AuditRecord, seq: int) -> dict[str, object]:
    started = record.started
    # The fields in their fixed order; the optional ones only when set. (Built by hand: dataclasses.asdict
    # deep-copies every field, and this runs for every request.)
    fields: dict[str, object] = {
        "version": VERSION, "seq": seq,
        "time": _time(started),
        "listener": record.listener, "client": record.client, "method": record.method, "target": record.target,
        "decision": record.decision, "reason": record.reason, "status": record.status,
    }
    if record.path is not None:
        fields["path"] = record.path
    if record.rule is not None:
        fields["rule"] = record.rule
    if record.would_deny:
        fields["would_deny"] = True
    if record.unlisted:
        fields["unlisted"] = True
    if record.tunnel is not None:
        fields["tunnel"] = record.tunnel
    if record.side is not None:
        fields["side"] = record.side
    if record.ask is not None:
        fields["ask"] = record.ask
    if record.answer is not None:
        fields["answer"], fields["by"] = record.answer, record.by
    fields["bytes_up"], fields["bytes_down"] = record.bytes_up, record.bytes_down
    fields["duration_ms"] = round((time.time() - started) * 1000, 1)
    return fields


def _call_fields(record: AuditRecord, call: RpcCall, seq: int) -> dict[str, object]:
    """A JSON-RPC message's line: the request's time, client, target, path and status; the message's method,
    server, tool, decision, reason and rule. Allowed, but in a request that was refused: not sent."""
    decision, reason, rule = call.decision, call.reason, call.rule
    if decision == "allow" and record.decision == "deny":
        decision, reason, rule = "deny", f"not sent: its request was refused: {record.reason}", ""
    fields: dict[str, object] = {
        "version": VERSION, "seq": seq, "time": _time(record.started), "listener": MCP, "client": record.client,
        "method": call.method, "target": record.target, "decision": decision, "reason": reason,
        "status": record.status,
    }
    if record.path is not None:
        fields["path"] = record.path
    if rule:
        fields["rule"] = rule
    fields["server"] = call.server
    if call.tool:
        fields["tool"] = call.tool
    return fields


def _time(started: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(started)) + f".{int(started % 1 * 1000):03d}Z"
