"""The API listener: what ANTHROPIC_BASE_URL points at.

A request the API policy allows goes through the forward path (gate/forward.py) with this route's filters:
the Messages body read whole and judged (policy/messages.py) before anything goes upstream; every client
credential stripped, the request scanned by DLP (gate/inspection.py), then the real credential injected;
identity encoding asked for. On the way back, a response that is encoded (so cannot be scanned) or that
would carry the credential is never delivered.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from claude_bottle.gate.audit import AuditRecord
from claude_bottle.gate.context import GateContext
from claude_bottle.gate.failures import Refused, upstream_side
from claude_bottle.gate.forward import (
    Outbound,
    RequestFilter,
    forward,
    outbound,
    read_whole,
    set_headers,
)
from claude_bottle.gate.http import HttpConnection, Request
from claude_bottle.gate.inspection import (
    CLIENT_CREDENTIAL_HEADERS,
    data_loss,
    identity_only,
    reflection_scans,
)
from claude_bottle.gate.upstream import UpstreamPool
from claude_bottle.policy.messages import MessagesPolicy

# Replaced by the gate: the upstream's own Host, and identity encoding so the reflection scan sees plain bytes.
GATE_SET_HEADERS = frozenset({b"host", b"accept-encoding"})


async def api_exchange(conn: HttpConnection, request: Request, record: AuditRecord, ctx: GateContext) -> None:
    config = ctx.config
    upstream = config.upstream
    method = request.method.decode("ascii")
    target = request.target.decode("ascii")
    record.target = f"{upstream.host}:{upstream.port}"
    record.path = target.split("?", 1)[0]

    decision = config.api_policy.decide(method, target)
    if not decision.allow:
        raise Refused(decision.status, decision.reason)
    record.allow(decision.reason)

    filters: list[RequestFilter] = []
    if method == "POST" and record.path in config.messages_policy.paths:
        filters.append(messages_policy(config.messages_policy, config.limits.max_body_bytes))
    # DLP sees the request with the client's credentials gone (the bottle's placeholder is an sk-ant- token)
    # and before the real one is added.
    filters += [set_headers(CLIENT_CREDENTIAL_HEADERS | GATE_SET_HEADERS, []),
                data_loss(config.dlp_matcher),
                set_headers(frozenset(), [(b"host", upstream.authority), config.credential.header(),
                                          (b"accept-encoding", b"identity")])]
    idle = config.limits.idle_timeout
    await forward(conn, outbound(conn, request, (upstream.base_path + target).encode(), idle),
                  lambda: pooled(ctx.api_pool), record, idle, filters,
                  [identity_only, *reflection_scans(config.injected_secrets)])


def messages_policy(policy: MessagesPolicy, max_bytes: int) -> RequestFilter:
    """Read the Messages body whole and judge it before anything goes upstream."""

    async def judge(request: Outbound, record: AuditRecord) -> None:
        request.body = await read_whole(request, max_bytes)
        verdict = policy.decide(request.body)
        if not verdict.allow:
            raise Refused(verdict.status, verdict.reason)
        record.allow(f"{record.reason}; {verdict.reason}")

    return judge


@contextlib.asynccontextmanager
async def pooled(pool: UpstreamPool) -> AsyncIterator[HttpConnection]:
    """A pooled upstream connection; back to the pool after a complete exchange, else closed."""
    with upstream_side():
        origin = await pool.acquire()
    try:
        yield origin
    finally:
        pool.release(origin)
