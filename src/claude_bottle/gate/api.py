"""The API listener: what ANTHROPIC_BASE_URL points at.

A request the API policy allows goes through the forward path (gate/forward.py) with this route's filters:
the Messages body read whole and judged (policy/messages.py) before anything goes upstream; every client
credential stripped, the request scanned by DLP (gate/inspection.py), then the real credential injected;
identity encoding asked for. On the way back, a response that is encoded (so cannot be scanned) or that
would carry the credential is never delivered.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

from claude_bottle.gate.audit import AuditRecord
from claude_bottle.gate.connection import HttpConnection
from claude_bottle.gate.context import GateContext
from claude_bottle.gate.failures import Refused
from claude_bottle.gate.forward import (
    Outbound,
    RequestFilter,
    ResponseFilter,
    forward,
    outbound,
    read_whole,
    set_headers,
)
from claude_bottle.gate.http1 import Request
from claude_bottle.gate.inspection import data_loss, identity_only, reflection_scans
from claude_bottle.gate.routes import CLIENT_CREDENTIAL_HEADERS
from claude_bottle.gate.settings import GateSettings
from claude_bottle.gate.upstream import UpstreamPool
from claude_bottle.policy.decide import Decision
from claude_bottle.policy.messages import MessagesPolicy

# Replaced by the gate: the upstream's own Host, and identity encoding so the reflection scan sees plain bytes.
GATE_SET_HEADERS = frozenset({b"host", b"accept-encoding"})


@dataclass(frozen=True)
class ApiRoute:
    """One gate's API route: its filters, made once, as they keep nothing of a request between calls.
    ``messages_filters`` are for a Messages body (its policy first), ``filters`` for any other request."""

    messages_filters: tuple[RequestFilter, ...]
    filters: tuple[RequestFilter, ...]
    response_filters: tuple[ResponseFilter, ...]
    target: str  # the upstream's host:port, for the audit
    # ApiPolicy.decide, remembered for the few targets a client repeats (bounded: a target may be 32 KiB).
    decide: Callable[[str, str], Decision]

    @classmethod
    def of(cls, config: GateSettings) -> ApiRoute:
        upstream = config.upstream
        # DLP sees the request with the client's credentials gone (the bottle's placeholder is an sk-ant-
        # token) and before the real one is added.
        filters = (set_headers(CLIENT_CREDENTIAL_HEADERS | GATE_SET_HEADERS, []),
                   data_loss(config.dlp_matcher),
                   set_headers(frozenset(), [(b"host", upstream.authority), config.credential.header(),
                                             (b"accept-encoding", b"identity")]))
        return cls((messages_policy(config.messages_policy, config.limits.max_body_bytes), *filters), filters,
                   (identity_only, *reflection_scans(config.injected_secrets)), f"{upstream.host}:{upstream.port}",
                   functools.lru_cache(maxsize=64)(config.api_policy.decide))

    async def exchange(self, conn: HttpConnection, request: Request, record: AuditRecord, ctx: GateContext
                       ) -> None:
        """One request on the API listener (the listener's ``Exchange``, gate/request_loop.py)."""
        config = ctx.config
        method = request.method.decode("ascii")
        target = request.target.decode("ascii")
        record.target = self.target
        record.path = target.split("?", 1)[0]

        decision = self.decide(method, target)
        if not decision.allow:
            raise Refused.by(decision)
        record.decided(decision)

        messages = method == "POST" and record.path in config.messages_policy.paths
        idle = config.limits.idle_timeout
        await forward(conn, outbound(conn, request, (config.upstream.base_path + target).encode(), idle),
                      lambda: Pooled(ctx.api_pool), record, idle,
                      self.messages_filters if messages else self.filters, self.response_filters)


def messages_policy(policy: MessagesPolicy, max_bytes: int) -> RequestFilter:
    """Read the Messages body whole and judge it before anything goes upstream."""

    async def judge(request: Outbound) -> Decision:
        request.body = await read_whole(request, max_bytes)
        verdict = policy.decide(request.body)
        if not verdict.allow:
            raise Refused(verdict.status, verdict.reason)
        return verdict

    return judge


class Pooled:
    """A pooled upstream connection, for ``async with``: back to the pool after a complete exchange, else
    reset. (A class rather than a generator-based context manager: it is entered on every API request.)"""

    def __init__(self, pool: UpstreamPool) -> None:
        self._pool = pool
        self._origin: HttpConnection | None = None

    async def __aenter__(self) -> HttpConnection:
        self._origin = await self._pool.acquire()  # UpstreamSide if it cannot connect
        return self._origin

    async def __aexit__(self, *exc_info: object) -> None:
        if self._origin is not None:
            self._pool.release(self._origin)
