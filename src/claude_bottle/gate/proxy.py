"""The proxy listener: what HTTPS_PROXY / HTTP_PROXY point at.

CONNECT tunnels and absolute-form plain-HTTP requests, each decided twice: the name against the allowlist,
then every resolved address against the address guard. A name is resolved only once it is allowed: one the
allowlist refuses, or that waits for the user's answer, is never looked up, since the lookup would carry it to a
DNS server the bottle may choose (exfiltration in the name). The gate dials exactly an address it vetted. No
credential is added to this traffic, except a credential route's on the terminated requests to its bound
hosts (gate/inspection.py), which are reached over terminated TLS only, and an upstream proxy's on the
plain-HTTP requests sent to it, whose answers are then searched for it as a route's are.

A tunnel is decided a third time on its first flight: after the 200, nothing goes upstream until the
client's first bytes are a TLS ClientHello naming the CONNECT host (unless raw TCP is allowed there), so an
allowed host on a shared front cannot carry a connection to another site. A plain-HTTP request's Host
header must name the URL's host for the same reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import ssl
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

from claude_bottle.gate.ask import BY_LIMIT, BY_TIMEOUT, DENY_ONCE
from claude_bottle.gate.audit import OPAQUE, RAW_TCP, TERMINATED, AuditRecord
from claude_bottle.gate.ca import HostNotPermitted
from claude_bottle.gate.connection import HttpConnection
from claude_bottle.gate.context import GateContext
from claude_bottle.gate.failures import Refused
from claude_bottle.gate.forward import Inbound, ResponseFilter, forward, outbound, set_headers
from claude_bottle.gate.http1 import ProtocolError, Request, Response, State, header_values
from claude_bottle.gate.inspection import IDENTITY, answered, identity_only, inspected, reflection_scan
from claude_bottle.gate.receiving import READ_SIZE
from claude_bottle.gate.routes import bound_elsewhere, route_for
from claude_bottle.gate.terminate import KeptOrigin, authority, terminate
from claude_bottle.gate.tls import BadHello, NotTls, read_client_hello, wanted
from claude_bottle.gate.tunnel import Traffic, TunnelIdle, relay
from claude_bottle.gate.upstream import Dialer, resolve
from claude_bottle.gate.upstream_proxy import UpstreamProxy, refusal
from claude_bottle.policy.addresses import IPAddress
from claude_bottle.policy.decide import Decision, allow_entry, decide_server_name
from claude_bottle.policy.hosts import (
    InvalidHost,
    Target,
    normalize_host,
    parse_authority,
    parse_port,
    split_host_port,
)


def parse_proxy_target(method: str, raw: bytes) -> tuple[Target, str]:
    """The destination and, for plain HTTP, the origin-form path to send. Raises ProtocolError for
    anything that does not parse, so nothing unparsed goes further."""
    try:
        target = raw.decode("ascii")
        if method == "CONNECT":
            return parse_authority(target), ""
        if not target.lower().startswith("http://"):
            if target.lower().startswith("https://"):
                raise ProtocolError("use CONNECT for https:// URLs")
            raise ProtocolError("this is a forward proxy: send CONNECT host:port or an absolute http:// URL")
        parts = urlsplit(target)
        if parts.username is not None or parts.password is not None:
            raise ProtocolError("credentials in the URL are not allowed")
        if parts.fragment or "#" in target:
            raise ProtocolError("a fragment (#) does not belong in a request target")
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        if not path.startswith("/"):
            raise ProtocolError(f"the URL's path {path[:40]!r} must start with '/'")
        return parse_host_header(parts.netloc, "URL"), path
    except (InvalidHost, ValueError) as exc:  # urlsplit and decode raise ValueError subclasses
        reason = exc if isinstance(exc, InvalidHost | ProtocolError) else f"unparsable request target ({exc})"
        raise ProtocolError(str(reason)) from None


def parse_host_header(authority: str, what: str) -> Target:
    """``host[:port]`` of a URL or a Host header; the port defaults to 80."""
    host, port = split_host_port(authority)
    if not host:
        raise InvalidHost(f"the {what} has no host")
    name, ip = normalize_host(host)
    return Target(name, parse_port(port, "target") if port else 80, ip)


def check_host_header(request: Request, target: Target) -> None:
    """A plain-HTTP request's Host header must name the URL's authority (HTTP/1.0 may leave it out): the
    gate decides on the URL, and a different Host would reach another site behind the same address."""
    hosts = header_values(request.headers, b"host")
    if not hosts:
        return  # HTTP/1.1 requires Host (gate/http1.py); the gate sends the URL's authority as Host
    if len(hosts) > 1:
        raise ProtocolError("more than one Host header")
    try:
        named = parse_host_header(hosts[0].decode("ascii"), "Host header")
    except (InvalidHost, ValueError):
        raise ProtocolError(f"Host header {hosts[0][:80].decode('ascii', 'replace')!r} is not a host") from None
    if (named.host, named.port) != (target.host, target.port):
        raise ProtocolError(f"Host header {named} does not match the URL's host {target}")


def check_connect_framing(request: Request) -> None:
    """A CONNECT carries no body: bytes after its head belong to the tunnel. One that declares a body is
    ambiguous (a body to one reader, tunnel bytes to another), so it is refused."""
    lengths = header_values(request.headers, b"content-length")
    if header_values(request.headers, b"transfer-encoding") or any(v.strip() != b"0" for v in lengths):
        raise ProtocolError("a CONNECT request declares a body (Content-Length or Transfer-Encoding)")


async def vetted_addresses(target: Target, record: AuditRecord, ctx: GateContext) -> list[IPAddress]:
    """Resolve (unless an IP literal) and keep the addresses the policy allows; ``Refused`` if none is."""
    if target.ip is not None:
        candidates = [target.ip]
    else:
        candidates = await resolve(ctx.resolver, target.host, target.port, ctx.config.limits.connect_timeout)
    allowed: list[tuple[IPAddress, Decision]] = []
    refusals: list[tuple[IPAddress, Decision]] = []
    for address in candidates:
        decision = ctx.egress.decide_address(address, target.port)
        (allowed if decision.allow else refusals).append((address, decision))
    if not allowed:
        raise Refused.by(refusals[0][1])
    record.passed(allowed[0][1])
    return [address for address, _ in allowed]


async def proxy_exchange(conn: HttpConnection, request: Request, record: AuditRecord, ctx: GateContext) -> None:
    limits = ctx.config.limits
    method = request.method.decode("ascii")
    try:
        target, path = parse_proxy_target(method, request.target)
        record.target = str(target)
        if method == "CONNECT":
            check_connect_framing(request)
        else:
            check_host_header(request, target)
    except ProtocolError as exc:
        # What follows a CONNECT head is not HTTP: answer and close.
        raise Refused(400, str(exc), close=method == "CONNECT") from None

    if (elsewhere := bound_elsewhere(ctx.config.routes, target)) is not None:  # refused before it is asked about
        ports = ", ".join(str(port) for host, port in elsewhere.spec.hosts if host == target.host)
        raise Refused(403, f"{target.host} is bound to credential route {elsewhere.spec.name} on port {ports}: it "
                           f"is reached there only, never on port {target.port}", close=method == "CONNECT")
    decision = ctx.egress.decide_tunnel(target) if method == "CONNECT" else ctx.egress.decide_target(target)
    if not decision.allow and decision.unlisted and ctx.asks is not None:
        if target.ip is not None:  # an address: the guard first, never ask about what it refuses
            await vetted_addresses(target, record, ctx)
        # A name is looked up only once the user allows it: the lookup alone would carry the name, which the
        # bottle chose (``<data>.attacker.example``), to that domain's DNS server, whatever the answer.
        decision = await approval(target, method, path, conn.peer, record, ctx)
    if not decision.allow:
        raise Refused.by(decision)
    record.decided(decision)
    route = route_for(ctx.config.routes, target)
    if route is not None and method != "CONNECT":
        raise Refused(403, f"{target} is bound to credential route {route.spec.name}, which is reached over TLS "
                           "only (https://), never plain HTTP")
    proxy = ctx.dialer.via(target.host) if method != "CONNECT" else None
    if method == "TRACE" and proxy is not None and proxy.authorization is not None:
        # The proxy, or a server it hands the header on to, answers a TRACE with the request it received.
        raise Refused(405, f"TRACE through the upstream proxy {proxy.address} would carry its credentials, which "
                           "the answer echoes (RFC 9110 9.3.8): the gate sends no TRACE there")
    if not ctx.tunnels.take():
        raise Refused(503, f"too many concurrent tunnels (limit {ctx.tunnels.limit})")
    try:
        addresses = await vetted_addresses(target, record, ctx)
        if method == "CONNECT":
            client_tls = terminating(target, ctx, record)
            if client_tls is None:
                upstream = await ctx.dialer.streams(target.host, _hosts(addresses), target.port)
                await _tunnel(conn, target, record, ctx, upstream=upstream)
            else:
                kept = await ctx.dialer.http(target.host, _hosts(addresses), target.port, ctx.upstream_tls,
                                             target.host)
                origin = KeptOrigin(addresses, target, ctx.upstream_tls, ctx.dialer, kept)
                await _tunnel(conn, target, record, ctx, origin=origin, client_tls=client_tls)
        else:
            record.path = path.split("?", 1)[0]
            host = authority(target, 80)
            request_filters = [set_headers(frozenset({b"host"}), [(b"host", host.encode()),
                                                                   (b"connection", b"close")]),
                               *inspected(target, ctx)]
            response_filters = answered(target, ctx)
            sent = path
            if proxy is not None:  # absolute form to the upstream proxy, its credentials last (after DLP)
                sent = f"http://{host}{path}"
                checks: list[ResponseFilter] = []
                if proxy.authorization is not None:
                    # A proxy's error page, or a server it hands the header on to, may echo the credentials:
                    # the answer comes unencoded and is searched for them, as a credential route's is.
                    request_filters.append(set_headers(frozenset({b"accept-encoding"}),
                                                       [(b"proxy-authorization", proxy.authorization), *IDENTITY]))
                    checks = [identity_only, reflection_scan(ctx.config.reflected_forms)]
                response_filters = [_proxy_answer(proxy, f"{method} {sent[:80]}"), *checks, *response_filters]
            await forward(conn, outbound(conn, request, sent.encode(), limits.idle_timeout, ctx.proxy_bodies),
                          lambda: dialled(ctx.dialer, addresses, target), record,
                          limits.idle_timeout, request_filters, response_filters)
    finally:
        ctx.tunnels.release()


async def approval(target: Target, method: str, path: str, client: str, record: AuditRecord, ctx: GateContext
                   ) -> Decision:
    """Ask mode: hold the request for a target outside the allowlist until the host answers (gate/ask.py), then
    decide it by the policy as the answer left it (so the checks after the allowlist still apply: a CONNECT to
    port 80, the addresses again, rules and DLP on inspected requests). A refusal when the asks are full, the
    approval timed out, or the host denied it. The record carries the question, the answer and who gave it."""
    asks = ctx.asks
    assert asks is not None
    hint = f"run `claude-bottle allow {allow_entry(target)}` on the host, or answer when asked"
    connect = method == "CONNECT"
    question = asks.question(target, "connect" if connect else "http", client, None if connect else method,
                             None if connect else path.split("?", 1)[0])
    if question is None:
        record.answer, record.by = DENY_ONCE, BY_LIMIT
        return Decision(False, f"{target} is not in the allowlist and {asks.limit} destinations already wait for the "
                               "user's approval (the ask limit): refused without asking", unlisted=True, hint=hint)
    record.ask = question.id
    answer = await asks.wait(question)
    record.answer, record.by = answer.answer, answer.by
    if answer.by == BY_TIMEOUT:
        return Decision(False, f"{target} is not in the allowlist and the approval timed out: nobody answered within "
                               f"{asks.timeout:g}s (ask mode)", unlisted=True, hint=hint)
    if not answer.allow:
        return Decision(False, f"{target} was refused by the user when asked ({answer.answer} by {answer.by})",
                        hint=f"run `claude-bottle allow {allow_entry(target)}` on the host")
    decision = ctx.egress.decide_tunnel(target) if connect else ctx.egress.decide_target(target)
    if not decision.allow:
        return decision
    return dataclasses.replace(decision, reason=f"{target} approved by the user ({answer.answer} by {answer.by} "
                                                f"after {answer.waited:g}s); {decision.reason}")


def _hosts(addresses: list[IPAddress]) -> list[str]:
    return [str(address) for address in addresses]


def _proxy_answer(proxy: UpstreamProxy, request: str) -> ResponseFilter:
    """A 407 on a plain-HTTP request is the upstream proxy's (an origin never sends one): the gate's failure
    to report, not an answer for the client to act on."""

    def check(response: Inbound) -> None:
        if response.status == 407:
            raise refusal(proxy, 407, "", request)

    return check


@contextlib.asynccontextmanager
async def dialled(dialer: Dialer, addresses: list[IPAddress], target: Target) -> AsyncIterator[HttpConnection]:
    """A fresh connection for one request: to one of the vetted ``addresses``, or to the upstream proxy."""
    proxy = dialer.via(target.host)
    if proxy is None:
        origin = await dialer.http(target.host, _hosts(addresses), target.port)
    else:
        origin = await dialer.proxy_http(proxy)
    try:
        yield origin
    finally:
        if origin.our_state is State.DONE:
            await origin.close()
        else:
            origin.abort()  # a request cut short (refused mid-body): reset, so it never completes upstream


def terminating(target: Target, ctx: GateContext, record: AuditRecord) -> ssl.SSLContext | None:
    """The client-side TLS context when the gate terminates the tunnel to ``target``, else None (opaque):
    without a CA, where raw TCP is allowed (the bytes need not be TLS), where its ``[[egress]]`` entry says
    ``inspect = false``, or for a host outside the CA's names (one the user allowed while the gate runs: the
    CA's names are fixed at start; the tunnel keeps the TLS name check). A host a credential route binds is
    never tunnelled opaquely: ``Refused`` instead. The mode chosen is the record's ``tunnel`` from here on,
    so a tunnel refused for it, or failing before or after its 200, names it too."""
    route = route_for(ctx.config.routes, target)
    raw = ctx.egress.raw_allowed(target)

    def opaque(why: str) -> None:
        record.tunnel = RAW_TCP if raw else OPAQUE
        if route is not None:
            raise Refused(403, f"{target} is bound to credential route {route.spec.name} and this gate would not "
                               f"read its requests ({why}); it is never reached unseen")

    if ctx.ca is None or raw or not ctx.config.request_policy.inspects(target):
        opaque("no CA, raw TCP or inspect = false")
        return None
    record.tunnel = TERMINATED  # also if its certificate cannot be made: the refusal is for that
    try:
        return ctx.ca.context_for(target.host)
    except HostNotPermitted:
        opaque("outside the names of the gate's CA")
        record.note("not inspected: outside the names of the gate's CA, fixed at its start")
        return None
    except ValueError as exc:
        raise Refused(403, f"cannot inspect {target}: {exc}") from None


async def first_flight(reader: asyncio.StreamReader, early: bytes, target: Target, timeout: float
                       ) -> tuple[bytes, Decision]:
    """Read the client's first bytes in a tunnel (``early`` already came with the CONNECT head) until they
    are a whole ClientHello, or something else, or ``timeout`` passes. Returns what was read, to go upstream
    first if the decision allows it."""
    data = bytearray(early)
    need = 0  # parse again only once a record is complete: a trickle costs one parse per record
    try:
        async with asyncio.timeout(timeout):
            while True:
                if len(data) >= need:
                    hello = read_client_hello(data)
                    if hello is not None:
                        return bytes(data), decide_server_name(target, hello.server_name)
                    need = wanted(data)
                chunk = await reader.read(READ_SIZE)
                if not chunk:
                    return bytes(data), Decision(False, f"client closed the tunnel after {len(data)} bytes, "
                                                        "before a complete TLS ClientHello")
                data += chunk
    except NotTls as exc:
        return bytes(data), Decision(False, f"{exc} in a tunnel to {target}: only TLS may pass unless raw TCP is "
                                     "allowed for it (--allow-tcp)")
    except BadHello as exc:
        return bytes(data), Decision(False, f"malformed TLS ClientHello: {exc}")
    except TimeoutError:
        return bytes(data), Decision(False, f"no TLS ClientHello within {timeout:g}s ({len(data)} bytes received)")
    except OSError:
        return bytes(data), Decision(False, f"client connection lost after {len(data)} bytes, before a complete "
                                     "TLS ClientHello")


async def _tunnel(
    conn: HttpConnection,
    target: Target,
    record: AuditRecord,
    ctx: GateContext,
    upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None,
    origin: KeptOrigin | None = None,
    client_tls: ssl.SSLContext | None = None,
) -> None:
    """Answer 200, check the first flight, then relay bytes to ``upstream``, or with ``client_tls`` terminate
    TLS and serve the requests to ``origin`` (already connected with TLS)."""
    try:
        await conn.send(Response(200, [], b"Connection established"))
        record.status = 200
        early = conn.trailing_data
        raw = ctx.egress.raw_allowed(target)
        if raw:
            record.note("raw TCP allowed")
        else:
            early, verdict = await first_flight(conn.tunnel_reader, bytes(early), target,
                                                ctx.config.limits.first_flight_timeout)
            if not verdict.allow:  # nothing went upstream; the 200 was sent, so the tunnel is reset
                raise Refused(0, verdict.reason, close=True)
            record.passed(verdict)
        if origin is not None and client_tls is not None:
            await terminate(conn, early, target, origin, record, ctx, client_tls)
            return
        assert upstream is not None  # an opaque tunnel has its upstream streams
        traffic = Traffic()
        if early:
            upstream[1].write(early)
            traffic.up += len(early)
        try:
            await relay((conn.tunnel_reader, conn.transport), (upstream[0], upstream[1].transport), traffic,
                        ctx.config.limits.idle_timeout)
        except TunnelIdle:
            record.note("closed idle tunnel")
        except OSError:
            pass  # a reset on either side ends the tunnel
        finally:
            record.bytes_up, record.bytes_down = traffic.up, traffic.down
    finally:
        if upstream is not None:
            upstream[1].close()
        if origin is not None:
            await origin.aclose()
