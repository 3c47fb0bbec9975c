"""The receiving half of an ``HttpConnection`` (gate/connection.py): what arrives, parsed as it arrives
(gate/http1.py), queued as events, and delivered to the connection's reader or, on the express path
(gate/express.py), to a callback.

A reader waiting in ``next_event`` is woken only when an event is ready, and one lazily re-armed timer per
connection bounds its waits; reading pauses while too much waits unread. Every failure of the peer met here is
raised as its side's (``self.side``): the peer breaking the protocol, going silent past its timeout, or closing
in the middle of a message.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Self

from claude_bottle.gate.audit import AuditRecord
from claude_bottle.gate.failures import Blame, ExchangeStopped
from claude_bottle.gate.framing import Outgoing
from claude_bottle.gate.http1 import (
    CONNECTION_CLOSED,
    END_OF_MESSAGE,
    NO_REUSE,
    Broken,
    ConnectionClosed,
    Data,
    Event,
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


class ReceivingHalf:
    """What an ``HttpConnection`` receives: the transport's data, end-of-file, and the reads of its messages
    and body chunks.

    After a CONNECT is answered 2xx, what the client sends is no longer HTTP: ``trailing_data`` holds what came
    before the answer, and ``tunnel_reader`` what comes after, for the tunnel's first-flight check and relay.

    An exchange may also run without a reader (gate/express.py): on a server connection, ``express`` is offered
    each arrival while the reader waits between requests and may take a whole request there and then; until
    that exchange ends (``exchange_done``) or is handed to the reader (``resume``), the reader is not woken. On
    a client connection, ``on_event`` is called in place of waking a reader."""

    # the connection's (gate/connection.py) and the sending half's (gate/sending.py)
    transport: asyncio.Transport
    _loop: asyncio.AbstractEventLoop
    side: Blame
    _out: Outgoing

    def __init__(self, client: bool, max_header_bytes: int) -> None:
        self._incoming = MessageParser(client, max_header_bytes)
        self.their_state = State.IDLE
        self.they_are_waiting_for_100_continue = False
        self._waiter: asyncio.Future[None] | None = None  # the reader, waiting for an event
        self._deadline: float | None = None  # when that wait times out
        self._timer: asyncio.TimerHandle | None = None
        self._unread = 0  # bytes received since the event queue was last empty
        self._reading_paused = False
        self._eof = False  # the peer closed its side
        # (server) called if the peer hangs up (closes or resets) while set: an exchange waiting for its answer
        self.on_hang_up: Callable[[], None] | None = None
        self._tunnel: asyncio.StreamReader | None = None
        # (server) offered each arrival while the reader waits between requests; True: it took the request
        self.express: Callable[[Self], bool] | None = None
        self.in_flight: Callable[[], None] | None = None  # an exchange express took, running: how to abandon it
        self._resume: Resume | None = None  # what the reader gets next, before any request
        self._between_requests = False  # the reader waits in read_request
        self._exchanged_at = 0.0  # when an exchange express took last ended (the loop's clock)
        self.on_event: Callable[[], None] | None = None  # (client) called in place of waking a reader
        self._on_silence: Callable[[], None] | None = None  # (client) and if nothing came by the deadline

    # -- the transport's protocol

    def data_received(self: Self, data: bytes) -> None:
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

    def _hung_up(self) -> None:
        if self.on_hang_up is not None:
            hung_up, self.on_hang_up = self.on_hang_up, None
            hung_up()

    @property
    def hung_up(self) -> bool:
        """The peer closed its side or reset the connection: nothing more will come from it."""
        return self._eof

    def _wake(self) -> None:
        if self.on_event is not None:
            self.on_event()
            return
        waiter = self._waiter
        if waiter is not None and not waiter.done() and self._incoming.events and self.in_flight is None:
            waiter.set_result(None)

    def _start_tunnel(self) -> None:
        """A CONNECT was answered 2xx: what arrives from now on is the tunnel's (``tunnel_reader``)."""
        self._tunnel = asyncio.StreamReader(limit=READ_HIGH_WATER)
        self._tunnel.set_transport(self.transport)
        if self._eof:
            self._tunnel.feed_eof()
        if self._reading_paused:
            self._reading_paused = False
            self.transport.resume_reading()

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
    def has_events(self) -> bool:
        return bool(self._incoming.events)

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

