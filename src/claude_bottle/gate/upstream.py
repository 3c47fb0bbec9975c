"""Connecting out, and translating every way that can fail into a status and a reason (in one place)."""

from __future__ import annotations

import asyncio
import ssl
from typing import TypeVar

import httpcore

from claude_bottle.gate.resolver import ResolveError
from claude_bottle.gate.scan import SecretReflected
from claude_bottle.policy.addresses import IPAddress

E = TypeVar("E", bound=BaseException)
STREAM_LIMIT = 256 * 1024  # asyncio stream buffer: larger reads, fewer wake-ups on tunnels


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
    if isinstance(exc, httpcore.ConnectTimeout | httpcore.PoolTimeout):
        return UpstreamError(504, "upstream connect timed out")
    if isinstance(exc, httpcore.ReadTimeout | httpcore.WriteTimeout):
        return UpstreamError(504, "upstream stopped responding")
    if isinstance(exc, TimeoutError):
        return UpstreamError(504, "upstream timed out")
    if isinstance(exc, ResolveError):
        return UpstreamError(502, f"DNS failure: {exc}")
    if isinstance(exc, SecretReflected):
        return UpstreamError(502, "upstream response carried the injected credential; not delivered")
    tls = _cause(exc, ssl.SSLError)  # httpcore wraps it in ConnectError, sometimes twice
    if tls is not None:
        hint = " (a private CA? see --extra-ca)" if isinstance(tls, ssl.SSLCertVerificationError) else ""
        return UpstreamError(502, f"TLS failure with upstream: {tls.reason or tls}{hint}")
    if isinstance(exc, httpcore.ConnectError | ConnectionRefusedError):
        return UpstreamError(502, f"cannot connect to upstream: {exc or type(exc).__name__}")
    return UpstreamError(502, f"upstream connection failed: {type(exc).__name__} {exc}".strip())


def _cause(exc: BaseException, kind: type[E]) -> E | None:
    """``exc`` or the first exception of type ``kind`` it was raised from."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, kind):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def api_pool(ssl_context: ssl.SSLContext, max_connections: int) -> httpcore.AsyncConnectionPool:
    """Keep-alive connections to the API upstream, shared by every client of the API listener."""
    return httpcore.AsyncConnectionPool(
        ssl_context=ssl_context,
        max_connections=max_connections,
        max_keepalive_connections=64,
        keepalive_expiry=60.0,
        http1=True,
        http2=False,
    )


async def dial(
    addresses: list[IPAddress], port: int, timeout: float
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Connect to the first of the vetted ``addresses`` that answers; never to anything else."""
    last: BaseException | None = None
    for address in addresses:
        try:
            async with asyncio.timeout(timeout):
                return await asyncio.open_connection(str(address), port, limit=STREAM_LIMIT)
        except (OSError, TimeoutError) as exc:
            last = exc
    raise translate(last if last is not None else OSError("no address to connect to"))
