"""The request loop of one client connection: each request gets exactly one audit record, written when its
exchange ends, whatever way it ends. Used by both listeners and by terminated TLS tunnels."""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable

from claude_bottle.gate.audit import AuditRecord
from claude_bottle.gate.connection import HttpConnection, PeerGone
from claude_bottle.gate.context import GateContext
from claude_bottle.gate.failures import ExchangeStopped, client_side
from claude_bottle.gate.http1 import LocalProtocolError, ProtocolError, Request
from claude_bottle.gate.refusals import answer, answer_or_reset, refuse_unread

Exchange = Callable[[HttpConnection, Request, AuditRecord, GateContext], Awaitable[None]]


async def serve_requests(conn: HttpConnection, listener: str, exchange: Exchange, ctx: GateContext,
                         busy: set[HttpConnection] | None = None) -> None:
    """Serve requests on ``conn`` until it closes or one ends it. ``conn`` is in ``busy`` during an exchange
    (a draining gate lets those finish)."""
    busy = busy if busy is not None else set()
    limits = ctx.config.limits
    while True:
        try:
            request = await conn.read_request(limits.header_timeout)
        except ProtocolError as exc:
            record = AuditRecord(listener, conn.peer, "-", "-")
            record.deny(f"malformed request: {exc}", exc.status)
            ctx.audit.write(record)
            with contextlib.suppress(PeerGone, LocalProtocolError):
                await answer_or_reset(conn, exc.status, record.reason)
            return
        except TimeoutError:
            if conn.head_started:  # a head trickled in too slowly: refused, and said so
                record = AuditRecord(listener, conn.peer, "-", "-")
                record.deny(f"request head not complete within {limits.header_timeout:g}s", 408)
                ctx.audit.write(record)
                await refuse_unread(conn, 408, record.reason)
            return  # else an idle keep-alive: nothing was asked, nothing to audit
        except PeerGone:
            return  # a client that left between requests
        if request is None:
            return
        record = AuditRecord(listener, conn.peer, request.method.decode("ascii", "replace"), "-")
        busy.add(conn)
        try:
            # Every upstream step inside is translated where it runs; what is left is the client's.
            with client_side():
                await exchange(conn, request, record, ctx)
        except ExchangeStopped as stop:
            if not await answer(conn, record, stop, limits.idle_timeout):
                return
        except Exception as exc:  # a fault of the gate's own: still one audit line with a reason, then 500
            record.fail(f"gate error: {type(exc).__name__}: {exc}", 500)
            with contextlib.suppress(PeerGone, LocalProtocolError, OSError):
                await answer_or_reset(conn, 500, "internal gate error")
            return
        finally:
            busy.discard(conn)
            ctx.audit.write(record)
        if not conn.can_reuse():
            return
