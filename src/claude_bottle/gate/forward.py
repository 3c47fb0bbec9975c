"""The one forward path: a request from a client to an upstream and its response back, through filters.

Every relayed request takes it: the API route, plain HTTP on the proxy, and requests inside terminated TLS.
What differs between them is only the filters and where the upstream connection comes from:

- Request filters (``RequestFilter``) run in order before anything goes upstream. Each may rewrite the
  outgoing head (strip client credentials, inject the real one, set Host), replace the body stream with a
  filtered one (DLP, scanning as it passes; the Messages policy, holding back the body's end until it has
  judged the whole), or with the whole body read, or raise ``Refused``. One that judged the request and let it
  pass returns its decision, which the forward path adds to the audit record (filters never touch it); a body
  stream that judges the whole body adds its decision to ``Outbound.decided`` instead. A filtered body stream
  may raise ``Refused`` part-way: the upstream connection is then reset (never pooled), so the request never
  completes there. The upstream connection is opened only once the body's first piece has passed the
  filters, so a body refused in its first piece (any small one) never reaches the upstream at all.
- Response filters (``ResponseFilter``) run on the response head before it is sent, and may wrap its body
  stream (the reflection scan) or raise ``UpstreamSide``.

Framing is the gate's own: a body read whole goes with its length, a streamed one as the client framed it
(length or chunked). Hop-by-hop headers never pass either way, ``Expect`` is answered by the gate itself
(``100 Continue`` once a filter or the forward starts reading the body), and the status line's reason
phrase is the gate's. Bodies stream both ways as they arrive; one that arrived whole with its head (a small
request or response, the common case on the API route) goes as bytes, in one write with its head. Each
connection raises its own side's failure (gate/failures.py), so every error arrives at the caller already
saying whose it was.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from claude_bottle.gate.audit import AuditRecord
from claude_bottle.gate.connection import HttpConnection
from claude_bottle.gate.failures import Refused
from claude_bottle.gate.http1 import (
    HOP_BY_HOP,
    Data,
    EndOfMessage,
    Headers,
    InformationalResponse,
    Request,
    Response,
    hop_free,
)
from claude_bottle.policy.decide import Decision

# Set by the gate on every forwarded request: the body's framing, and Expect, which the gate answers.
FRAMING_HEADERS = frozenset({b"content-length", b"transfer-encoding", b"expect"})
_NOT_FORWARDED = HOP_BY_HOP | FRAMING_HEADERS


class HeldBodies:
    """The bytes of request bodies one listener's exchanges hold whole to judge them (the Messages policy, an
    MCP server's calls, the ``_method`` fields of a ruled host's form), against ``limit``: past it a body is
    refused (503, its connection closed) rather than held. Only what stays held counts: a join or a parse
    runs one at a time on the gate's one thread, so the gate's memory limit has room for the largest."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0

    def take(self, size: int) -> None:
        if self.held + size > self.limit:
            raise Refused(503, f"the gate holds {self.held >> 20} MiB of request bodies to judge already (at most "
                               f"{self.limit >> 20} MiB at once); try again once they are through", close=True)
        self.held += size

    def give_back(self, size: int) -> None:
        self.held -= size


@dataclass
class Outbound:
    """The request as it will go upstream. ``headers`` hold no framing; ``body`` is a stream of chunks, or
    bytes once a filter has read it whole. ``path`` is the target without its query (for decisions)."""

    method: bytes
    target: bytes
    headers: Headers
    body: AsyncIterator[bytes] | bytes
    length: int | None  # the client's Content-Length; None when it sent none
    chunked: bool  # the client sent the body chunked
    # Verdicts a body stream reached on the whole body, once it had passed: recorded after the body went up.
    decided: list[Decision] = field(default_factory=list)
    holding: HeldBodies | None = None  # where the bytes of its body a filter holds whole are counted
    held: int = 0

    def hold(self, size: int) -> None:
        """``size`` more bytes of the body held whole, until the exchange ends (``Refused`` 503 past the
        listener's limit)."""
        if self.holding is not None:
            self.holding.take(size)
            self.held += size

    def let_go(self) -> None:
        if self.holding is not None:
            self.holding.give_back(self.held)
            self.held = 0

    @property
    def path(self) -> str:
        return self.target.split(b"?", 1)[0].decode("ascii", "replace")

    def framing(self) -> Headers:
        if isinstance(self.body, bytes):
            if not self.body and self.length is None and not self.chunked:
                return []  # none was sent, none is made up
            return [(b"content-length", str(len(self.body)).encode())]
        if self.chunked:
            return [(b"transfer-encoding", b"chunked")]
        return [(b"content-length", str(self.length).encode())] if self.length is not None else []


@dataclass
class Inbound:
    """The response as it will go to the client: hop-by-hop headers already removed. ``body`` is a stream of
    chunks, or bytes when the whole of it had arrived with the head."""

    status: int
    headers: Headers
    body: AsyncIterator[bytes] | bytes


# A request filter returns its decision for the audit when it judged the request and allowed it (None when it
# only rewrote it) and raises ``Refused`` when it refused it; a response filter raises ``UpstreamSide``. No
# filter touches the audit record: the forward path records what they return.
RequestFilter = Callable[[Outbound], Awaitable[Decision | None]]
ResponseFilter = Callable[[Inbound], None]
OriginFactory = Callable[[], contextlib.AbstractAsyncContextManager[HttpConnection]]


def outbound(conn: HttpConnection, request: Request, target: bytes, idle: float, holding: HeldBodies
             ) -> Outbound:
    """``request`` as it arrived, to go upstream to ``target``, its body to be read from ``conn`` (or already
    there, whole: a small request comes in one piece); what filters hold of it whole counted in ``holding``."""
    arrived = None if conn.they_are_waiting_for_100_continue else conn.arrived_body()
    return Outbound(
        method=request.method,
        target=target,
        headers=hop_free(request.headers, _NOT_FORWARDED),
        body=client_body(conn, idle) if arrived is None else arrived,
        length=request.content_length,
        chunked=request.chunked,
        holding=holding,
    )


def client_body(conn: HttpConnection, idle: float) -> AsyncIterator[bytes]:
    """The request body from the client as it arrives; ``idle`` bounds the wait for each piece. A client
    waiting for ``100 Continue`` gets it when the body is first read."""
    return continued(conn, idle) if conn.they_are_waiting_for_100_continue else conn.body(idle)


async def continued(conn: HttpConnection, idle: float) -> AsyncIterator[bytes]:
    await conn.send(InformationalResponse(100))
    async for chunk in conn.body(idle):
        yield chunk


async def read_whole(request: Outbound, max_bytes: int) -> bytes:
    """The whole body of ``request``; ``Refused`` 413 (closing the connection, the rest unread) past
    ``max_bytes``, before reading any of it when its Content-Length already says so."""
    body = request.body
    known = len(body) if isinstance(body, bytes) else request.length
    if known is not None and known > max_bytes:
        raise too_large(max_bytes)
    if isinstance(body, bytes):
        return body
    chunks, size = [], 0
    async for chunk in body:
        size += len(chunk)
        if size > max_bytes:
            raise too_large(max_bytes)
        request.hold(len(chunk))
        chunks.append(chunk)
    return b"".join(chunks)


def too_large(max_bytes: int) -> Refused:
    """The refusal of a body over ``max_bytes``: 413, and the connection closed (the rest is never read)."""
    return Refused(413, f"request body larger than {max_bytes} bytes", close=True)


async def forward(
    conn: HttpConnection,
    request: Outbound,
    open_origin: OriginFactory,
    record: AuditRecord,
    idle: float,
    request_filters: Sequence[RequestFilter] = (),
    response_filters: Sequence[ResponseFilter] = (),
) -> None:
    """One exchange: the filters, then the request up (its body as it arrives), the response down chunk by
    chunk; a body that is all there goes with its head, in one write. Raises ``Refused``, ``ClientSide`` or
    ``UpstreamSide``; the caller answers (failures.answer). What the filters held of the body is let go at
    the end."""
    try:
        for request_filter in request_filters:
            verdict = await request_filter(request)
            if verdict is not None:
                record.passed(verdict)
        body = request.body
        # A streamed body's first piece, before any upstream connection: a refusal there costs the upstream nothing.
        first = None if isinstance(body, bytes) else await anext(body, None)
        async with open_origin() as origin:
            head = Request(request.method, request.target, [*request.headers, *request.framing()])
            if isinstance(body, bytes):
                record.bytes_up += len(body)
                await origin.send_whole(head, body)
            else:
                await origin.send(head)
                if first is not None:
                    record.bytes_up += len(first)
                    await origin.send(Data(first))
                    async for chunk in body:
                        record.bytes_up += len(chunk)
                        await origin.send(Data(chunk))
                await origin.send(EndOfMessage())
            for verdict in request.decided:
                record.passed(verdict)
            await relay(conn, origin, record, idle, response_filters)
    finally:
        request.let_go()


async def relay(conn: HttpConnection, origin: HttpConnection, record: AuditRecord, idle: float,
                response_filters: Sequence[ResponseFilter], deadline: float | None = None) -> None:
    """The response to the request sent on ``origin``, through the filters to ``conn``. ``deadline`` (the
    loop's clock) bounds the wait for its head as well.

    A client that hangs up while the gate waits for that head is gone: the wait ends there (``ClientSide``,
    as when the answer cannot be written), and ``origin``, its exchange unfinished, is closed by whoever holds
    it, never reused, so the upstream stops working on a request nobody will read. Hanging up is a reset or a
    close, a plain TCP client's FIN included (a client that exits or is killed sends one): it cannot be told
    from a half-close without writing to the client, so a half-closed client gets no answer, as from nginx
    (its 499)."""
    if conn.hung_up:
        raise conn.side.gone()
    conn.on_hang_up = lambda: origin.interrupt(conn.side.gone())
    try:
        event = await origin.next_event(idle, deadline)
        while isinstance(event, InformationalResponse):  # 100 Continue and the like are hop-by-hop
            event = await origin.next_event(idle)
    finally:
        conn.on_hang_up = None
    if not isinstance(event, Response):  # the connection's end, the only other event before a response
        raise origin.side.gone("without a response")
    arrived = origin.arrived_body()
    await deliver(conn, answered(event, origin.body(idle) if arrived is None else arrived, response_filters), record)


def answered(response: Response, body: AsyncIterator[bytes] | bytes, response_filters: Sequence[ResponseFilter]
             ) -> Inbound:
    """``response`` as it goes to the client: its hop-by-hop headers gone, through the filters (which raise
    ``UpstreamSide`` to refuse it, and may rewrite it or wrap its body)."""
    inbound = Inbound(response.status_code, hop_free(response.headers), body)
    for response_filter in response_filters:
        response_filter(inbound)
    return inbound


async def deliver(conn: HttpConnection, response: Inbound, record: AuditRecord) -> None:
    """``response`` to the client: chunk by chunk, or in one write when its body is all here."""
    answer, down = Response(response.status, response.headers), response.body
    if isinstance(down, bytes):
        await conn.send_whole(answer, down)
        record.status, record.bytes_down = response.status, len(down)
        return
    await conn.send(answer)
    record.status = response.status
    async for chunk in down:
        record.bytes_down += len(chunk)
        if conn.send_data(chunk):
            await conn.drain()
    await conn.send(EndOfMessage())


def set_headers(drop: frozenset[bytes], add: Headers) -> RequestFilter:
    """A filter that removes the headers named in ``drop`` and appends ``add`` (Host first if given)."""

    first = [(n, v) for n, v in add if n == b"host"]
    last = [(n, v) for n, v in add if n != b"host"]

    async def rewrite(request: Outbound) -> None:
        kept = [(n, v) for n, v in request.headers if n.lower() not in drop] if drop else request.headers
        request.headers = [*first, *kept, *last]

    return rewrite
