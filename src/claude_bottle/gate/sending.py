"""The sending half of an ``HttpConnection`` (gate/connection.py): messages framed by gate/framing.py, their
bytes kept back and written together, and the transport's flow control. Writing waits while the transport
holds more than its high-water mark, and raises the side's failure (``self.side``) once the peer is gone.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from claude_bottle.gate.failures import Blame
from claude_bottle.gate.framing import JOIN_BELOW, Outgoing
from claude_bottle.gate.http1 import (
    Data,
    EndOfMessage,
    InformationalResponse,
    MessageParser,
    Request,
    Response,
    State,
)


class SendingHalf:
    """What an ``HttpConnection`` sends: messages whole or in pieces, the writes of what it kept back, and the
    waits of its flow control.

    Writes are coalesced: the head and body pieces of a message still being sent wait in ``_pending`` and go
    out in one write when the message ends, or at the latest when the event loop next waits (a callback
    scheduled with the first piece), so a streamed body is never held back. Anything else goes at once."""

    # the connection's (gate/connection.py) and the receiving half's (gate/receiving.py)
    transport: asyncio.Transport
    _loop: asyncio.AbstractEventLoop
    side: Blame
    _lost: bool
    _incoming: MessageParser
    they_are_waiting_for_100_continue: bool
    _start_tunnel: Callable[[], None]  # a CONNECT was answered 2xx: what arrives from now on is the tunnel's

    def __init__(self, client: bool) -> None:
        self._out = Outgoing(client)  # our side: what goes next, and its framing (gate/framing.py)
        self._pending: list[bytes] = []  # bytes of the message being sent, not yet written
        self._writing_paused = False  # the transport's buffer is over its high-water mark
        self._drain_waiters: list[asyncio.Future[None]] = []

    @property
    def our_state(self) -> str:
        return self._out.state

    # -- the transport's protocol

    def pause_writing(self) -> None:
        self._writing_paused = True

    def resume_writing(self) -> None:
        self._writing_paused = False
        for waiter in self._drain_waiters:
            if not waiter.done():
                waiter.set_result(None)
        self._drain_waiters.clear()

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
                self._start_tunnel()
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

