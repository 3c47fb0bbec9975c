"""The API listener: what ANTHROPIC_BASE_URL points at.

A request the API policy allows goes through the forward path (gate/forward.py) with this route's filters:
every client credential stripped, the request scanned by DLP (gate/inspection.py), then the real credential
injected; identity encoding asked for. On the way back, a response that is encoded (so cannot be scanned) or
that would carry the credential is never delivered.

A Messages body is judged whole (policy/messages.py) before the request is complete upstream. One that
arrived whole with its head (a small request, the common case) is judged before anything goes upstream. A
larger one streams upstream as it arrives, so the gate keeps a streaming server's pace, but its end is held
back until the policy and DLP have passed the whole body: at least the last ``HELD_BACK`` bytes, and
everything from the last non-whitespace byte seen so far, so the JSON's closing byte never goes up before the
verdict. That is safe because a provider acts on a request only once it is complete: what it has received of a
refused body is neither complete HTTP (the framing's end never comes: a Content-Length short, no last chunk)
nor complete JSON, and the upstream connection is reset, never pooled, so nothing else completes it. No
answer the upstream sends early is relayed: the response is read only once the whole body went up.
"""
from __future__ import annotations

import functools
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from claude_bottle.gate.audit import AuditRecord
from claude_bottle.gate.connection import HttpConnection
from claude_bottle.gate.context import GateContext
from claude_bottle.gate.express import ExpressExchange
from claude_bottle.gate.failures import Refused
from claude_bottle.gate.forward import (
    FRAMING_HEADERS,
    Outbound,
    RequestFilter,
    ResponseFilter,
    forward,
    outbound,
    relay,
    set_headers,
    too_large,
)
from claude_bottle.gate.http1 import HOP_BY_HOP, Headers, Request, hop_free
from claude_bottle.gate.inspection import data_loss, identity_only, reflection_scan, scan_whole_request
from claude_bottle.gate.routes import CLIENT_CREDENTIAL_SPELLINGS
from claude_bottle.gate.settings import GateSettings
from claude_bottle.gate.upstream import UpstreamPool
from claude_bottle.policy.decide import Decision
from claude_bottle.policy.messages import MessagesPolicy

# Replaced by the gate: the upstream's own Host, and identity encoding so the reflection scan sees plain bytes.
GATE_SET_HEADERS = frozenset({b"host", b"accept-encoding"})
# Never forwarded from the client's head: hop-by-hop and framing headers, the client's credentials in any
# spelling, and what the gate sets itself.
NOT_FORWARDED = HOP_BY_HOP | FRAMING_HEADERS | CLIENT_CREDENTIAL_SPELLINGS | GATE_SET_HEADERS
LISTENER = "api"
# A streamed Messages body's end, held back until the whole body is judged (and everything from its last
# non-whitespace byte seen so far): enough that a provider never holds a complete request the gate refuses.
HELD_BACK = 64 * 1024
JSON_WHITESPACE = b" \t\r\n"


@dataclass(frozen=True)
class ApiRoute:
    """One gate's API route: its filters, made once, as they keep nothing of a request between calls.
    ``messages_filters`` are for a Messages body (its policy first on a whole body, last on a streamed one, so
    its hold-back keeps the end of what DLP passed), ``filters`` for any other request."""

    messages_filters: tuple[RequestFilter, ...]
    filters: tuple[RequestFilter, ...]
    response_filters: tuple[ResponseFilter, ...]
    target: str  # the upstream's host:port, for the audit
    # ApiPolicy.decide, remembered for the few targets a client repeats (bounded: a target may be 32 KiB).
    decide: Callable[[str, str], Decision]
    host: Headers  # what the gate sets on every request: first the upstream's Host,
    added: Headers  # and last the real credential and identity encoding

    @classmethod
    def of(cls, config: GateSettings) -> ApiRoute:
        upstream = config.upstream
        # DLP sees the request with the client's credentials gone, in any spelling (the bottle's placeholder
        # is an sk-ant- token; ``X_Api_Key`` is x-api-key to a server that reads '_' as '-'), and before the
        # real one is added.
        host, added = [(b"host", upstream.authority)], [config.credential.header(), (b"accept-encoding", b"identity")]
        filters = (set_headers(CLIENT_CREDENTIAL_SPELLINGS | GATE_SET_HEADERS, []),
                   data_loss(config.dlp_matcher),
                   set_headers(frozenset(), [*host, *added]))
        policy, max_bytes = config.messages_policy, config.limits.max_body_bytes
        return cls((messages_policy(policy, max_bytes), *filters, messages_streamed(policy, max_bytes)), filters,
                   (identity_only, reflection_scan(config.reflected_forms)), f"{upstream.host}:{upstream.port}",
                   functools.lru_cache(maxsize=64)(config.api_policy.decide), host, added)

    async def exchange(self, conn: HttpConnection, request: Request, record: AuditRecord, ctx: GateContext
                       ) -> None:
        """One request on the API listener (the listener's ``Exchange``, gate/request_loop.py)."""
        config = ctx.config
        path, decision = self._decided(request)
        record.target, record.path = self.target, path
        if not decision.allow:
            raise Refused.by(decision)
        record.decided(decision)
        target, messages = self._upstream_target(request, path, config)
        idle = config.limits.idle_timeout
        body = None if conn.they_are_waiting_for_100_continue else conn.arrived_body()
        if body is None:
            await forward(conn, outbound(conn, request, target, idle, ctx.api_bodies), lambda: Pooled(ctx.api_pool),
                          record, idle, self.messages_filters if messages else self.filters, self.response_filters)
            return
        head, verdict = self._checked(request, target, body, messages, config)
        if verdict is not None:
            record.passed(verdict)
        async with Pooled(ctx.api_pool) as origin:
            record.bytes_up += len(body)
            await origin.send_whole(head, body)
            await relay(conn, origin, record, idle, self.response_filters)

    def express(self, conn: HttpConnection, ctx: GateContext, busy: set[HttpConnection]) -> bool:
        """The listener's ``Express`` (gate/express.py): a whole request that queued on ``conn``, checked as
        ``exchange`` checks it and sent on an idle pooled upstream connection from the socket callback. False,
        with nothing taken, for anything else: the coroutine path serves it, refusals included. Its audit
        record is made once the request went up: off the exchange's path."""
        whole = conn.queued_whole()
        if whole is None or not conn.ready_for_express:
            return False
        started = time.time()
        request, body = whole
        assert isinstance(request, Request)  # a server connection parses requests
        config = ctx.config
        try:
            path, decision = self._decided(request)
            if not decision.allow:
                return False
            target, messages = self._upstream_target(request, path, config)
            head, verdict = self._checked(request, target, body, messages, config)
        except Exception:  # a refusal, or anything else out of the ordinary: exchange answers it as always
            return False
        origin = ctx.api_pool.idle()
        if origin is None:
            return False

        def record() -> AuditRecord:
            made = AuditRecord(LISTENER, conn.peer, request.method.decode("ascii", "replace"), self.target,
                               path=path, started=started)
            made.decided(decision)
            if verdict is not None:
                made.passed(verdict)
            return made

        ExpressExchange(conn, origin, ctx, busy, self.response_filters).send(head, body, record)
        return True

    def _decided(self, request: Request) -> tuple[str, Decision]:
        """The API policy's verdict on ``request``, and the path it judged (the target without its query)."""
        target = request.target.decode("ascii")
        return target.split("?", 1)[0], self.decide(request.method.decode("ascii"), target)

    @staticmethod
    def _upstream_target(request: Request, path: str, config: GateSettings) -> tuple[bytes, bool]:
        """The upstream's target for an allowed ``request``, and whether it is a Messages request."""
        messages = request.method == b"POST" and path in config.messages_policy.paths
        return config.upstream.base_path.encode() + request.target, messages

    def _checked(self, request: Request, target: bytes, body: bytes, messages: bool, config: GateSettings
                 ) -> tuple[Request, Decision | None]:
        """The request whose body arrived whole, through the route's filters (``Refused``) as the upstream will
        get it: the client's credentials gone, DLP passed, the real credential added, framed by its length;
        and the Messages policy's verdict on it (None: not a Messages request)."""
        verdict = None
        if messages:
            max_bytes = config.limits.max_body_bytes
            if len(body) > max_bytes:
                raise too_large(max_bytes)
            verdict = _verdict(config.messages_policy, body)
        headers = hop_free(request.headers, NOT_FORWARDED)
        scan_whole_request(config.dlp_matcher, target, headers, body)
        headers = [*self.host, *headers, *self.added]
        if body or request.content_length is not None or request.chunked:
            headers.append((b"content-length", b"%d" % len(body)))
        return Request(request.method, target, headers), verdict


def messages_policy(policy: MessagesPolicy, max_bytes: int) -> RequestFilter:
    """A Messages body that arrived whole: judged now, before anything goes upstream. One whose Content-Length
    is over ``max_bytes``: 413 before any of it is read. A streamed one passes to ``messages_streamed``."""

    async def judge(request: Outbound) -> Decision | None:
        body = request.body
        known = len(body) if isinstance(body, bytes) else request.length
        if known is not None and known > max_bytes:
            raise too_large(max_bytes)
        return _verdict(policy, body) if isinstance(body, bytes) else None

    return judge


def messages_streamed(policy: MessagesPolicy, max_bytes: int) -> RequestFilter:
    """A streamed Messages body goes on as it arrives (after DLP: this filter comes last) less its end, held
    back until the policy has judged the whole body; the verdict goes to ``Outbound.decided``."""

    async def hold(request: Outbound) -> None:
        if not isinstance(request.body, bytes):
            request.body = _judged(request.body, policy, max_bytes, request)

    return hold


async def _judged(body: AsyncIterator[bytes], policy: MessagesPolicy, max_bytes: int, request: Outbound
                  ) -> AsyncIterator[bytes]:
    """``body`` less its held end, then (``Refused`` if the policy refuses the whole, or it is over
    ``max_bytes``: 413) the end. The body is kept to be judged, as it was when read whole before. Pieces go on
    whole, as they came (no copies), once all of a piece is before the held end."""
    parts: list[bytes] = []
    size = passed = 0  # bytes of the body seen, and passed on
    last = -1  # where in the body its last non-whitespace byte seen so far is (-1: none yet)
    held: deque[bytes] = deque()
    async for chunk in body:
        if size + len(chunk) > max_bytes:
            raise too_large(max_bytes)
        request.hold(len(chunk))
        parts.append(chunk)
        held.append(chunk)
        if chunk and chunk[-1] not in JSON_WHITESPACE:  # the common case, with no copy
            last = size + len(chunk) - 1
        elif stripped := len(chunk.rstrip(JSON_WHITESPACE)):  # only the new piece: padding is never rescanned
            last = size + stripped - 1
        size += len(chunk)
        until = size - HELD_BACK if last < 0 else min(size - HELD_BACK, last)  # what may go: body[:until]
        while held and passed + len(held[0]) <= until:
            piece = held.popleft()
            passed += len(piece)
            yield piece
    request.decided.append(_verdict(policy, b"".join(parts)))
    for piece in held:
        yield piece


def _verdict(policy: MessagesPolicy, body: bytes) -> Decision:
    verdict = policy.decide(body)
    if not verdict.allow:
        raise Refused(verdict.status, verdict.reason)
    return verdict


class Pooled:
    """A pooled upstream connection, for ``async with``: back to the pool after a complete exchange, else
    reset. (A class rather than a generator-based context manager: it is entered on every API request.)"""

    def __init__(self, pool: UpstreamPool) -> None:
        self._pool = pool
        self._origin: HttpConnection | None = None

    async def __aenter__(self) -> HttpConnection:
        self._origin = await self._pool.acquire()  # UpstreamSide if it cannot connect
        return self._origin

    async def __aexit__(self, *exc_info: object) -> None:
        if self._origin is not None:
            self._pool.release(self._origin)
