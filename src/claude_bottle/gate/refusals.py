"""What a client receives when the gate refuses a request or an exchange fails: the refusal responses, and
``answer``, the one place a refusal or a failure (gate/failures.py) becomes an audit outcome and what the
client is told.

- ``Refused``: a decision (deny) with its own status, 403 for a rule; answered, the connection kept unless
  the refusal says to close it. Every refusal says the same thing on both listeners: its reason in
  ``X-Deny-Reason`` (and, on the proxy listener, as the status phrase, which is what a client sees of a
  refused CONNECT), and a short body (``explanation``) that says a policy refused it, not the network, and
  what the user can do. A reason names the destination and the rule, never a secret.
- ``ClientSide``: a refusal (``MalformedRequest``, audited ``deny``) with the parser's status for a request
  that broke HTTP; 408 for a client that went silent, nothing for one that went away (audited ``error``);
  the connection closes.
- ``UpstreamSide``: 502 for a broken, refused or unreadable upstream, 504 for one that stopped answering;
  a reset instead once the response has started, so a cut response never looks complete.
"""

from __future__ import annotations

import contextlib
import json
from http import HTTPStatus

from claude_bottle.gate.audit import CLIENT, UPSTREAM, AuditRecord, Side
from claude_bottle.gate.connection import HttpConnection
from claude_bottle.gate.failures import (
    ClientSide,
    ExchangeStopped,
    GateFault,
    MalformedRequest,
    Refused,
    UpstreamSide,
    explanation,
)
from claude_bottle.gate.http1 import Headers, LocalProtocolError, Response, State

# The Anthropic API's error types, for refusals on the API listener (Claude Code shows their message).
ANTHROPIC_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                         404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error"}
MAX_PHRASE = 200  # a refusal's reason as the status phrase, cut to this many characters


def _header_text(text: str) -> str:
    """``text`` as a header value: printable ASCII only."""
    return "".join(c if " " <= c <= "~" else "?" for c in text).strip()


def side_of(stop: ExchangeStopped) -> Side | None:
    """Whose side ``stop`` was on, for the audit's ``side`` (None: neither's, the gate's own)."""
    if isinstance(stop, ClientSide):
        return CLIENT
    if isinstance(stop, UpstreamSide):
        return UPSTREAM
    return None


async def answer(conn: HttpConnection, record: AuditRecord, stop: ExchangeStopped, idle_timeout: float) -> bool:
    """Record ``stop`` and tell the client, as far as it can still be told. True if the connection can
    serve another request."""
    if isinstance(stop, Refused):
        record.deny(stop.reason, stop.status, stop.rule, stop.unlisted)
        record.calls = record.calls or stop.calls
    elif isinstance(stop, MalformedRequest):
        record.deny(stop.reason, stop.status)
    else:
        record.fail(stop.reason, stop.status, side_of(stop))
    with contextlib.suppress(ClientSide, LocalProtocolError):  # a client gone meanwhile: nothing more to say
        if isinstance(stop, Refused) and stop.unread:
            await refuse_unread(conn, stop.status, stop.reason)
            return False
        if isinstance(stop, Refused) and stop.reply is not None and conn.our_state is State.SEND_RESPONSE:
            content_type, body = stop.reply
            await conn.send_whole(Response(stop.status, [(b"content-type", content_type),
                                                         (b"content-length", str(len(body)).encode()),
                                                         (b"x-deny-reason", _header_text(stop.reason).encode())]),
                                  body)
            return not stop.close
        if isinstance(stop, Refused) and not stop.close and conn.our_state is State.SEND_RESPONSE:
            await refuse_request(conn, stop.status, stop.reason, idle_timeout, explanation(stop))
            return True
        if stop.status:
            told = GateFault.TOLD if isinstance(stop, GateFault) else stop.reason
            await answer_or_reset(conn, stop.status, told, explanation(stop) if isinstance(stop, Refused) else told)
        else:
            conn.abort()
    return False


async def send_refusal(conn: HttpConnection, status: int, reason: str, headers: Headers | None = None,
                       message: str | None = None) -> None:
    """A complete small response, e.g. a refusal: ``message`` (default: ``reason``) as a line of text, or
    as an Anthropic API error body when the connection's ``json_errors`` is set. ``reason`` also goes in
    X-Deny-Reason and, unless ``json_errors``, is the status phrase (what a client shows of a refused
    CONNECT)."""
    message = reason if message is None else message
    phrase = _header_text(reason)[:MAX_PHRASE]
    if conn.json_errors:
        kind = ANTHROPIC_ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
        body = json.dumps({"type": "error", "error": {"type": kind, "message": message}}).encode()
        content_type = b"application/json"
        phrase = ""
    else:
        body, content_type = (message + "\n").encode(), b"text/plain; charset=utf-8"
    head = [
        (b"content-type", content_type),
        (b"content-length", str(len(body)).encode()),
        (b"x-deny-reason", _header_text(reason).encode()),
        *(headers or []),
    ]
    await conn.send_whole(Response(status, head, phrase.encode()), body)


async def refuse_request(conn: HttpConnection, status: int, reason: str, timeout: float,
                         message: str | None = None, max_body: int = 1 << 20) -> None:
    """Answer a refused request (``message``: the body's text, default ``reason``). A small body is read
    first so the connection stays usable; past ``max_body``, or when the body stops coming for ``timeout``,
    the connection is closed after the answer."""
    if conn.their_state is State.SEND_BODY:
        seen, complete = 0, False
        try:
            async for chunk in conn.body(timeout):
                seen += len(chunk)
                if seen > max_body:
                    break
            else:
                complete = True
        except ClientSide:
            pass  # a body that stops coming or breaks: answer anyway, and close
        if not complete:
            await send_refusal(conn, status, reason, [(b"connection", b"close")], message)
            return
    await send_refusal(conn, status, reason, message=message)


async def refuse_unread(conn: HttpConnection, status: int, reason: str) -> None:
    """Answer without reading a request (a connection over the limit), then close."""
    body = (reason + "\n").encode()
    head = (f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\ncontent-type: text/plain; charset=utf-8\r\n"
            f"content-length: {len(body)}\r\nx-deny-reason: {_header_text(reason)}\r\n"
            "connection: close\r\n\r\n").encode()
    conn.write_pending()
    if not conn.transport.is_closing():
        conn.transport.write(head + body)
    await conn.close()


async def answer_or_reset(conn: HttpConnection, status: int, reason: str, message: str | None = None) -> None:
    """Report a failure: as a response if none has started, else by resetting the connection."""
    if conn.our_state in (State.IDLE, State.SEND_RESPONSE):
        await send_refusal(conn, status, reason, [(b"connection", b"close")], message)
    else:
        conn.abort()

