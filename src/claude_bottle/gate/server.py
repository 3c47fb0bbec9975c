"""The gate service: two listeners, one connection loop, graceful drain.

A connection is served request by request; each request gets exactly one audit record, written when the
exchange ends, whatever way it ends. Whatever ends an exchange early is answered and audited in one place
(gate/refusals.py ``answer``); only a refusal may keep the connection. Each listener serves at most
``max_connections`` clients at once; one more is answered 503 and closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import resource
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Self

import uvloop

from claude_bottle.errors import ConfigError, GateError
from claude_bottle.gate import control
from claude_bottle.gate.api import ApiRoute
from claude_bottle.gate.ask import BY_GONE, BY_TIMEOUT, Answer, Asks, Question
from claude_bottle.gate.audit import AuditLog, AuditRecord
from claude_bottle.gate.ca import RunCA
from claude_bottle.gate.connection import HttpConnection
from claude_bottle.gate.context import GateContext, LeafIssuer
from claude_bottle.gate.control import ControlRequest, Events
from claude_bottle.gate.dlp import engine_note
from claude_bottle.gate.endpoints import serve_http
from claude_bottle.gate.failures import Refused, UpstreamSide
from claude_bottle.gate.forward import HeldBodies
from claude_bottle.gate.http1 import State
from claude_bottle.gate.lifeline import watch
from claude_bottle.gate.memory import keep_large_buffers
from claude_bottle.gate.proxy import proxy_exchange
from claude_bottle.gate.ready import Ready
from claude_bottle.gate.refusals import answer
from claude_bottle.gate.request_loop import serve_requests
from claude_bottle.gate.resolver import ResolveError, Resolver, SystemResolver
from claude_bottle.gate.settings import Endpoint, GateSettings
from claude_bottle.gate.tunnel import TunnelSlots
from claude_bottle.gate.upstream import Dialer, UpstreamPool
from claude_bottle.policy.addresses import IPAddress, parse_ip_literal
from claude_bottle.policy.decide import Decision, EgressPolicy, allow_entry
from claude_bottle.policy.view import policy_view

UPSTREAM_ADDRESS_TTL = 300.0
DRAIN_TICK = 0.05  # while a stopping gate drains, how often it closes the connections whose exchange ended


class Gate:
    """Serves from ``start()`` (or entering ``async with``) until ``stop()``. The bound addresses are in
    ``api_address`` and ``proxy_address`` (useful with port 0)."""

    def __init__(self, config: GateSettings, audit: AuditLog, resolver: Resolver | None = None,
                 ca: LeafIssuer | None = None) -> None:
        self.config = config
        self.ca = ca
        self.audit = audit
        self.resolver = resolver or SystemResolver()
        self.api_address = config.api_listen
        self.proxy_address = config.proxy_listen
        self._servers: list[asyncio.Server] = []
        self._connections: dict[asyncio.Task[None], HttpConnection] = {}
        self._busy: set[HttpConnection] = set()
        self._ctx: GateContext | None = None
        self._api_route = ApiRoute.of(config)  # the API listener's filters, made once
        self._upstream_resolved_at = -UPSTREAM_ADDRESS_TTL
        self._upstream_endpoints: frozenset[tuple[IPAddress, int]] = frozenset()  # the last set that resolved
        self._open = {"api": 0, "proxy": 0}  # connections being served, per listener

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop(self.config.limits.drain_seconds)

    async def start(self) -> None:
        limits, upstream = self.config.limits, self.config.upstream
        dialer = Dialer(limits.connect_timeout, self.config.upstream_proxy)
        self._ctx = GateContext(
            config=self.config,
            audit=self.audit,
            resolver=self.resolver,
            egress=EgressPolicy(self.config.allowlist, self.config.guard, frozenset({self.config.upstream.host}),
                                raw_tcp=self.config.allow_tcp, learn=self.config.learn),
            api_pool=UpstreamPool(upstream.scheme, upstream.host, upstream.port, self.config.ssl_context(), dialer),
            dialer=dialer,
            upstream_tls=self.config.ssl_context(),
            tunnels=TunnelSlots(limits.max_tunnels),
            api_bodies=HeldBodies(limits.api_held_bytes),
            proxy_bodies=HeldBodies(limits.proxy_held_bytes),
            ca=self.ca,
            asks=Asks(self.config.ask_timeout, self.config.ask_limit, self._asked, self._decided)
            if self.config.ask else None,
        )
        try:
            for endpoint, listener in ((self.config.api_listen, "api"), (self.config.proxy_listen, "proxy")):
                server = await serve_http(
                    lambda conn, name=listener: self._accept(name, conn),  # type: ignore[misc]
                    endpoint.host, endpoint.port, max_header_bytes=limits.max_header_bytes,
                )
                self._servers.append(server)
        except OSError as exc:
            await self.stop(0)
            raise GateError(f"cannot listen on {endpoint}: {exc.strerror or exc}") from None
        self.api_address, self.proxy_address = (Endpoint(*s.sockets[0].getsockname()[:2]) for s in self._servers[:2])
        await self._refresh_protected()
        try:
            await dialer.check(upstream.host, upstream.port)
        except UpstreamSide as exc:
            # Before it is ready: a wrong proxy password or a proxy that is down ends the run at once, where
            # Claude Code would retry the API route's 502s for minutes.
            await self.stop(0)
            raise GateError(f"cannot reach the API upstream {upstream.host}:{upstream.port}: {exc.reason}") from None
        if self.config.control_socket is not None:
            try:
                self._servers.append(await control.serve(self.config.control_socket, self.control))
            except OSError as exc:
                await self.stop(0)
                raise GateError(f"cannot listen on the control socket {self.config.control_socket}: "
                                f"{exc.strerror or exc}") from None

    def control(self, request: ControlRequest) -> dict[str, Any] | Events:
        """A request on the control channel (gate/control.py): a policy change applies to every request decided
        from now on and is audited; ask mode's requests go to its questions (gate/ask.py)."""
        assert self._ctx is not None
        if request.op in control.ASK_OPERATIONS:
            return self._answer_ask(request)
        change = control.apply(self._ctx.egress, request.op, request.entry)
        if change.decision is not None:
            self._ctx.egress = change.policy
            record = AuditRecord("control", "host", request.op.upper(), request.entry.strip())
            record.decided(change.decision)
            self.audit.write(record)
        return {"message": change.message, "policy": self._view(change.policy)}

    def _view(self, policy: EgressPolicy) -> dict[str, Any]:
        """The policy as a control reply shows it (and the host writes it into the bottle)."""
        return policy_view(policy, self.config.request_policy, self.config.ask)

    def _answer_ask(self, request: ControlRequest) -> dict[str, Any] | Events:
        assert self._ctx is not None
        asks = self._ctx.asks
        if asks is None:
            raise control.ControlError(f"{request.op}: this gate does not ask (started without --ask)")
        if request.op == "pending":
            return {"pending": asks.pending()}
        if request.op == "watch":
            return asks.watch()
        question = asks.decide(request.id, request.answer, request.by)
        entry = allow_entry(question.target)
        return {"message": f"{request.answer} {entry}", "entry": entry,
                "policy": self._view(self._ctx.egress)}

    def _asked(self, question: Question) -> None:
        """Ask mode: a question is asked; its held requests' own lines follow its answer's line."""
        record = AuditRecord("ask", question.client, "ASK", str(question.target), decision="ask")
        record.reason = f"{question.target} is not in the allowlist: held until the host answers (ask mode)"
        record.path, record.ask = question.path, question.id
        self.audit.write(record)

    def _decided(self, question: Question, answer: Answer) -> None:
        """Ask mode: the host's answer acts on the run's policy (as the allow and deny operations do) before
        the held requests go on; a timeout or a withdrawal leaves it as it is. Audited either way."""
        assert self._ctx is not None
        entry = allow_entry(question.target)
        record = AuditRecord("ask", question.client, answer.answer.upper(), str(question.target))
        record.path, record.ask, record.answer, record.by = question.path, question.id, answer.answer, answer.by
        if answer.by in (BY_TIMEOUT, BY_GONE):
            why = "nobody answered in time" if answer.by == BY_TIMEOUT else "every request held for it went away"
            record.deny(f"{question.target}: not approved after {answer.waited:g}s ({why})", 0, unlisted=True)
        else:
            change = control.apply(self._ctx.egress, "allow" if answer.allow else "deny", entry)
            self._ctx.egress = change.policy
            record.decided(Decision(answer.allow, f"{question.target}: {answer.answer} by {answer.by} after "
                                                  f"{answer.waited:g}s; {change.message} for this run"))
        self.audit.write(record)

    async def stop(self, drain_seconds: float) -> None:
        """Stop accepting; close idle connections now; let busy ones finish their exchange up to the deadline,
        and close each as its exchange ends (a kept-alive connection does not wait there for another)."""
        for server in self._servers:
            server.close()
        if self._ctx is not None and self._ctx.asks is not None:
            self._ctx.asks.close()  # the control channel's watchers: their connections end now
        loop = asyncio.get_running_loop()
        deadline = loop.time() + drain_seconds
        ended: set[asyncio.Task[None]] = set()  # cancelled once: a second cancel would cut its close short
        while self._connections:
            for task, conn in list(self._connections.items()):
                if conn not in self._busy and task not in ended:
                    ended.add(task)
                    task.cancel()
            left = deadline - loop.time()
            if left <= 0:
                break
            await asyncio.wait(list(self._connections), timeout=min(left, DRAIN_TICK))
        pending = list(self._connections)
        for task in pending:
            if task not in ended:
                task.cancel()
        if pending:
            await asyncio.wait(pending)
        for server in self._servers:
            await server.wait_closed()
        if self._ctx is not None:
            await self._ctx.api_pool.aclose()

    async def _refresh_protected(self) -> None:
        """The gate's own listeners and the upstream's current addresses are never proxy targets."""
        assert self._ctx is not None
        now = time.monotonic()
        if now - self._upstream_resolved_at < UPSTREAM_ADDRESS_TTL:
            return
        self._upstream_resolved_at = now
        upstream = self.config.upstream
        endpoints: set[tuple[IPAddress, int]] = set()
        for endpoint in (self.api_address, self.proxy_address):
            ip = parse_ip_literal(endpoint.host)
            if ip is not None:
                endpoints.add((ip, endpoint.port))
        literal = parse_ip_literal(upstream.host)
        try:
            async with asyncio.timeout(self.config.limits.connect_timeout):
                addresses = [literal] if literal else await self.resolver.resolve(upstream.host, upstream.port)
            self._upstream_endpoints = frozenset((ip, upstream.port) for ip in addresses)
        except (ResolveError, TimeoutError):
            pass  # the last addresses that resolved stay protected (and the name itself, always)
        endpoints.update(self._upstream_endpoints)
        self._ctx.egress = dataclasses.replace(self._ctx.egress, protected_endpoints=frozenset(endpoints))

    async def _accept(self, listener: str, conn: HttpConnection) -> None:
        task = asyncio.current_task()
        assert task is not None and self._ctx is not None
        limit = self.config.limits.max_connections
        if self._open[listener] >= limit:
            record = AuditRecord(listener, conn.peer, "-", "-")
            refused = Refused(503, f"too many connections to the {listener} listener (limit {limit})", unread=True)
            try:
                await answer(conn, record, refused, self.config.limits.idle_timeout)
            finally:
                self.audit.write(record)
            return
        conn.json_errors = listener == "api"
        self._connections[task] = conn
        self._open[listener] += 1
        try:
            if listener == "proxy":
                await self._refresh_protected()
            if listener == "api":
                await serve_requests(conn, listener, self._api_route.exchange, self._ctx, self._busy,
                                     self._api_route.express)
            else:
                await serve_requests(conn, listener, proxy_exchange, self._ctx, self._busy)
        except asyncio.CancelledError:
            pass  # shutdown: the connection closes below
        finally:
            self._open[listener] -= 1
            self._connections.pop(task, None)
            self._busy.discard(conn)
            if conn.our_state is State.SEND_BODY:
                conn.abort()  # a response cut short must not look complete
            else:
                await conn.close()


def run_ca(config: GateSettings) -> RunCA:
    """This gate's CA (``claude_bottle.gate.ca``): limited to the names of ``--allow`` (tunnels that may carry
    any TCP are never terminated), or in learn and ask modes to every name; never the upstream's."""
    return RunCA.generate(config.allowlist.patterns, (config.upstream.host,), every_name=config.learn or config.ask)


def write_ca_certificate(ca: RunCA, path: Path) -> None:
    """``--ca-cert-out``: the CA certificate (public), readable by all, replaced whole (never half-written)."""
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    try:
        partial.write_bytes(ca.certificate_pem)
        partial.chmod(0o644)
        os.replace(partial, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            partial.unlink()
        raise ConfigError(f"--ca-cert-out {path}: {exc.strerror or exc}") from None


def raise_open_files_limit() -> int:
    """Raise this process's soft limit on open files to its hard limit: each connection and tunnel holds
    file descriptors, and the usual soft limit (1024) is below what the connection caps allow. Returns the
    new soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = hard if hard != resource.RLIM_INFINITY else 1 << 20  # the kernel's usual nr_open
    if soft < wanted:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def serve(config: GateSettings, audit: AuditLog, announce: Callable[[str], None] | None = None,
          ca_cert_out: Path | None = None, lifeline: int | None = None, silence: float = 0.0) -> None:
    """``run`` the gate on its event loop, uvloop's: the one place the gate's loop is chosen. libuv's loop
    and transports cost less CPU than asyncio's pure-Python ones on every request and SSE event, and its TLS
    protocol allocates its read buffer without filling it, so an idle terminated tunnel holds little memory."""
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(run(config, audit, announce=announce, ca_cert_out=ca_cert_out, lifeline=lifeline,
                       silence=silence))


async def run(config: GateSettings, audit: AuditLog, announce: Callable[[str], None] | None = None,
              ca_cert_out: Path | None = None, lifeline: int | None = None, silence: float = 0.0) -> None:
    """Serve until SIGTERM or SIGINT, or given ``lifeline`` (a file descriptor) until its end or, ``silence``
    above 0, until nothing came on it for that many seconds (gate/lifeline.py), then drain. Used by
    ``claude-bottle gate`` (through ``serve``).

    Once it listens it announces that, with its CA's certificate, in one line (gate/ready.py); with
    ``ca_cert_out`` it first writes the certificate there (a ConfigError if it cannot)."""
    raise_open_files_limit()
    keep_large_buffers()  # a large body's buffers reused, not faulted in afresh per request (gate/memory.py)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if lifeline is not None:  # watched once the signals are handled, so an early end is not missed
        def closed() -> None:
            loop.call_soon_threadsafe(stop.set)
        watch(lifeline, closed, silence)
    say = announce or (lambda m: print(m, file=sys.stderr, flush=True))
    began = time.perf_counter()
    matcher = config.dlp_matcher  # prepared (compiled) now, not on the first request
    prepared = f"claude-bottle gate: {engine_note(matcher)}, prepared in {(time.perf_counter() - began) * 1000:.0f} ms"
    ca = run_ca(config)
    if ca_cert_out is not None:
        write_ca_certificate(ca, ca_cert_out)
    say(prepared)  # a start-up line, before the ready line: after it come audit lines only
    async with Gate(config, audit, ca=ca) as gate:
        upstream = config.upstream
        say(Ready(gate.api_address, gate.proxy_address,
                  f"{upstream.scheme}://{upstream.authority.decode()}{upstream.base_path}", ca.certificate_der).line())
        await stop.wait()
