"""Connecting out: resolving, the one dialer (direct or through the upstream proxy), a keep-alive pool for
the API upstream. Failures are the upstream's (gate/failures.py)."""

from __future__ import annotations

import asyncio
import socket
import ssl
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from claude_bottle.gate.connection import HttpConnection
from claude_bottle.gate.endpoints import open_http, open_http_on
from claude_bottle.gate.failures import UpstreamSide, upstream_failure
from claude_bottle.gate.resolver import ResolveError, Resolver
from claude_bottle.gate.upstream_proxy import UpstreamProxy, open_tunnel, unreachable
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


class Dialer:
    """The one place the gate connects out: to a destination's vetted addresses directly, or through the
    upstream proxy (``proxy``) for every name its ``NO_PROXY`` does not exempt. The caller has decided the
    destination already, so nothing reaches the proxy for a refused one. Every failure is an UpstreamSide;
    through the proxy, one that names the proxy (gate/upstream_proxy.py)."""

    def __init__(self, timeout: float, proxy: UpstreamProxy | None = None) -> None:
        self.timeout = timeout  # for the whole connect: TCP, the proxy's CONNECT, TLS
        self.proxy = proxy

    def via(self, name: str) -> UpstreamProxy | None:
        """The proxy connections to ``name`` go through, or None when they are dialled directly."""
        return None if self.proxy is None or self.proxy.bypasses(name) else self.proxy

    async def streams(
        self, name: str, hosts: list[str], port: int, tls: ssl.SSLContext | None = None,
        server_name: str | None = None,
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """Streams to ``name``:``port`` (for tunnels, which relay bytes): directly to the first of ``hosts``
        (its vetted addresses, or the name itself) that answers, or through the proxy; with TLS if ``tls``."""
        proxy = self.via(name)
        if proxy is None:
            return await _first(hosts, self.timeout, lambda host: asyncio.open_connection(
                host, port, ssl=tls, server_hostname=server_name, limit=STREAM_LIMIT))

        async def through(sock: socket.socket) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
            return await asyncio.open_connection(sock=sock, ssl=tls, server_hostname=server_name,
                                                 limit=STREAM_LIMIT)

        return await self._through(proxy, name, port, through)

    async def http(
        self, name: str, hosts: list[str], port: int, tls: ssl.SSLContext | None = None,
        server_name: str | None = None,
    ) -> HttpConnection:
        """``streams``, as an HTTP connection."""
        proxy = self.via(name)
        if proxy is None:
            return await _first(hosts, self.timeout, lambda host: open_http(host, port, tls, server_name))
        return await self._through(proxy, name, port, lambda sock: open_http_on(sock, tls, server_name))

    async def check(self, name: str, port: int) -> None:
        """Through the proxy (if ``name`` goes through one), open a tunnel to ``name``:``port`` and close it:
        the proxy answers and takes the gate's credentials. Raises UpstreamSide naming the proxy."""
        proxy = self.via(name)
        if proxy is not None:
            sock = await self._through(proxy, name, port, _opened)
            sock.close()

    async def proxy_http(self, proxy: UpstreamProxy) -> HttpConnection:
        """An HTTP connection to ``proxy`` itself, for a plain-HTTP request in absolute form."""
        try:
            async with asyncio.timeout(self.timeout):
                return await open_http(proxy.host, proxy.port)
        except TimeoutError:
            raise UpstreamSide(504, f"the upstream proxy {proxy.address} did not answer within {self.timeout:g}s"
                               ) from None
        except OSError as exc:
            raise unreachable(proxy, exc) from None

    async def _through(self, proxy: UpstreamProxy, name: str, port: int,
                       layer: Callable[[socket.socket], Awaitable[T]]) -> T:
        sock: socket.socket | None = None
        try:
            async with asyncio.timeout(self.timeout):
                sock = await open_tunnel(proxy, name, port)
                return await layer(sock)
        except TimeoutError:
            if sock is not None:
                sock.close()
            raise UpstreamSide(504, f"no connection to {name}:{port} through the upstream proxy {proxy.address} within "
                                    f"{self.timeout:g}s") from None
        except OSError as exc:  # TLS with the destination, through the tunnel
            if sock is not None:
                sock.close()
            raise upstream_failure(exc) from None


async def _opened(sock: socket.socket) -> socket.socket:
    return sock


class UpstreamPool:
    """Keep-alive HTTP/1.1 connections to the one API upstream, shared by every client of the API listener.

    A connection returns to the pool only after a complete exchange, and is reused only while it is fresh
    and the server has not closed it.
    """

    def __init__(self, scheme: str, host: str, port: int, tls: ssl.SSLContext, dialer: Dialer) -> None:
        self._address = (host, port)
        self._tls = tls if scheme == "https" else None
        self._dialer = dialer
        self._idle: list[tuple[HttpConnection, float]] = []

    def idle(self) -> HttpConnection | None:
        """A kept-alive connection ready for the next exchange, if the pool holds one (stale ones are closed)."""
        while self._idle:
            conn, since = self._idle.pop()
            if time.monotonic() - since < KEEPALIVE_SECONDS and conn.usable:
                return conn
            conn.transport.close()
        return None

    async def acquire(self) -> HttpConnection:
        """``idle``, else a new connection."""
        if (conn := self.idle()) is not None:
            return conn
        host, port = self._address
        # Through an upstream proxy by CONNECT, even to a plain-HTTP upstream (a test's stub): the credential
        # goes inside the tunnel, not in a request the proxy reads.
        return await self._dialer.http(host, [host], port, self._tls, host if self._tls else None)

    def release(self, conn: HttpConnection) -> None:
        if conn.can_reuse():
            self._idle.append((conn, time.monotonic()))
        else:
            conn.abort()  # mid-exchange (a request refused mid-body, a response cut): reset, never finished

    async def aclose(self) -> None:
        for conn, _ in self._idle:
            await conn.close()
        self._idle.clear()
