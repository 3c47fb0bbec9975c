"""The filters of a request the gate reads: the method and path rules of its host, then DLP.

``request_rules`` judges the request by ``RequestPolicy.decide`` for the host and port it goes to: the
tunnel's CONNECT target (checked against the TLS name) or the absolute URL's, never its ``Host`` header.
It runs first, before anything of the request goes upstream.

``data_loss`` scans the request as it will go upstream: its target (with the query), every header, and the
body as it streams. A body the forward path streams is scanned chunk by chunk; the scanner holds back only
its bounded tail (gate/dlp.py), so no prefix of a match leaves before the match is seen. A match in the
head refuses the request before anything goes upstream; a match in the body after some of it went up raises
``Refused`` from the body stream, and the forward path then drops the upstream connection (a reset), so the
request never completes there. Either way the client gets the 403 (if no response has started, which it
cannot have while the request is still being sent) and the audit line names the rule, never the value.

A request to a host a credential route binds (gate/routes.py) is read the same way with two more steps:
every credential the client sent is removed first (so DLP sees no client header and the agent cannot
authenticate as anyone else there), and the route's own is added last, after DLP. Its response must come
back unencoded and without any secret the gate injects (``reflection_scan``).
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Callable, Sequence

from claude_bottle.gate.context import GateContext
from claude_bottle.gate.decode import BodyDecoder, UndecodableBody, content_codings
from claude_bottle.gate.dlp import DlpMatch, DlpMatcher, DlpScanner
from claude_bottle.gate.failures import Refused, UpstreamSide
from claude_bottle.gate.forward import Inbound, Outbound, RequestFilter, ResponseFilter, set_headers, too_large
from claude_bottle.gate.http1 import Headers, header_values
from claude_bottle.gate.mcp import mcp_request, mcp_response
from claude_bottle.gate.routes import CredentialRoute, is_client_credential, query_credential, route_for
from claude_bottle.gate.scan import SecretForms, SecretReflected, SecretScanner
from claude_bottle.policy.decide import Decision
from claude_bottle.policy.hosts import Target
from claude_bottle.policy.mcp import server_for
from claude_bottle.policy.overrides import (
    BodyUnread,
    body_method_overrides,
    body_overrides_read,
    method_overrides,
    path_overrides,
)
from claude_bottle.policy.rules import RequestPolicy

# A body read whole is scanned in pieces of this size, as a streamed one is, so the copies a scan makes (the
# view with its escapes decoded, the case-folded one) stay small; the cost per MB is the same for any size.
SCAN_PIECE = 64 * 1024
IDENTITY = [(b"accept-encoding", b"identity")]  # asked where the gate reads the answers


def inspected(target: Target, ctx: GateContext) -> list[RequestFilter]:
    """The filters of every request the gate reads on the proxy listener (plain HTTP, terminated tunnels)
    to ``target``, after its own header rewriting: the rules, then DLP over what goes upstream; for a host
    a credential route binds, the client's credentials removed first and the route's added last."""
    config = ctx.config
    mcp = server_for(config.mcp_servers, target)
    judged = [request_rules(config.request_policy, target, config.limits.max_body_bytes),
              *((mcp_request(mcp, config.dlp_matcher),) if mcp is not None else ()), data_loss(config.dlp_matcher)]
    route = route_for(config.routes, target)
    if route is None:
        return judged if mcp is None else [set_headers(frozenset({b"accept-encoding"}), IDENTITY), *judged]
    return [client_credentials_removed(route, config.limits.max_body_bytes), *judged, own_credential(route)]


def client_credentials_removed(route: CredentialRoute, max_bytes: int) -> RequestFilter:
    """Remove every credential header the client sent (in any spelling) and its ``Accept-Encoding``; refuse a
    request with a credential in its query (the server would read it; the gate does not rewrite URLs), and a
    TRACE (or a request naming it in an override header, a ``_method`` parameter or a ``_method`` field of its
    body, judged as ``request_rules`` judges one, up to ``max_bytes``), whose answer is the request as
    received, the route's credential included (RFC 9110 9.3.8: a client sends no sensitive field in one)."""
    def trace() -> Refused:
        return Refused(405, f"TRACE to a host credential route {route.spec.name} binds would carry its credential, "
                            "which the answer echoes (RFC 9110 9.3.8): the gate sends no TRACE there")

    def no_trace_in(request: Outbound, body: bytes) -> None:
        try:
            named = _body_methods(request, body)
        except BodyUnread as exc:
            raise Refused(400, f"{exc}: its _method fields are not all read, and no TRACE goes to a host "
                               f"credential route {route.spec.name} binds") from None
        except UndecodableBody as exc:
            raise Refused(exc.status, str(exc)) from None
        if "TRACE" in map(str.upper, named):
            raise trace()

    async def remove(request: Outbound) -> None:
        if request.method == b"TRACE" or "TRACE" in map(str.upper, method_overrides(request.headers, request.target)):
            raise trace()
        if (parameter := query_credential(request.target)) is not None:
            raise Refused(403, f"a credential in the query (parameter {parameter}) on a host credential route "
                               f"{route.spec.name} binds: only the route's own credential goes there")
        request.headers = [(n, v) for n, v in request.headers
                           if not is_client_credential(n) and n.lower() != b"accept-encoding"]
        if body_overrides_read(request.method, request.headers):
            if isinstance(request.body, bytes):
                no_trace_in(request, request.body)
            else:
                request.body = _overrides_judged(request.body, request, no_trace_in, max_bytes)

    return remove


def answered(target: Target, ctx: GateContext) -> list[ResponseFilter]:
    """The filters of the responses from ``target``: for a host a credential route binds, identity encoding
    only and no secret the gate injects (a server that echoes the request's headers would hand the route's
    value to the bottle); none elsewhere, where no secret was sent."""
    mcp = server_for(ctx.config.mcp_servers, target)
    cut = [mcp_response(mcp)] if mcp is not None else []
    if route_for(ctx.config.routes, target) is None:
        return cut
    return [identity_only, reflection_scan(ctx.config.reflected_forms), *cut]


def own_credential(route: CredentialRoute) -> RequestFilter:
    """Add the route's credential (after DLP, which must not see it) and ask for identity encoding."""
    add = set_headers(frozenset(), [route.header(), *IDENTITY])

    replaced = Decision(True, f"credential route {route.spec.name}: the client's credentials replaced by the "
                              "route's own")

    async def inject(request: Outbound) -> Decision:
        await add(request)
        return replaced

    return inject


def identity_only(response: Inbound) -> None:
    """The gate asked for identity encoding: anything else could hide the credential from the scan."""
    for name, value in response.headers:  # names in lower case, as the parser gives them
        if name == b"content-encoding" and value.strip().lower() not in (b"identity", b""):
            raise UpstreamSide(502, "upstream sent an encoded body although the gate asked for identity")


@functools.lru_cache(maxsize=16)  # a gate has one set of forms: its filter is made once, not per request
def reflection_scan(forms: SecretForms) -> ResponseFilter:
    """Never deliver a credential the gate injects back, in any of ``forms`` (every form of every such
    credential a server may send back, gate/decode.py's ``reflected_forms``): not in a header, not in the
    body, not even a prefix of one. One filter and, for a streamed body, one scanner whatever the forms.
    The same ``forms`` give the same filter (it keeps nothing of a response between calls)."""
    refused = "upstream response carried a credential the gate injects; not delivered"

    def scan(response: Inbound) -> None:
        if isinstance(response.body, bytes):
            if forms.in_message(response.headers, response.body):
                raise UpstreamSide(502, refused)
        elif forms.in_headers(response.headers):
            raise UpstreamSide(502, refused)
        else:
            response.body = _unreflected(response.body, forms.scanner(), refused)

    return scan


async def _unreflected(body: AsyncIterator[bytes], scanner: SecretScanner, refused: str) -> AsyncIterator[bytes]:
    try:
        async for chunk in body:
            if safe := scanner.feed(chunk):
                yield safe
    except SecretReflected:
        raise UpstreamSide(502, refused) from None
    if tail := scanner.finish():
        yield tail


def request_rules(policy: RequestPolicy, target: Target, max_bytes: int) -> RequestFilter:
    """Refuse a request the ``[[egress]]`` rules for ``target`` do not allow, as its own method and as any
    method it names in an override header or query parameter, at its own path and at any path it names in a
    path override header; return the verdict that allowed it. Where the entry has rules, a body a framework
    may read a ``_method`` field from (a POST's form or JSON) is judged too, whole (up to ``max_bytes``: 413
    past it), its end held back until then: a server never holds the whole of a request the rules refuse."""
    ruled = policy.has_rules(target.host, target.port)

    def decide(request: Outbound, overrides: tuple[str, ...]) -> Decision:
        decision = policy.decide(request.method.decode("ascii"), target.host, target.port, request.path, overrides,
                                 path_overrides(request.headers) if ruled else ())
        if not decision.allow:
            raise Refused.by(decision)
        return decision

    def decide_body(request: Outbound, body: bytes) -> Decision:
        try:
            named = _body_methods(request, body)
        except BodyUnread as exc:
            raise Refused(400, f"{exc}: its _method fields are not all read; [[egress]] rules for {target} judge "
                               "every method a request names", rule=f"[[egress]] {target} method override") from None
        except UndecodableBody as exc:
            raise Refused(exc.status, str(exc)) from None
        return decide(request, named)

    async def judge(request: Outbound) -> Decision:
        decision = decide(request, method_overrides(request.headers, request.target) if ruled else ())
        if ruled and body_overrides_read(request.method, request.headers):
            body = request.body
            if isinstance(body, bytes):
                return decide_body(request, body)
            request.body = _overrides_judged(body, request, decide_body, max_bytes)
        return decision

    return judge


def _body_methods(request: Outbound, body: bytes) -> tuple[str, ...]:
    """The methods ``body``'s ``_method`` fields name, as sent and, with a Content-Encoding, decoded: Express's
    body parsers inflate a body before method-override reads it; Rack reads it as sent. ``BodyUnread``,
    ``UndecodableBody``."""
    named = body_method_overrides(request.headers, body)
    if codings := content_codings(header_values(request.headers, b"content-encoding")):
        decoder = BodyDecoder(codings)
        named += body_method_overrides(request.headers, decoder.feed(body) + decoder.finish())
    return named


async def _overrides_judged(body: AsyncIterator[bytes], request: Outbound,
                            decide: Callable[[Outbound, bytes], Decision | None], max_bytes: int
                            ) -> AsyncIterator[bytes]:
    """``body`` as it arrives less its last piece, held back until the ``_method`` fields of the whole body
    are judged (``Refused`` then: the forward path resets the upstream connection); the verdict, if any, goes
    to ``request.decided``."""
    parts: list[bytes] = []
    size = 0
    async for chunk in body:
        size += len(chunk)
        if size > max_bytes:
            raise too_large(max_bytes)
        request.hold(len(chunk))
        if parts:
            yield parts[-1]
        parts.append(chunk)
    if (verdict := decide(request, b"".join(parts))) is not None:
        request.decided.append(verdict)
    if parts:
        yield parts[-1]


def data_loss(matcher: DlpMatcher) -> RequestFilter:
    """Refuse a request that carries a value the gate holds or a credential a DLP rule matches (``matcher``:
    the gate's, ``GateSettings.dlp_matcher``), in its target, headers or body; a body with a
    ``Content-Encoding`` is scanned decoded too (gate/decode.py), and refused if the gate cannot decode it."""

    async def scan(request: Outbound) -> None:
        if isinstance(request.body, bytes):
            scan_whole_request(matcher, request.target, request.headers, request.body)
            return
        scanner = matcher.scanner()
        try:
            scanner.check_head(request.target, request.headers)
            codings = content_codings(header_values(request.headers, b"content-encoding"))
            decoded = _DecodedScan(matcher, codings) if codings else None
        except DlpMatch as match:
            raise Refused.by(match.decision) from None
        except UndecodableBody as exc:
            raise Refused(exc.status, str(exc)) from None
        request.body = _scanned(request.body, scanner, decoded)

    return scan


def scan_whole_request(matcher: DlpMatcher, target: bytes, headers: Headers, body: bytes) -> None:
    """``data_loss`` for a request whose body is all here: ``Refused`` for what DLP finds in it."""
    scanner = None if len(body) <= SCAN_PIECE and matcher.clean_request(target, headers, body) else matcher.scanner()
    try:
        if scanner is not None:
            scanner.check_head(target, headers)
        codings = content_codings(header_values(headers, b"content-encoding"))
        decoded = _DecodedScan(matcher, codings) if codings else None
        if scanner is not None:
            _scan_whole(scanner, body)
        if decoded is not None:
            decoded.whole(body)
    except DlpMatch as match:
        raise Refused.by(match.decision) from None
    except UndecodableBody as exc:
        raise Refused(exc.status, str(exc)) from None


def _scan_whole(scanner: DlpScanner, body: bytes) -> None:
    last = max(0, len(body) - 1) // SCAN_PIECE * SCAN_PIECE  # where the last piece starts
    for start in range(0, last, SCAN_PIECE):
        scanner.feed(body[start : start + SCAN_PIECE])
    scanner.finish(body[last:])


class _DecodedScan:
    """A body's decoded form, scanned as it is decoded (never forwarded: the body goes upstream as sent)."""

    def __init__(self, matcher: DlpMatcher, codings: Sequence[str]) -> None:
        self._decoder = BodyDecoder(codings)
        self._scanner = matcher.scanner()
        self._codings = ", ".join(codings)

    def whole(self, body: bytes) -> None:
        self._checked(lambda: _scan_whole(self._scanner, self._decoder.feed(body) + self._decoder.finish()))

    def feed(self, chunk: bytes) -> None:
        self._checked(lambda: self._scanner.feed(self._decoder.feed(chunk)))

    def finish(self) -> None:
        self._checked(lambda: self._scanner.finish(self._decoder.finish()))

    def _checked(self, step: Callable[[], object]) -> None:
        try:
            step()
        except DlpMatch as match:
            decision = match.decision
            raise Refused(decision.status, f"{decision.reason} (with its {self._codings} undone)",
                          rule=decision.rule) from None


async def _scanned(body: AsyncIterator[bytes], scanner: DlpScanner,
                   decoded: _DecodedScan | None) -> AsyncIterator[bytes]:
    """``body`` as far as DLP lets it pass: each chunk less the tail held back, the tail at the end."""
    try:
        async for chunk in body:
            if decoded is not None:
                decoded.feed(chunk)
            if safe := scanner.feed(chunk):
                yield safe
        if decoded is not None:
            decoded.finish()
        if tail := scanner.finish():
            yield tail
    except DlpMatch as match:
        raise Refused.by(match.decision) from None
    except UndecodableBody as exc:
        raise Refused(exc.status, str(exc)) from None
