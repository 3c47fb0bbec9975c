"""The API listener: what ANTHROPIC_BASE_URL points at.

Client credentials are stripped and the real one is injected toward the upstream only; bodies stream both
ways; a response that would carry the credential back is never delivered.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable

import h11
import httpcore

from claude_bottle.gate.audit import AuditRecord
from claude_bottle.gate.context import GateContext
from claude_bottle.gate.http import Headers, HttpConnection, end_to_end, header_values
from claude_bottle.gate.scan import SecretReflected, SecretScanner
from claude_bottle.gate.upstream import UpstreamError, translate

# Every way a client can present a credential. Names arrive lower-cased from h11, once per occurrence.
CLIENT_CREDENTIAL_HEADERS = frozenset({b"authorization", b"x-api-key", b"proxy-authorization", b"cookie"})
# Replaced by the gate: the upstream's own Host, and identity encoding so the reflection scan sees plain bytes.
GATE_SET_HEADERS = frozenset({b"host", b"accept-encoding"})


def upstream_request_headers(client_headers: Iterable[tuple[bytes, bytes]], ctx: GateContext) -> Headers:
    kept = [
        (n, v) for n, v in end_to_end(client_headers)
        if n.lower() not in CLIENT_CREDENTIAL_HEADERS and n.lower() not in GATE_SET_HEADERS
    ]
    return [
        (b"host", ctx.config.upstream.authority),
        *kept,
        ctx.config.credential.header(),
        (b"accept-encoding", b"identity"),
    ]


def _has_body(request: h11.Request) -> bool:
    lengths = header_values(request.headers, b"content-length")
    return bool(header_values(request.headers, b"transfer-encoding")) or (bool(lengths) and lengths[0] != b"0")


async def _counted(body: AsyncIterator[bytes], record: AuditRecord) -> AsyncIterator[bytes]:
    async for chunk in body:
        record.bytes_up += len(chunk)
        yield chunk


async def api_exchange(conn: HttpConnection, request: h11.Request, record: AuditRecord, ctx: GateContext) -> None:
    limits = ctx.config.limits
    upstream = ctx.config.upstream
    method = request.method.decode("ascii")
    target = request.target.decode("ascii")
    record.target = f"{upstream.host}:{upstream.port}"
    record.path = target.split("?", 1)[0]

    decision = ctx.config.api_policy.decide(method, target)
    if not decision.allow:
        record.deny(decision.reason, decision.status)
        await conn.refuse(decision.status, decision.reason, limits.idle_timeout)
        return
    record.allow(decision.reason)

    url = httpcore.URL(scheme=upstream.scheme.encode(), host=upstream.host.encode(), port=upstream.port,
                       target=(upstream.base_path + target).encode())
    timeouts = {"connect": limits.connect_timeout, "pool": limits.connect_timeout,
                "read": limits.idle_timeout, "write": limits.idle_timeout}
    secret = ctx.config.credential.secret.encode()
    try:
        async with ctx.api_pool.stream(
            method.encode(), url,
            headers=upstream_request_headers(request.headers, ctx),
            content=_counted(conn.body(limits.idle_timeout), record) if _has_body(request) else None,
            extensions={"timeout": timeouts},
        ) as response:
            if any(secret in value for _, value in response.headers):
                raise SecretReflected("credential in a response header")
            encodings = {v.strip().lower() for v in header_values(response.headers, b"content-encoding")}
            if encodings - {b"identity", b""}:
                raise UpstreamError(502, "upstream sent an encoded body although the gate asked for identity")
            await conn.send(h11.Response(status_code=response.status, headers=end_to_end(response.headers)))
            record.status = response.status
            scanner = SecretScanner(secret)
            async for chunk in response.aiter_stream():
                safe = scanner.feed(chunk)
                record.bytes_down += len(safe)
                if safe:
                    await conn.send(h11.Data(data=safe))
            if tail := scanner.finish():
                record.bytes_down += len(tail)
                await conn.send(h11.Data(data=tail))
            await conn.send(h11.EndOfMessage())
    except (httpcore.TimeoutException, httpcore.NetworkError, httpcore.ProtocolError, UpstreamError,
            SecretReflected, OSError) as exc:
        failure = translate(exc)
        record.fail(failure.reason, failure.status)
        await conn.fail(failure.status, failure.reason)
