"""Connecting out, and translating every way that can fail into a status and a reason (in one place)."""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import Awaitable
from typing import TypeVar

import h11

from claude_bottle.gate.http import ClientGone, ClientProtocolError, HttpConnection
from claude_bottle.gate.resolver import ResolveError
from claude_bottle.gate.scan import SecretReflected
from claude_bottle.policy.addresses import IPAddress

E = TypeVar("E", bound=BaseException)
T = TypeVar("T")
STREAM_LIMIT = 256 * 1024  # asyncio stream buffer: larger reads, fewer wake-ups on tunnels
KEEPALIVE_SECONDS = 30.0  # reuse an idle upstream connection only this long: servers close theirs too


class UpstreamError(Exception):
    """A failure on the way out, already translated for the client."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


def translate(exc: BaseException) -> UpstreamError:
    """502 for a broken or refused upstream, 504 for one that did not answer in time."""
    if isinstance(exc, UpstreamError):
        return exc
    if isinstance(exc, TimeoutError):
        return UpstreamError(504, "upstream stopped responding")
    if isinstance(exc, ResolveError):
        return UpstreamError(502, f"DNS failure: {exc}")
    if isinstance(exc, SecretReflected):
        return UpstreamError(502, "upstream response carried the injected credential; not delivered")
    tls = _cause(exc, ssl.SSLError)
    if tls is not None:
        hint = " (a private CA? see --extra-ca)" if isinstance(tls, ssl.SSLCertVerificationError) else ""
        return UpstreamError(502, f"TLS failure with upstream: {tls.reason or tls}{hint}")
    if isinstance(exc, ConnectionRefusedError):
        return UpstreamError(502, f"cannot connect to upstream: {exc.strerror or exc}")
    return UpstreamError(502, f"upstream connection failed: {type(exc).__name__} {exc}".strip())


def _cause(exc: BaseException, kind: type[E]) -> E | None:
    """``exc`` or the first exception of type ``kind`` it was raised from."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, kind):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


async def from_upstream(step: Awaitable[T]) -> T:
    """Run one step on an upstream connection: its protocol errors are the upstream's fault, not the client's."""
    try:
        return await step
    except (ClientProtocolError, ClientGone) as exc:
        raise UpstreamError(502, f"upstream broke HTTP/1.1: {exc}") from None


async def connect(
    hosts: list[str], port: int, timeout: float, tls: ssl.SSLContext | None = None, server_name: str | None = None
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Connect to the first of ``hosts`` that answers, with TLS if ``tls`` is given. Raises UpstreamError."""
    last: BaseException | None = None
    for host in hosts:
        try:
            async with asyncio.timeout(timeout):
                return await asyncio.open_connection(host, port, ssl=tls, server_hostname=server_name,
                                                     limit=STREAM_LIMIT)
        except TimeoutError:
            last = UpstreamError(504, "upstream connect timed out")
        except OSError as exc:  # ssl.SSLError is an OSError
            last = exc
    raise translate(last if last is not None else OSError("no address to connect to"))


async def dial(
    addresses: list[IPAddress], port: int, timeout: float
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Connect to the first of the vetted ``addresses`` that answers; never to anything else."""
    return await connect([str(a) for a in addresses], port, timeout)


class UpstreamPool:
    """Keep-alive HTTP/1.1 connections to the one API upstream, shared by every client of the API listener.

    A connection returns to the pool only after a complete exchange, and is reused only while it is fresh
    and the server has not closed it.
    """

    def __init__(self, scheme: str, host: str, port: int, tls: ssl.SSLContext, connect_timeout: float) -> None:
        self._address = (host, port)
        self._tls = tls if scheme == "https" else None
        self._connect_timeout = connect_timeout
        self._idle: list[tuple[HttpConnection, float]] = []

    async def acquire(self) -> HttpConnection:
        while self._idle:
            conn, since = self._idle.pop()
            fresh = time.monotonic() - since < KEEPALIVE_SECONDS
            if fresh and not conn.reader.at_eof() and not conn.writer.is_closing():
                return conn
            conn.writer.close()
        host, port = self._address
        reader, writer = await connect([host], port, self._connect_timeout, self._tls,
                                       host if self._tls else None)
        return HttpConnection(reader, writer, client=True)

    def release(self, conn: HttpConnection) -> None:
        if conn.h11.our_state is h11.DONE and conn.h11.their_state is h11.DONE:
            conn.h11.start_next_cycle()
            self._idle.append((conn, time.monotonic()))
        else:
            conn.writer.close()

    async def aclose(self) -> None:
        for conn, _ in self._idle:
            await conn.close()
        self._idle.clear()
