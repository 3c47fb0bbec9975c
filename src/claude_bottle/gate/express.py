"""The express path: an API exchange served from the socket callbacks, with no task switch.

Most API requests are small and whole: the head and body arrive in one read, go to a kept-alive upstream
connection, and the whole response comes back in one read. For those, the coroutine path's layers (the
request loop woken, the exchange, its filters, the pooled upstream, the waits) cost more than the checks
themselves. So while a client connection's request loop waits between requests, the route's ``Express`` is
offered each arrival (``HttpConnection.express``): it takes a whole request only when it is checked and
allowed as the coroutine path would (the same functions run: gate/api.py) and the pool holds an idle upstream
connection, and sends it from the callback. The response is answered from the upstream connection's callback
(``ExpressExchange.arrived``) when it arrived whole and the client can take it at once.

Anything else is the coroutine path's, which stays the contract: a request that is not whole or is refused is
left queued for the request loop, which serves it as before; once a request went up, an exchange that cannot
end in that one callback (a streamed or interim response, a response filter's refusal, a peer gone, the
upstream's silence past the idle timeout, a fault) is handed to the request loop as a ``Resume``, which
finishes it with the same functions. Either way each request gets exactly one audit line, written when its
exchange ends.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Sequence

from claude_bottle.gate.audit import AuditRecord
from claude_bottle.gate.connection import HttpConnection
from claude_bottle.gate.context import GateContext
from claude_bottle.gate.forward import ResponseFilter, answered, deliver, relay
from claude_bottle.gate.http1 import Request, Response
from claude_bottle.gate.receiving import Resume

# A route's express: True when it took the request queued on the connection (see the module's note).
Express = Callable[[HttpConnection, GateContext, set[HttpConnection]], bool]


class ExpressExchange:
    """One exchange express took from ``conn``, its request to go up on ``origin`` (an idle pooled
    connection): its response is awaited from ``origin``'s callback, and its audit record (``send`` has it
    made) written when it ends."""

    def __init__(self, conn: HttpConnection, origin: HttpConnection, ctx: GateContext, busy: set[HttpConnection],
                 response_filters: Sequence[ResponseFilter]) -> None:
        self.conn, self.origin, self.ctx, self.busy = conn, origin, ctx, busy
        self.response_filters = response_filters
        self.deadline = 0.0

    def send(self, head: Request, body: bytes, record: Callable[[], AuditRecord]) -> None:
        """The request queued on ``conn`` goes up as ``head`` and ``body``, and is taken, with its audit record
        made by ``record`` (after the write: what is left to do is off the exchange's path); then the wait for
        its response, as long as the coroutine path waits for its head."""
        origin = self.origin
        try:
            origin.write_whole(head, body)
        except Exception as exc:  # a fault: answered as the coroutine path answers one
            origin.abort()
            self._taken(record(), len(body))
            self._resume(functools.partial(_raise, exc))
            return
        self._taken(record(), len(body))
        self.deadline = origin.loop.time() + self.ctx.config.limits.idle_timeout
        origin.await_events(self.arrived, self.deadline, self.hand_over)
        self.conn.on_hang_up = self.hand_over  # the client gone before the answer: relay ends the exchange

    def _taken(self, record: AuditRecord, size: int) -> None:
        self.record = record
        self.conn.take_whole()
        self.busy.add(self.conn)  # a draining gate lets the exchange finish
        self.conn.in_flight = self.abandon
        self.record.bytes_up += size

    def arrived(self) -> None:
        """Something arrived on ``origin``: a whole response is answered now; anything else goes back to the
        request loop."""
        conn, origin = self.conn, self.origin
        whole = origin.queued_whole()
        if whole is None:
            if origin.has_events:  # else only part of a head so far: wait for the rest
                self.hand_over()
            return
        if not conn.ready_for_express:  # the client is gone, or not reading: the coroutine path tells
            self.hand_over()
            return
        response, body = whole
        assert isinstance(response, Response)  # a client connection parses responses
        try:
            inbound = answered(response, body, self.response_filters)
            down = inbound.body  # bytes, unless a filter streams it: then the coroutine path relays it
            must_drain = not isinstance(down, bytes) or conn.write_whole(Response(inbound.status, inbound.headers),
                                                                         down)
        except Exception as exc:  # a response filter's refusal (UpstreamSide), or a fault: answered as always
            self._release()
            self._resume(functools.partial(_raise, exc))
            return
        self._release()  # after the answer's write: off the exchange's path
        if not isinstance(down, bytes):
            self._resume(functools.partial(deliver, conn, inbound, self.record))
            return
        if must_drain:  # the client takes the answer slowly, or is gone: the coroutine path waits and tells
            self._resume(functools.partial(self._drained, inbound.status, len(down)))
            return
        record = self.record
        record.status, record.bytes_down = inbound.status, len(down)
        if not conn.can_reuse():  # the client asked to close: the request loop ends the connection
            self._resume(_done)
            return
        conn.in_flight = None
        self.busy.discard(conn)
        self.ctx.audit.write(record)
        conn.exchange_done()

    def _release(self) -> None:
        """The response taken from ``origin``, its wait ended, and ``origin`` back to the pool."""
        self._settle()
        self.origin.take_whole()
        self.ctx.api_pool.release(self.origin)

    def hand_over(self) -> None:
        """The request loop finishes the exchange: the response as the coroutine path relays it."""
        self._settle()
        self._resume(self._relayed)

    def abandon(self) -> None:
        """The request loop ended first (the gate stops): the upstream connection is reset, the line written."""
        self._settle()
        self.conn.in_flight = None
        self.origin.abort()
        self.busy.discard(self.conn)
        self.ctx.audit.write(self.record)

    def _settle(self) -> None:
        self.origin.await_events(None)
        self.conn.on_hang_up = None

    def _resume(self, finish: Callable[[], Awaitable[None]]) -> None:
        self.conn.resume(Resume(finish, self.record))

    async def _relayed(self) -> None:
        try:
            await relay(self.conn, self.origin, self.record, self.ctx.config.limits.idle_timeout,
                        self.response_filters, self.deadline)
        finally:
            self.ctx.api_pool.release(self.origin)

    async def _drained(self, status: int, size: int) -> None:
        await self.conn.drain()
        self.record.status, self.record.bytes_down = status, size


async def _raise(exc: Exception) -> None:
    raise exc


async def _done() -> None:
    pass
