"""Fixtures for every test: a clean environment, the stub upstream, and gates in front of it."""

from __future__ import annotations

import contextlib
import io
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
import uvloop

from claude_bottle.credentials import Credential
from claude_bottle.gate import settings as gc
from claude_bottle.gate.audit import AuditLog
from claude_bottle.gate.context import LeafIssuer
from claude_bottle.gate.options import GateOptions
from claude_bottle.gate.resolver import Resolver
from claude_bottle.gate.routes import CredentialRoute
from claude_bottle.gate.server import Gate
from claude_bottle.gate.upstream_proxy import UpstreamProxy
from claude_bottle.stub import StubUpstream
from tests.helpers import make_token

PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY")
# Gate tests wait less than a person would; the limits the options carry are set through them.
TEST_LIMITS = gc.Limits(header_timeout=5, idle_timeout=5, connect_timeout=2, drain_seconds=2)
OPTION_LIMITS = ("max_tunnels", "max_connections", "idle_timeout", "drain_seconds")


def pytest_asyncio_loop_factories(config: pytest.Config, item: pytest.Item) -> dict[str, Any]:
    """The gate runs on uvloop (gate/server.py ``serve``), and so does every async test."""
    return {"uvloop": uvloop.new_event_loop}


@pytest.fixture(autouse=True)
def clean_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests talk to loopback servers directly unless they name a proxy themselves."""
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)


@dataclass
class RunningGate:
    gate: Gate
    token: str
    audit_stream: io.StringIO

    @property
    def api(self) -> gc.Endpoint:
        return self.gate.api_address

    @property
    def proxy(self) -> gc.Endpoint:
        return self.gate.proxy_address

    def records(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.audit_stream.getvalue().splitlines()]


GateFactory = Callable[..., contextlib.AbstractAsyncContextManager[RunningGate]]


@pytest.fixture
async def stub() -> AsyncIterator[StubUpstream]:
    async with StubUpstream() as server:
        yield server


@pytest.fixture
def make_gate(stub: StubUpstream) -> GateFactory:
    """Start a gate in this event loop, in front of the stub unless ``upstream`` says otherwise."""
    return gate_factory(stub.url)


def gate_factory(default_upstream: str) -> GateFactory:
    """``make_gate`` for fixtures of any scope: start a gate in the running event loop, in front of
    ``default_upstream`` unless ``upstream`` says otherwise."""

    @contextlib.asynccontextmanager
    async def factory(
        *,
        token: str | None = None,
        allow: tuple[str, ...] = (),
        allow_tcp: tuple[str, ...] = (),
        allow_private: tuple[str, ...] = (),
        upstream: str | None = None,
        resolver: Resolver | None = None,
        api_paths: tuple[str, ...] = (),
        server_tools: tuple[str, ...] = (),
        extra_ca: tuple[str, ...] = (),
        api_port: int = 0,
        proxy_port: int = 0,
        ca: LeafIssuer | None = None,
        egress_rules: tuple[str, ...] = (),
        no_inspect: tuple[str, ...] = (),
        dlp_off: tuple[str, ...] = (),
        learn: bool = False,
        control_socket: Path | None = None,
        ask: bool = False,
        ask_timeout: float = 60.0,
        ask_limit: int = 16,
        routes: tuple[CredentialRoute, ...] = (),
        upstream_proxy: UpstreamProxy | None = None,
        mcp_servers: tuple[str, ...] = (),
        **limits: float | int,
    ) -> AsyncIterator[RunningGate]:
        token = token or make_token()
        options = GateOptions(  # the texts parsed as the gate command's flags are
            api_listen=gc.parse_listen(f"127.0.0.1:{api_port}", "--api-listen"),
            proxy_listen=gc.parse_listen(f"127.0.0.1:{proxy_port}", "--proxy-listen"),
            credential=Credential.parse(token, "test token"),
            upstream=gc.parse_upstream(upstream or default_upstream),
            allow=gc.parse_allowlist(allow),
            allow_tcp=gc.parse_allowlist(allow_tcp, "--allow-tcp"),
            allow_private=gc.parse_networks(allow_private),
            allow_api_path=gc.parse_extra_api_paths(api_paths),
            allow_server_tool=gc.parse_server_tools(server_tools),
            request_policy=gc.parse_egress_rules(egress_rules, no_inspect),
            dlp=gc.parse_dlp((), dlp_off),
            routes=routes,
            mcp_servers=gc.parse_mcp_servers(mcp_servers, gc.parse_egress_rules(egress_rules, no_inspect),
                                             gc.parse_allowlist(allow_tcp)),
            extra_ca=tuple(Path(path) for path in extra_ca),
            learn=learn,
            control_socket=control_socket,
            ask=ask,
            ask_timeout=ask_timeout,
            ask_limit=ask_limit,
            **{name: limits.get(name, getattr(TEST_LIMITS, name)) for name in OPTION_LIMITS},
        )
        config = options.settings(replace(TEST_LIMITS, **{n: v for n, v in limits.items() if n not in OPTION_LIMITS}))
        config = replace(config, upstream_proxy=upstream_proxy)
        stream = io.StringIO()
        async with Gate(config, AuditLog(stream, secrets=config.injected_secrets), resolver, ca=ca) as gate:
            running = RunningGate(gate, token, stream)
            yield running
        assert token not in stream.getvalue(), "the audit log must never hold the credential"
        assert all(r.secret not in stream.getvalue() for r in routes), "nor a route's"
        unexplained = [r for r in running.records() if not r["reason"]]
        assert unexplained == [], "every audit line carries a reason"

    return factory
