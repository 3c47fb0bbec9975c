"""One JSON line per gate decision, with fixed field names (see docs/gate.md)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import TextIO

REDACTED = "[redacted]"


@dataclass
class AuditRecord:
    """A decision and what came of it. ``path`` is set on the API listener only, never with a query."""

    listener: str  # "api" or "proxy"
    client: str  # peer host:port
    method: str
    target: str  # host:port
    decision: str = "deny"  # "allow", "deny", or "error" (allowed, then the upstream failed)
    reason: str = ""
    status: int = 0  # HTTP status sent to the client; 0 if the connection closed before one was sent
    path: str | None = None
    rule: str | None = None  # the configured rule that decided (an [[egress]] rule, a [dlp] rule), if one did
    would_deny: bool = False  # let through by learn mode only: a gate without it would have refused this
    bytes_up: int = 0  # client -> upstream, body or tunnel bytes
    bytes_down: int = 0  # upstream -> client
    started: float = field(default_factory=time.time)

    def allow(self, reason: str) -> None:
        self.decision, self.reason = "allow", reason

    def deny(self, reason: str, status: int) -> None:
        self.decision, self.reason, self.status = "deny", reason, status

    def fail(self, reason: str, status: int) -> None:
        """Allowed (or not yet decided, e.g. while a body is read), then failed. A status already sent to the
        client stays: it is what the client saw."""
        self.decision, self.reason = "error", f"{self.reason}; then {reason}" if self.reason else reason
        self.status = self.status or status


class AuditLog:
    """Writes records to a text stream. Any occurrence of a secret is replaced before writing: the audit
    never carries one, whatever a caller passes in."""

    def __init__(self, stream: TextIO | None, secrets: tuple[str, ...] = ()) -> None:
        self._stream = stream
        self._secrets = tuple(s for s in secrets if s)

    def write(self, record: AuditRecord) -> None:
        if self._stream is None:
            return
        started = record.started
        # The fields in their fixed order; the optional ones only when set. (Built by hand: dataclasses.asdict
        # deep-copies every field, and this runs for every request.)
        fields: dict[str, object] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(started)) + f".{int(started % 1 * 1000):03d}Z",
            "listener": record.listener, "client": record.client, "method": record.method, "target": record.target,
            "decision": record.decision, "reason": record.reason, "status": record.status,
        }
        if record.path is not None:
            fields["path"] = record.path
        if record.rule is not None:
            fields["rule"] = record.rule
        if record.would_deny:
            fields["would_deny"] = True
        fields["bytes_up"], fields["bytes_down"] = record.bytes_up, record.bytes_down
        fields["duration_ms"] = round((time.time() - started) * 1000, 1)
        line = json.dumps(fields, ensure_ascii=False)
        for secret in self._secrets:
            if secret in line:
                line = line.replace(secret, REDACTED)
        self._stream.write(line + "\n")
        self._stream.flush()
