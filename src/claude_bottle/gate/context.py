"""What every connection handler shares: the gate's settings and its services (policy, audit, resolver, upstream
connections, the CA, the tunnel count). It holds no route and imports none, so every route may import it."""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from typing import Protocol

from claude_bottle.gate.ask import Asks
from claude_bottle.gate.audit import AuditLog
from claude_bottle.gate.forward import HeldBodies
from claude_bottle.gate.resolver import Resolver
from claude_bottle.gate.settings import GateSettings
from claude_bottle.gate.tunnel import TunnelSlots
from claude_bottle.gate.upstream import Dialer, UpstreamPool
from claude_bottle.policy.decide import EgressPolicy


class LeafIssuer(Protocol):
    """The run's CA as TLS termination uses it: a server-side context presenting a leaf for ``host``.
    Raises ValueError for a host it may not certify."""

    def context_for(self, host: str) -> ssl.SSLContext: ...


@dataclass
class GateContext:
    config: GateSettings
    audit: AuditLog
    resolver: Resolver
    egress: EgressPolicy
    api_pool: UpstreamPool
    dialer: Dialer  # every other connection out: direct, or through the upstream proxy
    upstream_tls: ssl.SSLContext  # toward proxied hosts the gate terminates: system store + extra CAs, http/1.1
    tunnels: TunnelSlots  # the proxy's open tunnels, against --max-tunnels
    api_bodies: HeldBodies  # request bodies held whole to be judged, on each listener
    proxy_bodies: HeldBodies
    ca: LeafIssuer | None = None  # None: no termination, every tunnel is opaque (still under the name check)
    asks: Asks | None = None  # ask mode's pending questions (gate/ask.py); None: an unlisted target is refused
