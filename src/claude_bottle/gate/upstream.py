"""Connecting out: a keep-alive pool for the API upstream, vetted dialling for the proxy. Failures are the
upstream's (gate/failures.py)."""

from __future__ import annotations

import asyncio
import ssl
import time

from claude_bottle.gate.failures import UpstreamSide, upstream_failure
from claude_bottle.gate.http import HttpConnection
from claude_bottle.policy.addresses import IPAddress

STREAM_LIMIT = 256 * 1024  # asyncio stream buffer: larger reads, fewer wake-ups on tunnels
KEEPALIVE_SECONDS = 30.0  # reuse an idle upstream connection only this long: servers close theirs too


async def connect(
    hosts: list[str], port: int, timeout: float, tls: ssl.SSLContext | None = None, server_name: str | None = None
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Connect to the first of ``hosts`` that answers, with TLS if ``tls`` is given. Raises UpstreamSide."""
    last: BaseException | None = None
    for host in hosts:
        try:
            async with asyncio.timeout(timeout):
                return await asyncio.open_connection(host, port, ssl=tls, server_hostname=server_name,
                                                     limit=STREAM_LIMIT)
        except TimeoutError:
            last = UpstreamSide(504, "upstream connect timed out")
        except OSError as exc:  # ssl.SSLError is an OSError
            last = exc
    raise upstream_failure(last if last is not None else OSError("no address to connect to"))


async def dial(
    addresses: list[IPAddress], port: int, timeout: float, tls: ssl.SSLContext | None = None,
    server_name: str | None = None,
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Connect to the first of the vetted ``addresses`` that answers; never to anything else. With ``tls``,
    the upstream's certificate is verified for ``server_name``."""
    return await connect([str(a) for a in addresses], port, timeout, tls, server_name)


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
        if conn.can_reuse():
            self._idle.append((conn, time.monotonic()))
        else:
            conn.abort()  # mid-exchange (a request refused mid-body, a response cut): reset, never finished

    async def aclose(self) -> None:
        for conn, _ in self._idle:
            await conn.close()
        self._idle.clear()
