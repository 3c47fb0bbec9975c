"""The API listener: what ANTHROPIC_BASE_URL points at.

Client credentials are stripped and the real one is injected toward the upstream only. A Messages request
body is read whole and judged (policy/messages.py) before anything goes upstream; other bodies, and every
response, stream as they arrive. A response that would carry the credential back is never delivered, and
the status line the client sees is the gate's own.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import h11

from claude_bottle.gate.audit import AuditRecord
from claude_bottle.gate.context import GateContext
from claude_bottle.gate.http import ClientProtocolError, Headers, HttpConnection, end_to_end, header_values
from claude_bottle.gate.scan import SecretReflected, SecretScanner
from claude_bottle.gate.upstream import UpstreamError, from_upstream, translate
from claude_bottle.policy.decide import Decision

# Every way a client can present a credential. Names arrive lower-cased from h11, once per occurrence.
CLIENT_CREDENTIAL_HEADERS = frozenset({b"authorization", b"x-api-key", b"proxy-authorization", b"cookie"})
# Replaced by the gate: the upstream's own Host, identity encoding so the reflection scan sees plain bytes,
# Expect, since the gate sends the body anyway, and the body's framing.
GATE_SET_HEADERS = frozenset({b"host", b"accept-encoding", b"expect", b"content-length"})


def upstream_request_headers(request: h11.Request, ctx: GateContext, body: bytes | None = None) -> Headers:
    """The head sent upstream. ``body`` is the whole body when the gate has read it, else None (streamed)."""
    kept = [
        (n, v) for n, v in end_to_end(request.headers)
        if n.lower() not in CLIENT_CREDENTIAL_HEADERS and n.lower() not in GATE_SET_HEADERS
    ]
    # Framing is the gate's: a read body goes with its length; a streamed one as the client framed it.
    length = header_values(request.headers, b"content-length")
    if body is not None:
        framing = [(b"content-length", str(len(body)).encode())]
    elif header_values(request.headers, b"transfer-encoding"):
        framing = [(b"transfer-encoding", b"chunked")]
    else:
        framing = [(b"content-length", length[0])] if length else []
    return [
        (b"host", ctx.config.upstream.authority),
        *kept,
        *framing,
        ctx.config.credential.header(),
        (b"accept-encoding", b"identity"),
    ]


async def api_exchange(conn: HttpConnection, request: h11.Request, record: AuditRecord, ctx: GateContext) -> None:
    limits = ctx.config.limits
    upstream = ctx.config.upstream
    method = request.method.decode("ascii")
    target = request.target.decode("ascii")
    record.target = f"{upstream.host}:{upstream.port}"
    record.path = target.split("?", 1)[0]

    decision = ctx.config.api_policy.decide(method, target)
    body: bytes | None = None
    if decision.allow and method == "POST" and record.path in ctx.config.messages_policy.paths:
        try:
            body = await conn.read_body(request, limits.max_body_bytes, limits.idle_timeout)
        except ClientProtocolError as exc:
            if exc.status != 413:
                raise
            record.deny(str(exc), 413)
            await conn.fail(413, str(exc))  # the rest of the body is not read: the connection closes
            return
        verdict = ctx.config.messages_policy.decide(body)
        decision = verdict if not verdict.allow else Decision(True, f"{decision.reason}; {verdict.reason}")
    if not decision.allow:
        record.deny(decision.reason, decision.status)
        await conn.refuse(decision.status, decision.reason, limits.idle_timeout)
        return
    record.allow(decision.reason)

    origin: HttpConnection | None = None
    try:
        origin = await ctx.api_pool.acquire()
        await _relay(conn, origin, request, (upstream.base_path + target).encode(), body, record, ctx)
    except (UpstreamError, SecretReflected, OSError, TimeoutError) as exc:
        failure = translate(exc)
        record.fail(failure.reason, failure.status)
        await conn.fail(failure.status, failure.reason)
    finally:
        if origin is not None:
            ctx.api_pool.release(origin)


async def _relay(
    conn: HttpConnection, origin: HttpConnection, request: h11.Request, target: bytes, body: bytes | None,
    record: AuditRecord, ctx: GateContext,
) -> None:
    """One exchange: the request up (its body already read, or as it arrives), the response down chunk by
    chunk."""
    idle = ctx.config.limits.idle_timeout
    await from_upstream(origin.send(h11.Request(method=request.method, target=target,
                                                headers=upstream_request_headers(request, ctx, body))))
    chunks = conn.body(idle) if body is None else _once(body)
    async for chunk in chunks:
        record.bytes_up += len(chunk)
        await from_upstream(origin.send(h11.Data(data=chunk)))
    await from_upstream(origin.send(h11.EndOfMessage()))

    response = await from_upstream(origin.next_event(idle))
    while isinstance(response, h11.InformationalResponse):  # 100 Continue and the like are hop-by-hop
        response = await from_upstream(origin.next_event(idle))
    if not isinstance(response, h11.Response):
        raise UpstreamError(502, "upstream closed without a response")
    secret = ctx.config.credential.secret.encode()
    if any(secret in value for _, value in response.headers):
        raise SecretReflected("credential in a response header")
    encodings = {v.strip().lower() for v in header_values(response.headers, b"content-encoding")}
    if encodings - {b"identity", b""}:
        raise UpstreamError(502, "upstream sent an encoded body although the gate asked for identity")

    # The reason phrase is the gate's own (the standard one for the status): the upstream's is never relayed.
    await conn.send(h11.Response(status_code=response.status_code, headers=end_to_end(response.headers)))
    record.status = response.status_code
    scanner = SecretScanner(secret)
    while isinstance(event := await from_upstream(origin.next_event(idle)), h11.Data):
        if safe := scanner.feed(bytes(event.data)):
            record.bytes_down += len(safe)
            await conn.send(h11.Data(data=safe))
    if not isinstance(event, h11.EndOfMessage):
        raise UpstreamError(502, "upstream closed in the middle of the response")
    if tail := scanner.finish():
        record.bytes_down += len(tail)
        await conn.send(h11.Data(data=tail))
    await conn.send(h11.EndOfMessage())


async def _once(body: bytes) -> AsyncIterator[bytes]:
    if body:
        yield body
