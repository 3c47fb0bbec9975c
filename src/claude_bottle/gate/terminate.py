"""TLS termination: the gate, not the upstream, completes a tunnel's handshake and serves its requests.

After a CONNECT passes the allowlist, the address guard and the first-flight check (the ClientHello names the
CONNECT host), the gate answers the handshake itself with a leaf for that host from the run's CA (ALPN
http/1.1 only), reads the decrypted requests, and sends each through the forward path (gate/forward.py) to
its own TLS connection to the vetted address. That connection verifies the real upstream against the
system store plus the configured extra CAs, for the CONNECT host, and is kept alive across the tunnel's
requests. Each request is one audit line: method, host, path, decision and reason.

Inside the session, a request must be in origin form and its Host must name the tunnel's host: one
certificate cannot be used to reach another site behind the same front (domain fronting by Host header).

The ClientHello was read by the first-flight check, so it is no longer in the client's stream; asyncio
cannot start TLS over bytes already read. So the tunnel's raw bytes (those first) are relayed into one end
of a socket pair and TLS is served on the other: one extra local copy, and the TLS layer sees the client's
bytes exactly as sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass

from claude_bottle.gate.audit import AuditRecord
from claude_bottle.gate.connection import HttpConnection
from claude_bottle.gate.context import GateContext
from claude_bottle.gate.failures import ClientSide, Refused
from claude_bottle.gate.forward import forward, outbound, set_headers
from claude_bottle.gate.http1 import Request, State, header_values
from claude_bottle.gate.inspection import answered, inspected
from claude_bottle.gate.request_loop import Exchange, serve_requests
from claude_bottle.gate.tunnel import Traffic, TunnelIdle, relay
from claude_bottle.gate.upstream import STREAM_LIMIT, Dialer
from claude_bottle.policy.addresses import IPAddress
from claude_bottle.policy.decide import Decision
from claude_bottle.policy.hosts import InvalidHost, Target, normalize_host, parse_port, split_host_port

HANDSHAKE_TIMEOUT = 10.0
CLOSE_TIMEOUT = 2.0  # after the last request: the TLS close_notify, then the tunnel goes


def authority(target: Target, default_port: int) -> str:
    """``target`` as a Host header names it: the port only when it is not ``default_port``."""
    host = f"[{target.host}]" if ":" in target.host else target.host
    return host if target.port == default_port else f"{host}:{target.port}"


def host_problem(request: Request, target: Target) -> str | None:
    """Why a request inside the tunnel to ``target`` names another site, or None. Origin form only; the
    Host header (required on HTTP/1.1: gate/http1.py enforces it) must name the tunnel's host and port (443 if none)."""
    if not request.target.startswith(b"/"):
        return "requests inside a tunnel must use an origin-form target (/path)"
    hosts = header_values(request.headers, b"host")
    if len(hosts) != 1:
        return "a request inside a tunnel needs exactly one Host header"
    try:
        host, port = split_host_port(hosts[0].decode("ascii"))
        name, _ = normalize_host(host)
        named = (name, parse_port(port, "Host header") if port else 443)
    except (InvalidHost, ValueError):
        return f"Host header {hosts[0][:80].decode('ascii', 'replace')!r} is not a host"
    if named != (target.host, target.port):
        return f"Host header {hosts[0][:80].decode('ascii', 'replace')} does not match the tunnel's host {target}"
    return None


@dataclass
class KeptOrigin:
    """The tunnel's one upstream connection: dialled on first use, kept while the exchanges leave it
    reusable, dialled again after one that does not."""

    addresses: list[IPAddress]
    target: Target
    tls: ssl.SSLContext
    dialer: Dialer
    conn: HttpConnection | None = None

    @contextlib.asynccontextmanager
    async def use(self) -> AsyncIterator[HttpConnection]:
        if self.conn is not None and not self.conn.usable:
            await self.aclose()
        if self.conn is None:
            self.conn = await self.dialer.http(self.target.host, [str(a) for a in self.addresses], self.target.port,
                                               self.tls, self.target.host)
        try:
            yield self.conn
        finally:
            if not self.conn.can_reuse():
                await self.aclose()

    async def aclose(self) -> None:
        conn, self.conn = self.conn, None
        if conn is not None:
            conn.abort()  # mid-exchange or spent: nothing more is owed to the upstream


async def terminate(conn: HttpConnection, early: bytes, target: Target, origin: KeptOrigin, record: AuditRecord,
                    ctx: GateContext, client_tls: ssl.SSLContext) -> None:
    """Serve the tunnel on ``conn`` (``early``: the bytes the first-flight check read, the ClientHello)
    until either side ends it, each request to ``origin``. ``record`` is the CONNECT's: it gets the tunnel's
    bytes and how it ended."""
    limits = ctx.config.limits
    loop = asyncio.get_running_loop()
    outer, inner = socket.socketpair()
    traffic = Traffic()
    pair_reader, pair_writer = await asyncio.open_connection(sock=outer, limit=STREAM_LIMIT)
    if early:
        pair_writer.write(early)
        traffic.up += len(early)

    handshake_failed: ClientSide | None = None  # raised once the tunnel is wound down, to be answered

    async def serve_tls() -> None:
        tls_conn = HttpConnection(max_header_bytes=limits.max_header_bytes)
        try:
            # (uvloop returns its TLS protocol here, not the one made for the connection: hence tls_conn.)
            transport, _ = await loop.connect_accepted_socket(lambda: tls_conn, inner, ssl=client_tls,
                                                              ssl_handshake_timeout=HANDSHAKE_TIMEOUT)
        except (OSError, TimeoutError) as exc:
            nonlocal handshake_failed
            handshake_failed = ClientSide(0, f"TLS handshake with the client failed: {_tls_reason(exc)}")
            inner.close()
            return
        tls_conn.peer = conn.peer
        exchange = _exchange(target, origin, ctx, record.would_deny, record.unlisted)
        try:
            await serve_requests(tls_conn, "proxy", exchange, ctx)
        finally:
            await origin.aclose()
            if tls_conn.our_state is State.SEND_BODY:
                tls_conn.abort()
            else:
                # Abort only a close that did not finish: a closed transport has let its TLS protocol go, and
                # aborting it then raises in the gate image's Python (3.11.2).
                try:
                    async with asyncio.timeout(CLOSE_TIMEOUT):
                        await tls_conn.close()
                except TimeoutError:
                    transport.abort()

    # The requests' own timeouts (head, idle body or response) end a quiet session first; the relay's
    # timer is only the backstop, so it must not fire while a request is merely waiting on one side.
    backstop = 2 * max(limits.idle_timeout, limits.header_timeout) + HANDSHAKE_TIMEOUT

    async def carry() -> None:
        try:
            await relay((conn.tunnel_reader, conn.transport), (pair_reader, pair_writer.transport), traffic,
                        backstop)
        except TunnelIdle:
            record.note("closed idle tunnel")
        except OSError:
            pass  # a reset on either side ends the tunnel

    record.note("TLS terminated by the gate, each request audited")
    try:
        async with asyncio.TaskGroup() as tasks:
            relayed = tasks.create_task(carry())
            served = tasks.create_task(serve_tls())
            await served
            with contextlib.suppress(TimeoutError):  # let the last bytes (close_notify) reach the client
                async with asyncio.timeout(CLOSE_TIMEOUT):
                    await asyncio.shield(relayed)
            relayed.cancel()
    finally:
        record.bytes_up, record.bytes_down = traffic.up, traffic.down
        pair_writer.close()
        inner.close()
    if handshake_failed is not None:
        raise handshake_failed


def _exchange(target: Target, origin: KeptOrigin, ctx: GateContext, learned: bool = False, unlisted: bool = False
              ) -> Exchange:
    """The exchange for each request inside the tunnel: the Host check, then the forward path. ``learned``:
    the tunnel passed by learn mode only, and so does each request in it (audited as would_deny);
    ``unlisted``: its target is in no allowlist, and so is each request's (audited as unlisted). The filters
    are the tunnel's, made once (they keep nothing of a request between calls)."""
    request_filters = [set_headers(frozenset({b"host"}), [(b"host", authority(target, 443).encode())]),
                       *inspected(target, ctx)]
    response_filters = answered(target, ctx)

    async def exchange(conn: HttpConnection, request: Request, record: AuditRecord, ctx: GateContext) -> None:
        idle = ctx.config.limits.idle_timeout
        record.target = str(target)
        record.path = request.target.split(b"?", 1)[0].decode("ascii", "replace")
        if b"#" in request.target:  # as in plain HTTP: some servers read what follows as part of the query
            raise Refused(400, "a fragment (#) does not belong in a request target")
        problem = host_problem(request, target)
        if problem is not None:
            raise Refused(421, problem)
        record.decided(Decision(True, f"inspected request in a tunnel to {target}"
                                      f"{' (learn mode: would deny)' if learned else ''}", learned=learned,
                                 unlisted=unlisted))
        await forward(conn, outbound(conn, request, request.target, idle, ctx.proxy_bodies), origin.use, record, idle,
                      request_filters, response_filters)

    return exchange


def _tls_reason(exc: BaseException) -> str:
    if isinstance(exc, ssl.SSLError):
        return str(exc.reason or exc)
    if isinstance(exc, TimeoutError):
        return f"no handshake within {HANDSHAKE_TIMEOUT:g}s"
    return str(exc) or type(exc).__name__

