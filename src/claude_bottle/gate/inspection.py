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
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

from claude_bottle.gate.audit import AuditRecord
from claude_bottle.gate.context import GateContext
from claude_bottle.gate.dlp import DlpMatch, DlpPolicy, DlpScanner
from claude_bottle.gate.failures import Refused
from claude_bottle.gate.forward import Outbound, RequestFilter
from claude_bottle.policy.hosts import Target
from claude_bottle.policy.rules import RequestPolicy

# A body read whole is scanned in pieces of this size, as a streamed one is: a rule's regex then runs only
# over the pieces where one of its anchors occurs, not over the whole body (2x faster on Messages bodies).
SCAN_PIECE = 64 * 1024


def inspected(target: Target, ctx: GateContext) -> list[RequestFilter]:
    """The filters of every request the gate reads on the proxy listener (plain HTTP, terminated tunnels)
    to ``target``, after its own header rewriting: the rules, then DLP over what goes upstream."""
    config = ctx.config
    return [request_rules(config.request_policy, target),
            data_loss(config.dlp, (config.credential.secret.encode(),))]


def request_rules(policy: RequestPolicy, target: Target) -> RequestFilter:
    """Refuse a request the ``[[egress]]`` rules for ``target`` do not allow; add the verdict to the audit."""

    async def judge(request: Outbound, record: AuditRecord) -> None:
        decision = policy.decide(request.method.decode("ascii"), target.host, target.port, request.path)
        if not decision.allow:
            raise Refused.by(decision)
        record.allow(f"{record.reason}; {decision.reason}")
        record.rule = decision.rule or None

    return judge


def data_loss(policy: DlpPolicy, secrets: Sequence[bytes]) -> RequestFilter:
    """Refuse a request that carries one of ``secrets`` (the values the gate holds) or a credential a DLP
    rule matches, in its target, headers or body."""

    async def scan(request: Outbound, record: AuditRecord) -> None:
        scanner = policy.scanner(secrets)
        try:
            scanner.check_head(request.target, request.headers)
            if isinstance(request.body, bytes):
                for start in range(0, len(request.body), SCAN_PIECE):
                    scanner.feed(request.body[start : start + SCAN_PIECE])
                scanner.finish()
        except DlpMatch as match:
            raise Refused.by(match.decision) from None
        if not isinstance(request.body, bytes):
            request.body = _scanned(request.body, scanner)

    return scan


async def _scanned(body: AsyncIterator[bytes], scanner: DlpScanner) -> AsyncIterator[bytes]:
    """``body`` as far as DLP lets it pass: each chunk less the tail held back, the tail at the end."""
    try:
        async for chunk in body:
            if safe := scanner.feed(chunk):
                yield safe
        if tail := scanner.finish():
            yield tail
    except DlpMatch as match:
        raise Refused.by(match.decision) from None
