"""One HTTP/1.1 connection as an asyncio protocol: the I/O around the parser (gate/http1.py), its timers and
its flow control, for both sides of every exchange (and the stub upstream).

What arrives is parsed as it arrives and a reader waiting in ``next_event`` is woken only when an event is
ready; reading pauses while too much waits unread, and writing waits while the transport holds too much.

A connection knows its side: a server's peer is the client, a client's the upstream. It raises that side's
failure itself (``ClientSide`` or ``UpstreamSide``, by gate/failures.py's one rule) on every read and write:
when the peer breaks the protocol, goes silent past its timeout, or closes in the middle of an exchange.
Callers never assign blame. The refusals the gate sends on a connection are gate/refusals.py's; servers and
client connections are made by gate/endpoints.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from collections.abc import AsyncIterator, Awaitable, Callable

from claude_bottle.gate.audit import AuditRecord
from claude_bottle.gate.failures import BLAME_CLIENT, BLAME_UPSTREAM, ExchangeStopped
from claude_bottle.gate.framing import JOIN_BELOW, Outgoing
from claude_bottle.gate.http1 import (
    CONNECTION_CLOSED,
    END_OF_MESSAGE,
    MAX_HEADER_BYTES,
    NO_REUSE,
    Broken,
    ConnectionClosed,
    Data,
    EndOfMessage,
    Event,
    InformationalResponse,
    LocalProtocolError,
    MessageParser,
    ProtocolError,
    Request,
    Response,
    State,
)

READ_SIZE = 64 * 1024

# Bytes received and parsed but not yet taken by the connection's reader, above which the connection stops
# reading from its socket until they are taken (a client pipelining faster than the gate forwards).
READ_HIGH_WATER = 256 * 1024


class Resume:
    """What a server connection's reader gets in place of a request when an exchange taken from the socket
    callback (``HttpConnection.express``) needs the coroutine path to finish it: ``finish()`` is awaited as an
    exchange is, and ``record`` is the exchange's audit record."""

    __slots__ = ("finish", "record")

    def __init__(self, finish: Callable[[], Awaitable[None]], record: AuditRecord) -> None:
        self.finish, self.record = finish, record


class HttpConnection(asyncio.Protocol):
    """One HTTP/1.1 connection, as a server (the default: the peer is the client) or, with ``client``, as a
    client (the peer is the upstream): read messages and body chunks, send messages. ``side`` is the peer's
    side, whose failures the connection raises. It is the transport's protocol: what arrives is parsed as it
    arrives, and a reader waiting in ``next_event`` is woken only when an event is ready.

    Writes are coalesced: the head and body pieces of a message still being sent wait in ``_pending`` and go
    out in one write when the message ends, or at the latest when the event loop next waits (a callback
    scheduled with the first piece), so a streamed body is never held back. Anything else goes at once.

    After a CONNECT is answered 2xx, what the client sends is no longer HTTP: ``trailing_data`` holds what came
    before the answer, and ``tunnel_reader`` what comes after, for the tunnel's first-flight check and relay.

    An exchange may also run without a reader (gate/express.py): on a server connection, ``express`` is offered
    each arrival while the reader waits between requests and may take a whole request there and then; until
    that exchange ends (``exchange_done``) or is handed to the reader (``resume``), the reader is not woken. On
    a client connection, ``on_event`` is called in place of waking a reader."""

    def __init__(self, *, client: bool = False, max_header_bytes: int = MAX_HEADER_BYTES) -> None:
        self.client = client
        self.side = BLAME_UPSTREAM if client else BLAME_CLIENT
        self.transport: asyncio.Transport = None  # type: ignore[assignment]  # set by connection_made
        self._loop: asyncio.AbstractEventLoop = None  # type: ignore[assignment]  # likewise
        self.peer = "unknown"
        self._incoming = MessageParser(client, max_header_bytes)
        self._out = Outgoing(client)  # our side: what goes next, and its framing (gate/framing.py)
        self.their_state = State.IDLE
        self.json_errors = False  # refusals as Anthropic API error bodies (the API listener) instead of text
        self.they_are_waiting_for_100_continue = False
        self._pending: list[bytes] = []  # bytes of the message being sent, not yet written
        self._waiter: asyncio.Future[None] | None = None  # the reader, waiting for an event
        self._deadline: float | None = None  # when that wait times out
        self._timer: asyncio.TimerHandle | None = None
        self._unread = 0  # bytes received since the event queue was last empty
        self._reading_paused = False
        self._writing_paused = False  # the transport's buffer is over its high-water mark
        self._drain_waiters: list[asyncio.Future[None]] = []
        self._lost = False
        self._eof = False  # the peer closed its side
        self._closed: asyncio.Future[None] | None = None
        self._tunnel: asyncio.StreamReader | None = None
        # (server) offered each arrival while the reader waits between requests; True: it took the request
        self.express: Callable[[HttpConnection], bool] | None = None
        self.in_flight: Callable[[], None] | None = None  # an exchange express took, running: how to abandon it
        self._resume: Resume | None = None  # what the reader gets next, before any request
        self._between_requests = False  # the reader waits in read_request
        self._exchanged_at = 0.0  # when an exchange express took last ended (the loop's clock)
        self.on_event: Callable[[], None] | None = None  # (client) called in place of waking a reader
        # (server) called if the peer hangs up (closes or resets) while set: an exchange waiting for its answer
        self.on_hang_up: Callable[[], None] | None = None
        self._on_silence: Callable[[], None] | None = None  # (client) and if nothing came by the deadline

    @property
    def our_state(self) -> str:
        return self._out.state

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The connection's event loop (``asyncio.get_running_loop`` asks the OS for the process id each call
        before Python 3.12: this does not)."""
        return self._loop

    # -- the transport's protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self._loop = asyncio.get_running_loop()
        self._closed = self._loop.create_future()
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else "unknown"

    def data_received(self, data: bytes) -> None:
        if self._tunnel is not None:
            self._tunnel.feed_data(data)
            return
        self._incoming.receive(data)
        self._unread += len(data)
        if self._unread > READ_HIGH_WATER and not self._reading_paused:
            self._reading_paused = True
            self.transport.pause_reading()
        if (self._between_requests and self.express is not None and self.in_flight is None and self._resume is None
                and self.express(self)):
            return
        self._wake()

    def eof_received(self) -> bool:
        self._eof = True
        if self._tunnel is not None:
            self._tunnel.feed_eof()
        else:
            self._incoming.receive_eof()
            self._wake()
            self._hung_up()
        # Keep the transport open: a refusal, or an answer under way, can still be written; TLS cannot half-close.
        return self.transport.get_extra_info("sslcontext") is None

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = self._eof = True
        if self._tunnel is not None:
            self._tunnel.feed_eof()
        else:
            self._incoming.receive_eof()
            self._wake()
        for waiter in self._drain_waiters:
            if not waiter.done():
                waiter.set_exception(self.side.gone())
        self._drain_waiters.clear()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._closed is not None and not self._closed.done():
            self._closed.set_result(None)
        self._hung_up()

    def _hung_up(self) -> None:
        if self.on_hang_up is not None:
            lost, self.on_hang_up = self.on_hang_up, None
            lost()

    def pause_writing(self) -> None:
        self._writing_paused = True

    def resume_writing(self) -> None:
        self._writing_paused = False
        for waiter in self._drain_waiters:
            if not waiter.done():
                waiter.set_result(None)
        self._drain_waiters.clear()

    def _wake(self) -> None:
        if self.on_event is not None:
            self.on_event()
            return
        waiter = self._waiter
        if waiter is not None and not waiter.done() and self._incoming.events and self.in_flight is None:
            waiter.set_result(None)

    # -- receiving

    def receive_data(self, data: bytes) -> None:
        """Parse ``data`` as if it had arrived (b"" for the peer's end); ``next_event`` delivers what it holds."""
        if data:
            self._incoming.receive(data)
        else:
            self._incoming.receive_eof()

    async def _wait(self, deadline: float | None) -> None:
        """Until an event is queued; TimeoutError at ``deadline`` (the loop's clock). One timer serves every
        wait: it is armed once and, when it fires before the current deadline, armed again for it."""
        loop = self._loop
        if self._reading_paused:
            self._reading_paused = False
            self.transport.resume_reading()
        self._waiter = waiter = loop.create_future()
        self._deadline = deadline
        if deadline is not None:
            self._arm(deadline)
        try:
            await waiter
        finally:
            self._waiter = self._deadline = None

    def _arm(self, deadline: float) -> None:
        if self._timer is None or deadline < self._timer.when():
            if self._timer is not None:
                self._timer.cancel()
            self._timer = self._loop.call_at(deadline, self._expire)

    def _expire(self) -> None:
        self._timer = None
        deadline = self._deadline
        if deadline is None:
            return
        loop = self._loop
        if loop.time() < deadline:
            self._timer = loop.call_at(deadline, self._expire)
        elif self.on_event is not None:
            silence, self._deadline = self._on_silence, None
            if silence is not None:
                silence()
        elif self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(TimeoutError())

    async def next_event(self, timeout: float | None = None, deadline: float | None = None) -> Event:
        """The next event, waiting for it if none has arrived: ``timeout`` bounds each wait, ``deadline`` (the
        loop's clock) all of them."""
        events = self._incoming.events
        while True:
            while not events:
                until = deadline
                if timeout is not None:
                    until = self._loop.time() + timeout
                    until = until if deadline is None else min(deadline, until)
                try:
                    await self._wait(until)
                except TimeoutError:
                    raise self.side.silent() from None
            event = self._take()
            if event is not None:
                return event

    def _take(self) -> Event | None:
        """The first queued event, with the connection's state moved past it; None for a marker that is not
        delivered."""
        events = self._incoming.events
        event = events.popleft()
        if not events:
            self._unread = 0
        if isinstance(event, Data):
            self.they_are_waiting_for_100_continue = False
        elif event is END_OF_MESSAGE:
            self.their_state = State.DONE if self._out.keep_alive else State.MUST_CLOSE
        elif isinstance(event, Request):
            self.their_state = State.SEND_BODY
            self._out.answering(event)
            self.they_are_waiting_for_100_continue = event.expects_continue
        elif isinstance(event, Response):
            self.their_state = State.SEND_BODY
        elif event is NO_REUSE:
            self._out.keep_alive = False
            return None
        elif isinstance(event, Broken):
            events.appendleft(event)  # every later call raises it too
            self.their_state = State.ERROR
            raise self.side.broke(event.error)
        elif event is CONNECTION_CLOSED:
            self.their_state = State.CLOSED
            events.appendleft(event)
        return event  # type: ignore[return-value]

    @property
    def trailing_data(self) -> bytes:
        """The bytes that came after a CONNECT head, before it was answered: the tunnel's, once answered 2xx."""
        return self._incoming.trailing

    @property
    def tunnel_reader(self) -> asyncio.StreamReader:
        """After a CONNECT was answered 2xx: the bytes that arrive from then on (see ``trailing_data``)."""
        if self._tunnel is None:
            raise LocalProtocolError("no tunnel: the connection has not switched")
        return self._tunnel

    @property
    def usable(self) -> bool:
        """Neither side has closed the connection, and (a client's) the upstream has sent nothing since the
        last response ended: a kept-alive one may be used again."""
        return not self._eof and not self.transport.is_closing() and not self._unasked()

    def _unasked(self) -> bool:
        """(client) Bytes of a response no request asked for have arrived: an upstream that sends them would
        have each later request on the connection answered with the response to the one before it."""
        return self.client and (bool(self._incoming.events) or self._incoming.head_started)

    async def read_request(self, timeout: float | None) -> Request | Resume | None:
        """The next request head, or None when the client closed, or stayed idle for ``timeout``, between
        requests (before a byte of the next head). ``timeout`` bounds the whole head, however its bytes
        trickle in: past it, a head begun is the client's 408. While it waits, ``express`` may serve requests:
        the client is not idle then, and the wait starts again when the last of them ends; one it hands back
        comes here as a ``Resume``."""
        loop, events, incoming = self._loop, self._incoming.events, self._incoming
        deadline = None if timeout is None else loop.time() + timeout
        event: Event | None = None
        self._between_requests = True
        try:
            while event is None:
                while self._resume is None and (not events or self.in_flight is not None):
                    try:
                        await self._wait(deadline)
                    except TimeoutError:
                        assert deadline is not None and timeout is not None
                        if self.in_flight is not None:
                            deadline = loop.time() + timeout
                        elif self._exchanged_at > deadline - timeout:  # the wait began before that exchange ended
                            deadline = self._exchanged_at + timeout
                        elif not incoming.head_started:
                            return None
                        else:
                            raise self.side.silent(f"request head not complete within {timeout:g}s") from None
                if self._resume is not None:
                    resume, self._resume, self.in_flight = self._resume, None, None
                    return resume
                event = self._take()
        finally:
            self._between_requests = False
        if isinstance(event, ConnectionClosed):
            if incoming.head_started:
                raise self.side.gone("in the middle of a request head")
            return None
        if not isinstance(event, Request):
            raise self.side.broke(ProtocolError(f"unexpected {type(event).__name__} before a request"))
        return event

    def queued_whole(self) -> tuple[Request | Response, bytes] | None:
        """The message first in the queue if all of it has arrived and it is plain: a request that does not
        wait for ``100 Continue``, or a final response, then its body (``_queued_body``). None otherwise.
        Nothing is taken: ``take_whole`` takes it."""
        events = self._incoming.events
        if not events:
            return None
        head = events[0]
        if type(head) is Request:
            if head.expects_continue:
                return None
        elif type(head) is not Response:
            return None
        body = self._queued_body(1)
        return None if body is None else (head, body)

    def _queued_body(self, start: int) -> bytes | None:
        """The body whose events begin at ``start`` in the queue if all of it has arrived (only data, then its
        end), else None."""
        events = self._incoming.events
        if len(events) == start + 2 and type(data := events[start]) is Data and events[start + 1] is END_OF_MESSAGE:
            return data.data  # the common case: one piece, and nothing after its end
        chunks: list[bytes] = []
        for index in range(start, len(events)):
            event = events[index]
            if event is END_OF_MESSAGE:
                return chunks[0] if len(chunks) == 1 else b"".join(chunks)
            if type(event) is Data:
                chunks.append(event.data)
            elif event is not NO_REUSE:  # (after a response head whose connection ends with it)
                return None
        return None

    def take_whole(self) -> None:
        """Take what is queued up to the current message's end, the connection's state moved past it as
        reading it would."""
        while self._take() is not END_OF_MESSAGE:
            pass

    def resume(self, resume: Resume) -> None:
        """The exchange ``express`` took goes back to the reader, which gets ``resume`` next (until then it is
        still in flight: abandoned if the reader ends first)."""
        self._resume = resume
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def exchange_done(self) -> None:
        """The exchange ``express`` took has ended, the connection ready for the next: the reader's wait for it
        starts now, and what arrived meanwhile (a pipelined request, the client's close) wakes it."""
        self.in_flight, self._exchanged_at = None, self._loop.time()
        self._wake()

    def await_events(self, callback: Callable[[], None] | None, deadline: float | None = None,
                     on_silence: Callable[[], None] | None = None) -> None:
        """(client) Call ``callback`` whenever something arrives, or the peer closes, in place of waking a
        reader, and ``on_silence`` if nothing has by ``deadline`` (the loop's clock); None: a reader again. The
        one timer of ``_wait`` serves it: a kept-alive connection arms a timer once per timeout, not per wait."""
        self.on_event, self._on_silence, self._deadline = callback, on_silence, deadline
        if deadline is not None:
            self._arm(deadline)
        if callback is not None and self._reading_paused:
            self._reading_paused = False
            self.transport.resume_reading()

    def interrupt(self, failure: ExchangeStopped) -> None:
        """End the reader's wait in ``next_event`` with ``failure`` (raised there)."""
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(failure)

    @property
    def hung_up(self) -> bool:
        """The peer closed its side or reset the connection: nothing more will come from it."""
        return self._eof

    @property
    def has_events(self) -> bool:
        return bool(self._incoming.events)

    @property
    def ready_for_express(self) -> bool:
        """The peer has not hung up and nothing holds back a write now: what the connection sends goes at once."""
        return not (self._eof or self._writing_paused or self._reading_paused)

    def arrived_body(self) -> bytes | None:
        """The current message's whole body if all of it has arrived (taken, as ``body`` would deliver it),
        else None, with nothing taken. A small message usually arrives in one read: then no wait, no stream."""
        body = self._queued_body(0)
        if body is not None:
            self.take_whole()
        return body

    async def body(self, timeout: float | None) -> AsyncIterator[bytes]:
        """The current message's body chunks as they arrive."""
        while True:
            event = await self.next_event(timeout)
            if isinstance(event, Data):
                yield event.data
            elif event is END_OF_MESSAGE:
                return
            elif event is CONNECTION_CLOSED:
                raise self.side.gone("in the middle of a body")
            else:
                raise self.side.broke(ProtocolError(f"unexpected {type(event).__name__} in a body"))

    # -- sending

    async def send(self, event: Request | Response | InformationalResponse | Data | EndOfMessage) -> None:
        """Frame ``event`` and send it (see the class's note on coalescing). Header names in lower case."""
        if isinstance(event, Data):
            if self.send_data(event.data):
                await self.drain()  # backpressure: the transport holds what went before
        elif isinstance(event, EndOfMessage):
            self._end()
            await self._flush()
        elif isinstance(event, Request):
            self._keep(self._request_head(event))
        elif isinstance(event, Response):
            head = self._out.response_head(event)
            if self.our_state is State.SWITCHED:  # what follows is not HTTP: the answer goes now
                self._pending.append(head)
                self._tunnel = asyncio.StreamReader(limit=READ_HIGH_WATER)
                self._tunnel.set_transport(self.transport)
                if self._eof:
                    self._tunnel.feed_eof()
                if self._reading_paused:
                    self._reading_paused = False
                    self.transport.resume_reading()
                await self._flush()
            else:
                self._keep(head)
        else:
            self._pending.append(self._out.informational_head(event))
            self.they_are_waiting_for_100_continue = False
            await self._flush()

    def send_data(self, data: bytes) -> bool:
        """Body ``data`` of the message being sent, kept back as ``send(Data(data))`` keeps it, without an event
        or a coroutine per piece (a streamed response's every SSE event comes here). True when the caller must
        ``await drain()`` before the next piece: the transport holds too much, or the peer is gone."""
        if data := self._out.body(data):
            self._keep(data)
        return self._lost or self._writing_paused

    async def send_whole(self, head: Request | Response, body: bytes) -> None:
        """A message whose body is all here: ``head``, ``body`` and its end, in one write."""
        if self.write_whole(head, body):
            await self.drain()  # else ``drain`` would return at once: no coroutine for it

    def write_whole(self, head: Request | Response, body: bytes) -> bool:
        """``send_whole`` from a callback: True when the caller must ``drain`` before sending more (the
        transport holds too much, or the peer is gone)."""
        self._pending += self._out.whole(head, body)
        if type(head) is Request:
            self._incoming.head_request = head.method == b"HEAD"
        self.write_pending()
        return self._lost or self._writing_paused

    def _end(self) -> None:
        if last := self._out.end():
            self._pending.append(last)

    def _keep(self, data: bytes) -> None:
        """Hold ``data`` back with the rest of the message, to go out by the time the event loop next waits."""
        if not self._pending:
            self._loop.call_soon(self.write_pending)
        self._pending.append(data)

    def _request_head(self, request: Request) -> bytes:
        head = self._out.request_head(request)
        self._incoming.head_request = request.method == b"HEAD"
        return head

    async def _flush(self) -> None:
        self.write_pending()
        await self.drain()

    async def drain(self) -> None:
        """Wait while the transport holds more than its high-water mark; the side's failure once the peer is
        gone."""
        if self._lost:
            raise self.side.gone()
        if self._writing_paused:
            waiter = self._loop.create_future()
            self._drain_waiters.append(waiter)
            await waiter

    def write_pending(self) -> None:
        """Hand what ``send`` has kept back to the transport, in one write."""
        pending = self._pending
        if pending:
            self._pending = []
            if self.transport.is_closing():
                return
            if len(pending) == 1:
                self.transport.write(pending[0])
            elif sum(map(len, pending)) < JOIN_BELOW:
                self.transport.write(b"".join(pending))
            else:  # a large body goes as it is, with its head, in one vectored write: no copy of it is made
                self.transport.writelines(pending)

    def can_reuse(self) -> bool:
        """Both sides finished the exchange, keep-alive holds and (a client's) the upstream sent nothing after its
        response: ready for the next one."""
        if self.our_state is State.DONE and self.their_state is State.DONE and not self._unasked():
            self._out.reset()
            self.their_state = State.IDLE
            self._incoming.head_request = False
            if self._incoming.switching:  # a refused CONNECT: what followed it is the next request
                self._incoming.resume()
            return True
        return False

    async def close(self) -> None:
        """Close once what was written has gone, and wait for the transport to let go."""
        self.write_pending()
        self.transport.close()
        if self._closed is not None:
            await asyncio.shield(self._closed)

    def abort(self) -> None:
        """Reset the connection (RST, what was not sent yet discarded): a client sees a broken response, never
        a truncated one that looks whole; an upstream sees a request that never completes."""
        self.write_pending()  # what was sent before the reset, as if written at once
        sock = self.transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.transport.abort()
