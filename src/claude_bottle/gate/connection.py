"""One HTTP/1.1 connection as an asyncio protocol: the I/O around the parser (gate/http1.py), its timers and
its flow control, for both sides of every exchange (and the stub upstream). Its two halves are
gate/receiving.py (what arrives, parsed as it arrives, and the reads of it) and gate/sending.py (what the gate
frames, written together, and the waits of flow control); this module holds what both share: the
transport's start and end, the connection's reuse, and its close.

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

from claude_bottle.gate.failures import BLAME_CLIENT, BLAME_UPSTREAM
from claude_bottle.gate.http1 import MAX_HEADER_BYTES, State
from claude_bottle.gate.receiving import ReceivingHalf
from claude_bottle.gate.sending import SendingHalf


class HttpConnection(ReceivingHalf, SendingHalf, asyncio.Protocol):
    """One HTTP/1.1 connection, as a server (the default: the peer is the client) or, with ``client``, as a
    client (the peer is the upstream): read messages and body chunks (``ReceivingHalf``), send messages
    (``SendingHalf``). ``side`` is the peer's side, whose failures the connection raises. It is the
    transport's protocol: what arrives is parsed as it arrives, and a reader waiting in ``next_event`` is woken
    only when an event is ready."""

    def __init__(self, *, client: bool = False, max_header_bytes: int = MAX_HEADER_BYTES) -> None:
        ReceivingHalf.__init__(self, client, max_header_bytes)
        SendingHalf.__init__(self, client)
        self.client = client
        self.side = BLAME_UPSTREAM if client else BLAME_CLIENT
        self.transport: asyncio.Transport = None  # type: ignore[assignment]  # set by connection_made
        self._loop: asyncio.AbstractEventLoop = None  # type: ignore[assignment]  # likewise
        self.peer = "unknown"
        self.json_errors = False  # refusals as Anthropic API error bodies (the API listener) instead of text
        self._lost = False
        self._closed: asyncio.Future[None] | None = None

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The connection's event loop (``asyncio.get_running_loop`` asks the OS for the process id each call
        before Python 3.12: this does not)."""
        return self._loop

    # -- the transport's protocol (and data_received, eof_received, pause_writing, resume_writing: the halves')

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self._loop = asyncio.get_running_loop()
        self._closed = self._loop.create_future()
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else "unknown"

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

    # -- the connection's state

    @property
    def ready_for_express(self) -> bool:
        """The peer has not hung up and nothing holds back a write now: what the connection sends goes at once."""
        return not (self._eof or self._writing_paused or self._reading_paused)

    @property
    def usable(self) -> bool:
        """Neither side has closed the connection, and (a client's) the upstream has sent nothing since the
        last response ended: a kept-alive one may be used again."""
        return not self._eof and not self.transport.is_closing() and not self._unasked()

    def _unasked(self) -> bool:
        """(client) Bytes of a response no request asked for have arrived: an upstream that sends them would
        have each later request on the connection answered with the response to the one before it."""
        return self.client and (bool(self._incoming.events) or self._incoming.head_started)

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

    # -- the end

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
