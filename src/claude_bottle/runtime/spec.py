"""What a run needs, already validated, and the addresses the bottle knows the gate by."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from claude_bottle.agent.schema import Resources
from claude_bottle.credentials import Credential
from claude_bottle.gate.dlp import DlpPolicy
from claude_bottle.gate.routes import CredentialRoute, RouteSpec
from claude_bottle.gate.settings import Upstream
from claude_bottle.gate.upstream_proxy import UpstreamProxy
from claude_bottle.policy.addresses import IPNetwork
from claude_bottle.policy.hosts import Allowlist
from claude_bottle.policy.mcp import McpServerRules
from claude_bottle.policy.rules import RequestPolicy
from claude_bottle.workspace import PROTECTED

API_PORT = 8080
PROXY_PORT = 3128
HOME = "/home/agent"


@dataclass(frozen=True)
class RunSpec:
    """Everything a run needs, already validated."""

    agent: str
    workspace: Path
    bottle_image: str
    gate_image: str
    credential: Credential
    user: str  # uid:gid, from bottle_user()
    upstream: Upstream
    allow: Allowlist = Allowlist()
    allow_tcp: Allowlist = Allowlist()  # HOST:PORT patterns whose tunnels may carry any TCP (--allow-tcp)
    allow_private: tuple[IPNetwork, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    resources: Resources = Resources()
    upstream_networks: tuple[str, ...] = ()  # Docker networks the gate joins to reach an upstream there
    # CA certificates (PEM files on the host) the gate trusts toward upstreams besides its image's store: the
    # CAs of stand-ins on those networks (verify's, the tests'), without an image of their own. Mounted
    # read-only into the gate, named by --extra-ca.
    upstream_ca_files: tuple[Path, ...] = ()
    mounts: tuple[tuple[Path, str, bool], ...] = ()  # (host path, container path, read-only)
    mcp_servers: dict[str, dict[str, Any]] = field(default_factory=dict)  # Claude Code's mcpServers entries
    mcp_rules: tuple[McpServerRules, ...] = ()  # the remote MCP servers' tool rules, for the gate
    protected: tuple[str, ...] = PROTECTED  # workspace paths mounted read-only where they exist (and nested .git)
    server_tools: tuple[str, ...] = ()  # server-tool families the API route lets through (--allow-server-tool)
    request_policy: RequestPolicy = RequestPolicy()  # [[egress]] (--egress-rule, --no-inspect)
    dlp: DlpPolicy = DlpPolicy()  # [dlp] (--dlp-rule, --dlp-off)
    runtime: str = ""  # the bottle's OCI runtime (runsc: gVisor); empty: the engine's default. The gate keeps it.
    learn: bool = False  # learn mode (--learn): what the allowlist does not name passes, audited as would_deny
    ask: bool = False  # ask mode (--ask, the agent's ask): what the allowlist does not name waits for an answer
    ask_timeout: float = 60.0  # seconds a held request waits for the answer (the agent's ask_timeout)
    routes: tuple[CredentialRoute, ...] = ()  # [credentials.NAME] with their values: the gate gets them on stdin
    route_env: dict[str, str] = field(default_factory=dict)  # bottle variables holding a route's sentinel
    git_routes: tuple[RouteSpec, ...] = ()  # routes the bottle's git credential helper answers for
    upstream_proxy: UpstreamProxy | None = None  # the gate connects out through it; its password goes on stdin
