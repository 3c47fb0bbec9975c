"""Where ``HttpConnection``s (gate/connection.py) come from: a server whose every accepted connection is one,
served in a task of its own, and a client connection to an upstream, directly or over a socket already
connected (a tunnel through the upstream proxy)."""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import Callable, Coroutine
from typing import Any

from claude_bottle.gate.connection import HttpConnection
from claude_bottle.gate.http1 import MAX_HEADER_BYTES


async def serve_http(handle: Callable[[HttpConnection], Coroutine[Any, Any, None]], host: str, port: int,
                     tls: ssl.SSLContext | None = None, max_header_bytes: int = MAX_HEADER_BYTES) -> asyncio.Server:
    """A server whose every connection is an ``HttpConnection`` served by ``handle``, in a task of its own
    that the connection holds (as ``asyncio.start_server`` does for streams)."""
    return await asyncio.get_running_loop().create_server(
        lambda: _Served(handle, max_header_bytes), host, port, ssl=tls)


class _Served(HttpConnection):
    """A server's connection: ``handle`` starts on it as soon as the connection is made."""

    def __init__(self, handle: Callable[[HttpConnection], Coroutine[Any, Any, None]], max_header_bytes: int
                 ) -> None:
        super().__init__(max_header_bytes=max_header_bytes)
        self._handle = handle
        self.task: asyncio.Task[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self.task = asyncio.get_running_loop().create_task(self._handle(self))


async def open_http(host: str, port: int, tls: ssl.SSLContext | None = None, server_name: str | None = None
                    ) -> HttpConnection:
    """A client ``HttpConnection`` to ``host``:``port`` (with TLS for ``server_name`` if ``tls`` is given)."""
    conn = HttpConnection(client=True)  # made here: with TLS, uvloop may hand back its own protocol instead
    await asyncio.get_running_loop().create_connection(lambda: conn, host, port, ssl=tls, server_hostname=server_name)
    return conn


async def open_http_on(sock: socket.socket, tls: ssl.SSLContext | None = None, server_name: str | None = None
                       ) -> HttpConnection:
    """``open_http`` over ``sock``, already connected (a tunnel through the upstream proxy)."""
    conn = HttpConnection(client=True)
    await asyncio.get_running_loop().create_connection(lambda: conn, sock=sock, ssl=tls, server_hostname=server_name)
    return conn
