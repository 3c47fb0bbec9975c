"""Whose fault an exchange's end was: a refusal, or one side's failure, each an ``ExchangeStopped``.

A filter that judges a request raises ``Refused``. A connection knows its side (gate/connection.py), so it
raises ``ClientSide`` or ``UpstreamSide`` itself on every read and write, by one rule (``Blame``, the table
in docs/gate.md), the same whenever in an exchange it happens:

- the peer broke HTTP (in a head or a body): the client's request is refused (``MalformedRequest``) with
  the parser's status (400, 413, 431, 501, 505), the upstream's response is a 502;
- the peer went silent past its timeout: 408 for the client, 504 for the upstream;
- the peer hung up in the middle of a message (from a request head's first byte until its response is
  sent): nothing can be said to a client that left (status 0), 502 for the upstream.

A client that closes or stays idle between requests, before a byte of the next head, ends nothing: no
failure, no audit line. Connecting out (DNS, refused connections, TLS) fails on the upstream's side too
(``upstream_failure``). gate/refusals.py's ``answer`` is the one place any of them becomes an audit outcome
and what the client receives.
"""

from __future__ import annotations

import ssl
from abc import ABC, abstractmethod
from typing import TypeVar

from claude_bottle.gate.http1 import ProtocolError
from claude_bottle.gate.resolver import ResolveError
from claude_bottle.policy.decide import Decision, RpcCall

E = TypeVar("E", bound=BaseException)


class ExchangeStopped(Exception):
    """An exchange that cannot go on: ``status`` for the client (0: none can be sent) and a reason."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


class Refused(ExchangeStopped):
    """A policy refused the request. ``close``: the rest of the request is not read, the connection ends.
    ``rule``: the configured rule that refused it, for the audit (None: no rule, the policy itself).
    ``reply``: the answer the gate gives itself in place of the refusal text, as (content type, body) with
    ``status`` (a JSON-RPC error for a refused MCP call: the protocol's own way to say no). ``calls``: the
    JSON-RPC calls judged inside the request, for the audit."""

    def __init__(self, status: int, reason: str, close: bool = False, rule: str | None = None,
                 hint: str = "", unlisted: bool = False, unread: bool = False,
                 reply: tuple[bytes, bytes] | None = None, calls: tuple[RpcCall, ...] = ()) -> None:
        super().__init__(status, reason)
        self.close = close or unread
        self.unread = unread  # refused before a request was read (a connection over the limit)
        self.rule = rule
        self.hint = hint
        self.unlisted = unlisted  # the target is in no allowlist (the audit's ``unlisted``)
        self.reply = reply
        self.calls = calls

    @classmethod
    def by(cls, decision: Decision) -> Refused:
        """The refusal a policy's ``decision`` says, naming its rule if one decided."""
        return cls(decision.status, decision.reason, rule=decision.rule or None, hint=decision.hint,
                   unlisted=decision.unlisted, calls=decision.calls)


POLICY_FILE = "/etc/claude-bottle/policy.toml"  # in a bottle: the policy in effect, read-only


def explanation(refusal: Refused) -> str:
    """What a client is told of a refusal, for an agent to read and stop: the policy refused it, not the
    network; retrying or another route will not help; what the user can do. A request that broke HTTP gets
    its reason only."""
    if refusal.status not in (403, 405):
        return refusal.reason
    remedy = (f"To allow it, the user can {refusal.hint}." if refusal.hint
              else "Only the user can change this policy, on the host.")
    return (f"Blocked by the user's claude-bottle policy, not by the network: {refusal.reason}. {remedy} "
            "Retrying or another route will not get through: ask the user. "
            f"In a bottle, the policy in effect is in {POLICY_FILE}.")


class ClientSide(ExchangeStopped):
    """The client broke the exchange: bad HTTP, silence, or leaving."""


class MalformedRequest(ClientSide):
    """The client broke HTTP/1.1: its request is refused with the status a server answers (audited ``deny``,
    as the gate's other refusals of a request it cannot read), and the connection closes."""


class GateFault(ExchangeStopped):
    """A fault of the gate's own (a bug in it): 500, audited as an error that names the exception, on
    neither side; the client is told ``TOLD`` only."""

    TOLD = "internal gate error"

    def __init__(self, exc: Exception) -> None:
        super().__init__(500, f"gate error: {type(exc).__name__}: {exc}")


class UpstreamSide(ExchangeStopped):
    """The upstream broke the exchange: no connection, bad HTTP, silence, a TLS or DNS failure."""


class Blame(ABC):
    """The one rule by which a connection reports its peer's failures, whenever in an exchange they happen.
    ``BLAME_CLIENT`` and ``BLAME_UPSTREAM`` are the two sides; a connection holds one (``HttpConnection.side``)."""

    __slots__ = ()

    @abstractmethod
    def broke(self, error: ProtocolError) -> ExchangeStopped:
        """The peer broke HTTP/1.1 (``error``: the parser's words and the status a server answers)."""

    @abstractmethod
    def silent(self, reason: str | None = None) -> ExchangeStopped:
        """The peer sent nothing for as long as it may (``reason``: what was late, if not a plain wait)."""

    @abstractmethod
    def gone(self, during: str = "") -> ExchangeStopped:
        """The peer closed or reset the connection in the middle of an exchange (``during``: where)."""


class _ClientBlame(Blame):
    __slots__ = ()

    def broke(self, error: ProtocolError) -> ExchangeStopped:
        return MalformedRequest(error.status, f"malformed request: {error}")

    def silent(self, reason: str | None = None) -> ExchangeStopped:
        return ClientSide(408, reason or "client idle too long")

    def gone(self, during: str = "") -> ExchangeStopped:
        return ClientSide(0, f"client went away {during}".rstrip())  # no answer: nobody is there to read it


class _UpstreamBlame(Blame):
    __slots__ = ()

    def broke(self, error: ProtocolError) -> ExchangeStopped:
        return UpstreamSide(502, f"upstream broke HTTP/1.1: {error}")

    def silent(self, reason: str | None = None) -> ExchangeStopped:
        return UpstreamSide(504, reason or "upstream stopped responding")

    def gone(self, during: str = "") -> ExchangeStopped:
        return UpstreamSide(502, f"upstream closed the connection {during}".rstrip())


BLAME_CLIENT: Blame = _ClientBlame()
BLAME_UPSTREAM: Blame = _UpstreamBlame()


def upstream_failure(exc: BaseException) -> UpstreamSide:
    """Connecting out failed: 502 for a refused or unreadable upstream or a DNS failure, 504 for one that did
    not answer in time."""
    if isinstance(exc, UpstreamSide):
        return exc
    if isinstance(exc, TimeoutError):
        return UpstreamSide(504, "upstream stopped responding")
    if isinstance(exc, ResolveError):
        return UpstreamSide(502, f"DNS failure: {exc}")
    tls = _cause(exc, ssl.SSLError)
    if tls is not None:
        hint = " (a private CA? see --extra-ca)" if isinstance(tls, ssl.SSLCertVerificationError) else ""
        return UpstreamSide(502, f"TLS failure with upstream: {tls.reason or tls}{hint}")
    if isinstance(exc, ConnectionRefusedError):
        return UpstreamSide(502, f"cannot connect to upstream: {exc.strerror or exc}")
    return UpstreamSide(502, f"upstream connection failed: {type(exc).__name__} {exc}".strip())


def _cause(exc: BaseException, kind: type[E]) -> E | None:
    """``exc`` or the first exception of type ``kind`` it was raised from."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, kind):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None
