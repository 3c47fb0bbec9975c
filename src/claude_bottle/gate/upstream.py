"""Connecting out: resolving, a keep-alive pool for the API upstream, vetted dialling for the proxy. Failures are the
upstream's (gate/failures.py)."""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from claude_bottle.gate.connection import HttpConnection, open_http
from claude_bottle.gate.failures import UpstreamSide, upstream_failure
from claude_bottle.gate.resolver import ResolveError, Resolver
from claude_bottle.policy.addresses import IPAddress

STREAM_LIMIT = 256 * 1024  # asyncio stream buffer: larger reads, fewer wake-ups on tunnels
KEEPALIVE_SECONDS = 30.0  # reuse an idle upstream connection only this long: servers close theirs too

T = TypeVar("T")


async def resolve(resolver: Resolver, host: str, port: int, timeout: float) -> list[IPAddress]:
    """``host``'s addresses, by ``resolver``. Raises UpstreamSide: 502 for a DNS failure, 504 past ``timeout``."""
    try:
        async with asyncio.timeout(timeout):
            return await resolver.resolve(host, port)
    except (ResolveError, TimeoutError) as exc:
        raise upstream_failure(exc) from None


async def _first(hosts: list[str], timeout: float, open_one: Callable[[str], Awaitable[T]]) -> T:
    """``open_one`` of the first of ``hosts`` that answers within ``timeout``. Raises UpstreamSide."""
    last: BaseException | None = None
    for host in hosts:
        try:
            async with asyncio.timeout(timeout):
                return await open_one(host)
        except TimeoutError:
            last = UpstreamSide(504, "upstream connect timed out")
        except OSError as exc:  # ssl.SSLError is an OSError
            last = exc
    raise upstream_failure(last if last is not None else OSError("no address to connect to"))


async def connect(
    hosts: list[str], port: int, timeout: float, tls: ssl.SSLContext | None = None, server_name: str | None = None
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Streams to the first of ``hosts`` that answers, with TLS if ``tls`` is given (for tunnels, which relay
    bytes). Raises UpstreamSide."""
    return await _first(hosts, timeout, lambda host: asyncio.open_connection(
        host, port, ssl=tls, server_hostname=server_name, limit=STREAM_LIMIT))


async def connect_http(
    hosts: list[str], port: int, timeout: float, tls: ssl.SSLContext | None = None, server_name: str | None = None
) -> HttpConnection:
    """An HTTP connection to the first of ``hosts`` that answers, with TLS if ``tls`` is given. Raises
    UpstreamSide."""
    return await _first(hosts, timeout, lambda host: open_http(host, port, tls, server_name))


async def dial(
    addresses: list[IPAddress], port: int, timeout: float, tls: ssl.SSLContext | None = None,
    server_name: str | None = None,
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Connect to the first of the vetted ``addresses`` that answers; never to anything else. With ``tls``,
    the upstream's certificate is verified for ``server_name``."""
    return await connect([str(a) for a in addresses], port, timeout, tls, server_name)


async def dial_http(
    addresses: list[IPAddress], port: int, timeout: float, tls: ssl.SSLContext | None = None,
    server_name: str | None = None,
) -> HttpConnection:
    """``dial``, for an HTTP connection."""
    return await connect_http([str(a) for a in addresses], port, timeout, tls, server_name)


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
            if time.monotonic() - since < KEEPALIVE_SECONDS and conn.usable:
                return conn
            conn.transport.close()
        host, port = self._address
        return await connect_http([host], port, self._connect_timeout, self._tls, host if self._tls else None)

    def release(self, conn: HttpConnection) -> None:
        if conn.can_reuse():
            self._idle.append((conn, time.monotonic()))
        else:
            conn.abort()  # mid-exchange (a request refused mid-body, a response cut): reset, never finished

    async def aclose(self) -> None:
        for conn, _ in self._idle:
            await conn.close()
        self._idle.clear()
