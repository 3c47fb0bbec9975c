"""What every connection handler shares: settings, policy, audit, upstream pools, the run CA and counters."""

from __future__ import annotations

from dataclasses import dataclass

from claude_bottle.gate.audit import AuditLog
from claude_bottle.gate.ca import RunCA
from claude_bottle.gate.config import GateConfig
from claude_bottle.gate.resolver import Resolver
from claude_bottle.gate.upstream import UpstreamPool
from claude_bottle.policy.decide import EgressPolicy


@dataclass
class GateContext:
    config: GateConfig
    audit: AuditLog
    resolver: Resolver
    egress: EgressPolicy
    api_pool: UpstreamPool
    ca: RunCA  # mints the leaves TLS termination presents: ca.context_for(host)
    active_tunnels: int = 0
