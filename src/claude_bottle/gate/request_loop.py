"""The request loop of one client connection: each request gets exactly one audit record, written when its
exchange ends, whatever way it ends. Used by both listeners and by terminated TLS tunnels; the API listener's
loop also lets its express path serve whole requests from the socket callback (gate/express.py)."""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable

from claude_bottle.gate.audit import AuditRecord
from claude_bottle.gate.connection import HttpConnection
from claude_bottle.gate.context import GateContext
from claude_bottle.gate.express import Express
from claude_bottle.gate.failures import ClientSide, ExchangeStopped, GateFault
from claude_bottle.gate.http1 import Request
from claude_bottle.gate.receiving import Resume
from claude_bottle.gate.refusals import answer

Exchange = Callable[[HttpConnection, Request, AuditRecord, GateContext], Awaitable[None]]


async def serve_requests(conn: HttpConnection, listener: str, exchange: Exchange, ctx: GateContext,
                         busy: set[HttpConnection] | None = None, express: Express | None = None) -> None:
    """Serve requests on ``conn`` until it closes or one ends it. ``conn`` is in ``busy`` during an exchange
    (a draining gate lets those finish). ``express`` serves what it can between requests."""
    busy = busy if busy is not None else set()
    if express is not None:
        conn.express = lambda connection: express(connection, ctx, busy)
    try:
        await _serve(conn, listener, exchange, ctx, busy)
    finally:
        conn.express = None
        if conn.in_flight is not None:  # ended (the gate stops) while express served a request
            conn.in_flight()


async def _serve(conn: HttpConnection, listener: str, exchange: Exchange, ctx: GateContext,
                 busy: set[HttpConnection]) -> None:
    limits = ctx.config.limits
    while True:
        try:
            request = await conn.read_request(limits.header_timeout)
        except ClientSide as stop:  # a head that broke HTTP, came too slowly, or was cut off: one line, then close
            record = AuditRecord(listener, conn.peer, "-", "-")
            await answer(conn, record, stop, limits.idle_timeout)
            ctx.audit.write(record)
            return
        if request is None:
            return  # the client closed, or stayed idle, between requests: nothing was asked, nothing to audit
        if isinstance(request, Resume):  # an exchange express began, to finish here
            record, work = request.record, request.finish()
        else:
            record = AuditRecord(listener, conn.peer, request.method.decode("ascii", "replace"), "-")
            work = exchange(conn, request, record, ctx)
        busy.add(conn)
        try:
            await work  # each connection raises its own side's failures
        except ExchangeStopped as stop:
            if not await answer(conn, record, stop, limits.idle_timeout):
                return
        except Exception as exc:  # a fault of the gate's own: still one audit line with a reason, then 500
            with contextlib.suppress(OSError):  # the connection may be in any state after a fault
                await answer(conn, record, GateFault(exc), limits.idle_timeout)
            return
        finally:
            busy.discard(conn)
            ctx.audit.write(record)
        if not conn.can_reuse():
            return
