#!/usr/bin/env python3
"""HTTPS through TLS-terminating proxies against the gate's opaque tunnel, side by side, on loopback.

    .venv/bin/python benchmarks/inspection_bench.py [--quick] [--mitmdump PATH] [--srt DIR]

An HTTPS origin (h11 over asyncio TLS, a trustme certificate for ``localhost``) and each proxy run as
subprocesses; this process is the client (h11 over ssl). The paths, each only where it can run here:

- ``direct``: client -> origin, the baseline for added latency;
- ``gate_opaque``: ``claude-bottle gate --allow-tcp``, today's tunnel (the client's TLS ends at the origin);
- ``gate_terminated``: ``claude-bottle gate --allow``, measured only when the client sees a leaf of the gate's
  CA (``--ca-cert-out``) there: a gate that does not terminate is reported as such, never measured in its place;
- ``mitmproxy``: ``mitmdump``, TLS-terminating forward proxy (``--mitmdump``, default from PATH);
- ``srt_terminated``, ``srt_opaque``: sandbox-runtime's HTTP proxy (benchmarks/srt_proxy.mjs; ``--srt`` is the
  installed package directory), with and without its TLS termination.

Phases: leaf minting cost in process (``claude_bottle.gate.ca``); memory with 256 concurrent tunnels, each
with a TLS session and one request done; request latency on a kept-alive TLS connection; setup latency
(CONNECT, TLS handshake, one request, close); download throughput on one TLS connection. Writes
benchmarks/results/inspection.json and .md. Exit status as for gate_bench.py.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h11
import trustme
from benchkit import (
    LOOPBACK,
    MB,
    BenchError,
    Child,
    Children,
    Deadline,
    Entry,
    claude_bottle_argv,
    command_line,
    details_block,
    fmt,
    interrupt_on_sigterm,
    kb_to_mb,
    machine_info,
    machine_line,
    make_token,
    open_tunnel,
    percentile,
    proc_status_kb,
    ratio,
    results_table,
    rounded,
    srt,
    status_lines,
    write_results,
)
from cryptography import x509

from claude_bottle.gate.ca import RunCA
from claude_bottle.policy.hosts import Allowlist

SERVER_NAME = "localhost"  # resolved by each proxy itself (/etc/hosts) to 127.0.0.1
SMALL_BODY = b'{"name":"left-pad","version":"1.3.0","dist":{"shasum":"' + b"0" * 40 + b'"}}\n'
CHUNK = 256 * 1024
BLOCK = 50
CONCURRENT = 256
GLOBAL_DEADLINE_S = 20 * 60


# ------------------------------------------------------------------------------------------------ origin


def origin_main(cert_dir: str, port_file: str) -> None:
    """An HTTPS origin (run as a subprocess): ``GET /small`` answers SMALL_BODY, ``GET /bytes/N`` N bytes;
    keep-alive; HTTP/1.1 parsed by h11. Exits when its standard input closes."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(f"{cert_dir}/origin.pem")
    context.set_alpn_protocols(["http/1.1"])
    payload = os.urandom(CHUNK)

    async def respond(conn: h11.Connection, writer: asyncio.StreamWriter, target: str) -> None:
        size = int(target[len("/bytes/"):]) if target.startswith("/bytes/") else len(SMALL_BODY)
        writer.write(conn.send(h11.Response(status_code=200, headers=[("content-length", str(size))])))
        if not target.startswith("/bytes/"):
            writer.write(conn.send(h11.Data(data=SMALL_BODY)))
        sent = 0
        while sent < size and target.startswith("/bytes/"):
            n = min(CHUNK, size - sent)
            writer.write(conn.send(h11.Data(data=payload[:n])))
            sent += n
            await writer.drain()
        writer.write(conn.send(h11.EndOfMessage()))
        await writer.drain()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = h11.Connection(h11.SERVER)
        target = ""
        with contextlib.suppress(ConnectionError, ssl.SSLError, h11.RemoteProtocolError, TimeoutError):
            while True:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    async with asyncio.timeout(120):
                        conn.receive_data(await reader.read(65536))
                elif isinstance(event, h11.Request):
                    target = event.target.decode()
                elif isinstance(event, h11.EndOfMessage):
                    await respond(conn, writer, target)
                    conn.start_next_cycle()
                else:  # ConnectionClosed, or a request we do not serve
                    break
        writer.close()

    async def main() -> None:
        server = await asyncio.start_server(serve, LOOPBACK, 0, ssl=context, backlog=1024)
        Path(port_file).write_text(str(server.sockets[0].getsockname()[1]))  # noqa: ASYNC240 - once, before serving
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, sys.stdin.buffer.read)  # EOF: the parent is gone

    asyncio.run(main())


# ------------------------------------------------------------------------------------------------ client


@dataclass
class Route:
    """One way to the origin: straight there, or through a proxy's CONNECT; and whom the client trusts."""

    name: str
    hop: tuple[str, int]
    connect_to: str | None
    context: ssl.SSLContext
    authority: str  # the origin's host:port, for Host
    process: Child | None = None
    note: str = ""


class Https:
    """One TLS connection along a route, speaking HTTP/1.1 with h11; blocking sockets for low overhead."""

    def __init__(self, route: Route) -> None:
        sock, status = open_tunnel(route.hop, route.connect_to)
        if status != 200:
            sock.close()
            raise BenchError(f"{route.name}: CONNECT {route.connect_to} answered {status or 'nothing'}")
        self.tls = route.context.wrap_socket(sock, server_hostname=SERVER_NAME)
        self.conn = h11.Connection(h11.CLIENT)
        self.authority = route.authority

    def get(self, target: str) -> int:
        """One request; returns the body's size."""
        conn = self.conn
        self.tls.sendall(conn.send(h11.Request(method="GET", target=target, headers=[("host", self.authority)]))
                         + conn.send(h11.EndOfMessage()))
        size, status = 0, 0
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                conn.receive_data(self.tls.recv(262144))
            elif isinstance(event, h11.Response):
                status = event.status_code
            elif isinstance(event, h11.Data):
                size += len(event.data)
            elif isinstance(event, h11.EndOfMessage):
                break
            else:
                raise BenchError(f"the connection ended in the middle of {target}")
        if status != 200:
            raise BenchError(f"GET {target} answered {status}")
        conn.start_next_cycle()
        return size

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.tls.close()


def issuer_seen(route: Route) -> x509.Name:
    """The issuer of the certificate the client is shown along ``route``."""
    client = Https(route)
    try:
        der = client.tls.getpeercert(binary_form=True)
        if der is None:
            raise BenchError(f"{route.name}: no certificate")
        client.get("/small")
        return x509.load_der_x509_certificate(der).issuer
    finally:
        client.close()


async def async_tunnel(route: Route) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A TLS connection along ``route`` with one request done, for the concurrency phase."""
    reader, writer = await asyncio.open_connection(*route.hop)
    if route.connect_to is not None:
        conn = h11.Connection(h11.CLIENT)
        writer.write(conn.send(h11.Request(method="CONNECT", target=route.connect_to,
                                           headers=[("host", route.connect_to)])) + conn.send(h11.EndOfMessage()))
        while (event := conn.next_event()) is h11.NEED_DATA:
            conn.receive_data(await reader.read(4096))
        if not isinstance(event, h11.Response) or event.status_code != 200:
            raise BenchError(f"{route.name}: CONNECT answered {event}")
    await writer.start_tls(route.context, server_hostname=SERVER_NAME)
    conn = h11.Connection(h11.CLIENT)
    writer.write(conn.send(h11.Request(method="GET", target="/small", headers=[("host", route.authority)]))
                 + conn.send(h11.EndOfMessage()))
    while not isinstance(event := conn.next_event(), h11.EndOfMessage):
        if event is h11.NEED_DATA:
            conn.receive_data(await reader.read(65536))
        elif isinstance(event, h11.ConnectionClosed):
            raise BenchError(f"{route.name}: closed before answering")
    return reader, writer


# ------------------------------------------------------------------------------------------------ phases


@dataclass
class Bench:
    args: argparse.Namespace
    deadline: Deadline
    routes: list[Route]
    entries: list[Entry] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)

    def log(self, msg: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)

    def route(self, name: str) -> Route | None:
        return next((r for r in self.routes if r.name == name), None)

    def mint_cost(self) -> None:
        n = self.args.mints
        self.log(f"1. minting: {n} leaves and {n} server contexts of the gate's CA, in process")
        ca = RunCA.generate(Allowlist.parse(["*.example.com"]).patterns, max_hosts=n)
        started = time.perf_counter()
        for i in range(n):
            ca._mint(f"m{i}.example.com", None, time.time())
        mint = (time.perf_counter() - started) / n * 1e6
        started = time.perf_counter()
        for i in range(n):
            ca.context_for(f"c{i}.example.com")
        context = (time.perf_counter() - started) / n * 1e6
        started = time.perf_counter()
        for i in range(n):
            ca.context_for(f"c{i}.example.com")
        cached = (time.perf_counter() - started) / n * 1e6
        self.details["mint_us"] = {"leaf": mint, "server_context": context, "cached_context": cached, "n": n}
        self.entries.append(Entry("gate_leaf_mint", "µs", mint, note="ECDSA P-256 key + signed leaf"))
        self.entries.append(Entry("gate_context_first_use", "µs", context,
                                  note="mint + ssl.SSLContext with the chain loaded: a host's first tunnel"))
        self.entries.append(Entry("gate_context_cached", "µs", cached, note="every later tunnel to that host"))
        self.log(f"   leaf {mint:.0f} µs, first context {context:.0f} µs, cached {cached:.1f} µs")

    def concurrency(self) -> None:
        self.log(f"2. memory: {CONCURRENT} concurrent tunnels per proxy, each with a TLS session and one request")
        rows: dict[str, Any] = {}
        for route in self.routes:
            if route.process is None:
                continue
            self.deadline.check()
            pid = route.process.pid
            before = proc_status_kb(pid, "VmRSS")
            opened, held = asyncio.run(self._hold(route, pid))
            rows[route.name] = {"rss_before_mb": kb_to_mb(before), "rss_with_tunnels_mb": kb_to_mb(held),
                                "added_mb": kb_to_mb(held - before), "opened": opened,
                                "vmhwm_mb": kb_to_mb(proc_status_kb(pid, "VmHWM"))}
            self.log(f"   {route.name}: {opened} open, RSS {kb_to_mb(before):.1f} -> {kb_to_mb(held):.1f} MB")
        self.details["concurrent"] = rows
        for name, row in rows.items():
            terminated = name in ("gate_terminated", "mitmproxy", "srt_terminated")
            target = "< 150 MB" if name == "gate_terminated" else None
            self.entries.append(Entry(f"{name}_rss_{CONCURRENT}_tunnels", "MB", row["rss_with_tunnels_mb"],
                                      "idle", row["rss_before_mb"], ratio(row["rss_with_tunnels_mb"],
                                                                          row["rss_before_mb"]),
                                      target, row["rss_with_tunnels_mb"] < 150 if target else None,
                                      f"VmRSS with {row['opened']} {'terminated' if terminated else 'opaque'} "
                                      f"tunnels open (+{row['added_mb']:.1f} MB over idle)"))

    async def _hold(self, route: Route, pid: int) -> tuple[int, int]:
        gate = asyncio.Semaphore(32)  # handshakes in flight at once

        async def one() -> asyncio.StreamWriter:
            async with gate, asyncio.timeout(60):
                return (await async_tunnel(route))[1]

        writers: list[asyncio.StreamWriter] = []
        try:
            async with asyncio.TaskGroup() as group:
                tasks = [group.create_task(one()) for _ in range(CONCURRENT)]
            writers = [t.result() for t in tasks]
            await asyncio.sleep(0.5)
            return len(writers), proc_status_kb(pid, "VmRSS")
        finally:
            for writer in writers:
                writer.close()
            await asyncio.sleep(0.5)

    def request_latency(self) -> None:
        n = self.args.requests
        self.log(f"3. request latency: {n} sequential GET /small per route on one kept-alive TLS connection")
        clients = {r.name: Https(r) for r in self.routes}
        times: dict[str, list[float]] = {name: [] for name in clients}
        try:
            for client in clients.values():
                for _ in range(min(100, n)):
                    client.get("/small")
            while min(len(v) for v in times.values()) < n:
                self.deadline.check()
                for name, client in clients.items():
                    for _ in range(BLOCK):
                        started = time.perf_counter_ns()
                        client.get("/small")
                        times[name].append((time.perf_counter_ns() - started) / 1e6)
        finally:
            for client in clients.values():
                client.close()
        self._latency_entries("request", times, "keep-alive GET /small")

    def setup_latency(self) -> None:
        n = self.args.setups
        self.log(f"4. setup latency: {n} x (CONNECT, TLS handshake, GET /small, close) per route")
        times: dict[str, list[float]] = {r.name: [] for r in self.routes}

        def once(route: Route) -> float:
            started = time.perf_counter_ns()
            client = Https(route)
            try:
                client.get("/small")
            finally:
                client.close()
            return (time.perf_counter_ns() - started) / 1e6

        for route in self.routes:
            for _ in range(10):
                once(route)
        while min(len(v) for v in times.values()) < n:
            self.deadline.check()
            for route in self.routes:
                for _ in range(min(BLOCK, n)):
                    times[route.name].append(once(route))
        self._latency_entries("setup", times, "new connection: CONNECT + handshake + GET /small")

    def _latency_entries(self, kind: str, times: dict[str, list[float]], what: str) -> None:
        stats = {name: {"p50": percentile(v, 50), "p99": percentile(v, 99), "n": len(v)} for name, v in times.items()}
        self.details[f"{kind}_latency_ms"] = stats
        direct = stats["direct"]["p50"]
        added = {name: s["p50"] - direct for name, s in stats.items() if name != "direct"}
        for name, value in added.items():
            target, passed, baseline, baseline_value = None, None, "direct", direct
            if name == "gate_terminated" and "mitmproxy" in added:
                target, baseline, baseline_value = "<= mitmproxy", "mitmproxy", added["mitmproxy"]
                passed = value <= added["mitmproxy"]
            self.entries.append(Entry(f"{name}_added_{kind}_latency_p50", "ms", value, baseline, baseline_value,
                                      ratio(value, baseline_value) if baseline != "direct" else None,
                                      target if kind == "request" else None, passed if kind == "request" else None,
                                      f"{what}; p50 {stats[name]['p50']:.3f} ms - direct p50 {direct:.3f} ms; "
                                      f"p99 {stats[name]['p99']:.3f} ms"))
        self.log("   p50 " + ", ".join(f"{n} {s['p50']:.3f} ms" for n, s in stats.items()))

    def throughput(self) -> None:
        size, reps = self.args.download_bytes, self.args.download_reps
        self.log(f"5. download: {size / 2**20:.0f} MiB in one response per route, {reps} run(s), alternating")
        rates: dict[str, list[float]] = {r.name: [] for r in self.routes}
        for _ in range(reps):
            for route in self.routes:
                self.deadline.check()
                client = Https(route)
                try:
                    client.get("/small")
                    started = time.perf_counter()
                    got = client.get(f"/bytes/{size}")
                    seconds = time.perf_counter() - started
                finally:
                    client.close()
                if got != size:
                    raise BenchError(f"{route.name}: got {got} of {size} bytes")
                rates[route.name].append(size / MB / seconds)
        medians = {name: percentile(v, 50) for name, v in rates.items()}
        self.details["download_mb_s"] = {**rates, "bytes": size}
        opaque = medians.get("gate_opaque")
        for name, value in medians.items():
            if name == "direct":
                continue
            # terminated routes are compared with the gate's opaque tunnel (the target), opaque ones with direct
            baseline = "gate_opaque" if opaque is not None and name != "gate_opaque" else "direct"
            is_target = name == "gate_terminated" and baseline == "gate_opaque"
            reference = medians[baseline]
            self.entries.append(Entry(f"{name}_download", "MB/s", value, baseline, reference, ratio(value, reference),
                                      ">= 0.5 x gate_opaque" if is_target else None,
                                      (ratio(value, reference) or 0) >= 0.5 if is_target else None,
                                      f"median of {reps}; direct {medians['direct']:.0f} MB/s"))
        self.log("   median " + ", ".join(f"{n} {v:.0f} MB/s" for n, v in medians.items()))


# ------------------------------------------------------------------------------------------------ set-up


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])


def wait_for_port(child: Child, port: int, seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        child.ensure_alive()
        with contextlib.suppress(OSError), socket.create_connection((LOOPBACK, port), timeout=1):
            return
        time.sleep(0.1)
    raise BenchError(f"{child.name} did not listen on {port} within {seconds:g}s: {child.tail()}")


def trusting(*pems: bytes) -> ssl.SSLContext:
    context = ssl.create_default_context(cadata="".join(p.decode() for p in pems))
    context.set_alpn_protocols(["http/1.1"])
    return context


def start_routes(args: argparse.Namespace, children: Children, tmp: Path, origin_ca: trustme.CA,
                 origin_port: int, unavailable: dict[str, str]) -> list[Route]:
    target = f"{SERVER_NAME}:{origin_port}"
    origin_pem = origin_ca.cert_pem.bytes()
    (tmp / "origin-ca.pem").write_bytes(origin_pem)
    routes = [Route("direct", (LOOPBACK, origin_port), None, trusting(origin_pem), target)]
    token = tmp / "token"
    token.write_text(make_token() + "\n")
    token.chmod(0o600)
    for name, flags in (("gate_opaque", ["--allow-tcp", target]),
                        ("gate_terminated", ["--allow", target, *args.terminate_flag, "--extra-ca",
                                             str(tmp / "origin-ca.pem")])):
        ca_file = tmp / f"{name}-ca.pem"
        child = children.start(name, [*claude_bottle_argv(), "gate", "--api-listen", f"{LOOPBACK}:0", "--proxy-listen",
                                      f"{LOOPBACK}:0", "--upstream", f"http://{LOOPBACK}:9", "--token-file",
                                      str(token), "--allow-private", "127.0.0.0/8", "--max-tunnels", "1024",
                                      "--max-connections", "2048", "--ca-cert-out", str(ca_file), *flags])
        proxy = child.wait_for_gate(30).proxy
        gate_ca = ca_file.read_bytes()
        route = Route(name, (proxy.host, proxy.port), target, trusting(origin_pem, gate_ca), target, child)
        issuer = issuer_seen(route)
        terminated = issuer == x509.load_pem_x509_certificate(gate_ca).subject
        if terminated == (name == "gate_terminated"):
            routes.append(Route(name, route.hop, target, trusting(gate_ca if terminated else origin_pem), target,
                                child))
        else:
            unavailable[name] = (f"this gate ({' '.join(flags[:2])}) "
                                 f"{'terminates' if terminated else 'does not terminate'} TLS: the client saw a "
                                 f"certificate issued by {issuer.rfc4514_string()}")
            child.stop()
    mitmdump = args.mitmdump or shutil.which("mitmdump")
    if mitmdump is None:
        unavailable["mitmproxy"] = "mitmdump not found (pip install mitmproxy; --mitmdump PATH)"
    else:
        port, confdir = free_port(), tmp / "mitmproxy"
        child = children.start("mitmproxy", [mitmdump, "--listen-host", LOOPBACK, "--listen-port", str(port),
                                             "--set", f"confdir={confdir}", "--set",
                                             f"ssl_verify_upstream_trusted_ca={tmp / 'origin-ca.pem'}",
                                             "--allow-hosts", f"^{re.escape(SERVER_NAME)}",
                                             "--set", "flow_detail=0", "--set", "termlog_verbosity=warn"])
        wait_for_port(child, port, 60)
        routes.append(Route("mitmproxy", (LOOPBACK, port), target,
                            trusting((confdir / "mitmproxy-ca-cert.pem").read_bytes()), target, child))
    package = Path(args.srt)
    if reason := srt.missing(package):
        unavailable["srt_terminated"] = unavailable["srt_opaque"] = reason
        return routes
    for name, terminate in (("srt_terminated", True), ("srt_opaque", False)):
        child, addr, ca_path = srt.start_proxy(children, name, package, SERVER_NAME, origin_port,
                                               tmp / "origin-ca.pem", terminate)
        pem = ca_path.read_bytes() if ca_path else origin_pem
        routes.append(Route(name, addr, target, trusting(pem), target, child))
    return routes


# ------------------------------------------------------------------------------------------------ output


def versions(args: argparse.Namespace) -> dict[str, str]:
    found: dict[str, str] = {}
    for name, argv in (("mitmproxy", [args.mitmdump or shutil.which("mitmdump") or "mitmdump", "--version"]),
                       ("node", ["node", "--version"])):
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            out = subprocess.run(argv, capture_output=True, text=True, timeout=30).stdout
            found[name] = out.splitlines()[0].split()[-1] if out else "?"
    with contextlib.suppress(OSError, ValueError):
        found["sandbox-runtime"] = srt.version(Path(args.srt))
    with contextlib.suppress(Exception):
        import cryptography

        found["cryptography"] = cryptography.__version__
    return found


def write(doc: dict[str, Any]) -> None:
    m = doc["machine"]
    lines = [
        "# Inspection benchmark: TLS-terminating proxies against the gate's opaque tunnel",
        "",
        f"Date: {m['date']}  ",
        f"Command: `{doc['command']}`{' (quick)' if doc['quick'] else ''}  ",
        machine_line(m),
        f"Versions: {', '.join(f'{k} {v}' for k, v in doc['versions'].items())}  ",
        f"Load average (1 min) at start: {m['loadavg_at_start']:.2f}  ",
        *status_lines(doc),
        "",
        f"Routes measured: {', '.join(doc['routes'])}. Added latency = route p50 - direct p50. MB = 10^6 bytes.",
        "",
    ]
    if doc["unavailable"]:
        lines += ["Not measured:", ""] + [f"- `{k}`: {v}" for k, v in doc["unavailable"].items()] + [""]
    lines += results_table(doc["results"])
    lines += ["", "Targets (for the gate's terminated tunnel):", ""]
    for name, target in TARGETS.items():
        found = next((e for e in doc["results"] if e["name"] == name), None)
        lines.append(f"- {'PASS' if found and found['pass'] else 'MISS' if found else 'NOT MEASURED'}: {name} "
                     f"(target {target})" + (f" = {fmt(found['value'])} {found['unit']}" if found else ""))
    lines += ["", "Details:", "", *details_block(doc["details"])]
    write_results("inspection", doc, lines)


TARGETS = {
    "gate_terminated_added_request_latency_p50": "no worse than mitmproxy's",
    "gate_terminated_download": ">= 0.5 x the gate's opaque tunnel",
    f"gate_terminated_rss_{CONCURRENT}_tunnels": "< 150 MB",
}


# ------------------------------------------------------------------------------------------------- main


def run(args: argparse.Namespace) -> int:
    started = time.monotonic()
    deadline = Deadline(args.deadline)
    tmp = Path(tempfile.mkdtemp(prefix="inspection-bench-"))
    children = Children(tmp)
    unavailable: dict[str, str] = {}
    doc: dict[str, Any] = {"benchmark": "inspection", "quick": args.quick, "command": command_line(),
                           "machine": machine_info(), "versions": versions(args), "routes": [],
                           "unavailable": unavailable, "results": [], "details": {}, "complete": False}
    bench: Bench | None = None
    status = 1
    try:
        origin_ca = trustme.CA()
        origin_ca.issue_cert(SERVER_NAME).private_key_and_cert_chain_pem.write_to_path(str(tmp / "origin.pem"))
        with deadline.for_phase("setup", 120):
            origin = children.start("origin", [sys.executable, str(Path(__file__).resolve()), "--_origin", str(tmp),
                                               str(tmp / "origin.port")], stdin_pipe=True)
            end = time.monotonic() + 20
            while not (tmp / "origin.port").is_file() or not (tmp / "origin.port").read_text():
                origin.ensure_alive()
                if time.monotonic() > end:
                    raise BenchError("the origin did not start")
                time.sleep(0.05)
            routes = start_routes(args, children, tmp, origin_ca, int((tmp / "origin.port").read_text()),
                                  unavailable)
        doc["routes"] = [r.name for r in routes]
        bench = Bench(args, deadline, routes)
        phases: list[tuple[str, float, Callable[[], None]]] = [
            ("mint", 60, bench.mint_cost),
            ("concurrent", 300, bench.concurrency),
            ("request latency", 300, bench.request_latency),
            ("setup latency", 300, bench.setup_latency),
            ("download", 300, bench.throughput),
        ]
        for name, limit, phase in phases:
            with deadline.for_phase(name, limit):
                for route in routes:
                    if route.process is not None:
                        route.process.ensure_alive()
                phase()
        doc["complete"] = True
        status = 0
    except BenchError as exc:
        doc["error"] = f"{deadline.phase}: {exc}"
        print(f"benchmark failed in {deadline.phase}: {exc}", file=sys.stderr)
    except Exception as exc:  # the benchmark broke: report what was measured so far, exit 1
        doc["error"] = f"{deadline.phase}: {type(exc).__name__}: {exc}"
        print(f"benchmark failed in {deadline.phase}: {type(exc).__name__}: {exc}", file=sys.stderr)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        status = 130
    finally:
        children.stop_all()
        shutil.rmtree(tmp, ignore_errors=True)
    if status == 130:
        return status
    if bench is not None:
        doc["results"] = [e.as_json() for e in bench.entries]
        doc["details"] = rounded(bench.details)
    doc["duration_s"] = round(time.monotonic() - started, 1)
    if args.write and (doc["complete"] or doc["results"]):
        write(doc)
    for name, text in unavailable.items():
        print(f"NOT MEASURED  {name}: {text}")
    for e in doc["results"]:
        if e["target"]:
            print(f"{'PASS' if e['pass'] else 'MISS'}  {e['name']} = {fmt(e['value'])} {e['unit']} "
                  f"(target {e['target']})")
    return status


def main() -> int:
    if len(sys.argv) == 4 and sys.argv[1] == "--_origin":
        origin_main(sys.argv[2], sys.argv[3])
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer requests and a 64 MiB download (about 20 seconds)")
    parser.add_argument("--requests", type=int, help="keep-alive requests per route (default 2000, quick 300)")
    parser.add_argument("--setups", type=int, help="new connections per route (default 500, quick 100)")
    parser.add_argument("--download-mb", type=int, help="MiB per download (default 256, quick 64)")
    parser.add_argument("--download-reps", type=int, help="downloads per route (default 3, quick 1)")
    parser.add_argument("--mints", type=int, default=500, help="leaves minted in the minting phase")
    parser.add_argument("--mitmdump", help="the mitmdump program (default: from PATH)")
    parser.add_argument("--srt", default=srt.default_package(),
                        help="the installed @anthropic-ai/sandbox-runtime package directory")
    parser.add_argument("--terminate-flag", nargs="*", default=[], metavar="FLAG",
                        help="extra gate flags that turn termination on for --allow targets, if the gate needs any")
    parser.add_argument("--no-write", dest="write", action="store_false", help="do not write results files")
    parser.add_argument("--deadline", type=float, default=GLOBAL_DEADLINE_S, help="global deadline, seconds")
    args = parser.parse_args()
    args.requests = max(1, args.requests or (300 if args.quick else 2000))
    args.setups = max(1, args.setups or (100 if args.quick else 500))
    args.download_bytes = max(1, args.download_mb or (64 if args.quick else 256)) * 2**20
    args.download_reps = max(1, args.download_reps or (1 if args.quick else 3))
    interrupt_on_sigterm()
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
