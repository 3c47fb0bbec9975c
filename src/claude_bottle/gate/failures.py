"""Whose fault an exchange's end was: the failures, translated once per side.

Every step the gate takes on a connection runs under ``client_side()`` or ``upstream_side()``, which turn
what the connection raised (gate/http1.py's ``ProtocolError``, gate/connection.py's ``PeerGone``,
``TimeoutError``; ``OSError``, TLS and DNS errors) into a ``ClientSide`` or an ``UpstreamSide`` failure with
its status and reason. A filter that judges a request raises ``Refused``. All three are an
``ExchangeStopped``; gate/refusals.py's ``answer`` is the one place that turns any of them into an audit
outcome and what the client receives.
"""

from __future__ import annotations

import contextlib
import ssl
from collections.abc import Callable
from types import TracebackType
from typing import TypeVar

from claude_bottle.gate.connection import PeerGone
from claude_bottle.gate.http1 import ProtocolError
from claude_bottle.gate.resolver import ResolveError
from claude_bottle.policy.decide import Decision

E = TypeVar("E", bound=BaseException)


class ExchangeStopped(Exception):
    """An exchange that cannot go on: ``status`` for the client (0: none can be sent) and a reason."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


class Refused(ExchangeStopped):
    """A policy refused the request. ``close``: the rest of the request is not read, the connection ends.
    ``rule``: the configured rule that refused it, for the audit (None: no rule, the policy itself)."""

    def __init__(self, status: int, reason: str, close: bool = False, rule: str | None = None,
                 hint: str = "", unlisted: bool = False, unread: bool = False) -> None:
        super().__init__(status, reason)
        self.close = close or unread
        self.unread = unread  # refused before a request was read (a connection over the limit)
        self.rule = rule
        self.hint = hint
        self.unlisted = unlisted  # the target is in no allowlist (the audit's ``unlisted``)

    @classmethod
    def by(cls, decision: Decision) -> Refused:
        """The refusal a policy's ``decision`` says, naming its rule if one decided."""
        return cls(decision.status, decision.reason, rule=decision.rule or None, hint=decision.hint,
                   unlisted=decision.unlisted)


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


class UpstreamSide(ExchangeStopped):
    """The upstream broke the exchange: no connection, bad HTTP, silence, a TLS or DNS failure."""


def client_failure(exc: BaseException) -> ClientSide:
    if isinstance(exc, ClientSide):
        return exc
    if isinstance(exc, ProtocolError):
        return ClientSide(exc.status, f"client broke HTTP/1.1: {exc}")
    if isinstance(exc, TimeoutError):
        return ClientSide(408, "client idle too long")
    if isinstance(exc, ssl.SSLError):
        return ClientSide(0, f"TLS failure with the client: {exc.reason or exc}")
    return ClientSide(0, "client went away")


def upstream_failure(exc: BaseException) -> UpstreamSide:
    """502 for a broken, refused or unreadable upstream, 504 for one that did not answer in time."""
    if isinstance(exc, UpstreamSide):
        return exc
    if isinstance(exc, TimeoutError):
        return UpstreamSide(504, "upstream stopped responding")
    if isinstance(exc, ResolveError):
        return UpstreamSide(502, f"DNS failure: {exc}")
    if isinstance(exc, ProtocolError | PeerGone):
        return UpstreamSide(502, f"upstream broke HTTP/1.1: {exc}")
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


# What a connection step can raise; everything else (an ExchangeStopped already, or a fault of the gate's own) passes.
CONNECTION_ERRORS = (ProtocolError, PeerGone, TimeoutError, OSError, ResolveError)


class _Side:
    """Steps on one side's connection: what they raise becomes that side's failure. A plain class rather than
    a generator-based context manager: it is entered several times per request on the hot path."""

    __slots__ = ("_translate",)

    def __init__(self, translate: Callable[[BaseException], ExchangeStopped]) -> None:
        self._translate = translate

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
                 ) -> None:
        if exc is not None and isinstance(exc, CONNECTION_ERRORS):
            raise self._translate(exc) from None


_CLIENT_SIDE = _Side(client_failure)
_UPSTREAM_SIDE = _Side(upstream_failure)


def client_side() -> contextlib.AbstractContextManager[None]:
    """Run steps on the client's connection: their errors become ``ClientSide``."""
    return _CLIENT_SIDE


def upstream_side() -> contextlib.AbstractContextManager[None]:
    """Run steps on the upstream's connection: their errors become ``UpstreamSide``."""
    return _UPSTREAM_SIDE
