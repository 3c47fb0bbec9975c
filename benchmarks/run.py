#!/usr/bin/env python3
"""The whole benchmark in one run: the gate against a direct connection and against Debian's nginx (API
route), squid and sandbox-runtime's proxy (egress), on loopback with the stub Messages API; then real
bottles on the Docker engine (`claude-bottle run -p` against plain `docker run`, teardown, image sizes,
gate idle RSS).

    .venv/bin/python benchmarks/run.py [--quick] [--only api egress bottle]

Writes benchmarks/results/latest.json and benchmarks/results/latest.md and prints one PASS/MISS line per
target. Exit status: 0 when the benchmark ran (targets met or not), 1 when it could not run, 130 on Ctrl-C.
Needs nginx and squid (`apt-get install nginx-light squid`), for the egress part sandbox-runtime (`npm install
--prefix /opt/srt @anthropic-ai/sandbox-runtime`, node >= 20.11) and, for the bottle part, a Docker engine and
the images (`claude-bottle build`). See benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchkit import (
    HERE,
    LOOPBACK,
    MB,
    RESULTS,
    SINK_HOST,
    SMALL_PAYLOAD,
    BenchError,
    Child,
    Children,
    Deadline,
    Entry,
    SyncHttp,
    command_line,
    details_block,
    floor,
    free_port,
    interrupt_on_sigterm,
    log,
    machine_info,
    messages_request,
    open_tunnel,
    percentile,
    phases,
    print_verdicts,
    ratio,
    results_table,
    rounded,
    srt,
    target_lines,
    tool_version,
    tree_cpu,
    wait_port,
    write_results,
)
from benchkit.bottle import Bottle

from claude_bottle.gate.api import GATE_SET_HEADERS
from claude_bottle.gate.dlp import DlpPolicy
from claude_bottle.gate.forward import FRAMING_HEADERS
from claude_bottle.gate.http1 import MAX_HEADER_BYTES, MessageParser, Request, end_to_end
from claude_bottle.gate.routes import CLIENT_CREDENTIAL_SPELLINGS

DENIED_TARGET = "127.0.0.3:443"  # allowed by neither the gate nor squid
# A request head as Claude Code 2.1.190 sent it (`claude -p`, OAuth placeholder token), captured on loopback.
CLAUDE_CODE_HEAD = HERE / "benchkit" / "claude_code_head.http"
HEAD_CHECK_TARGET_US = 6.0
# The gate's added p50 latency on small API requests, as a multiple of nginx's in the same run.
ADDED_LATENCY_TARGET_X_NGINX = 2.0


# ----------------------------------------------------------------------------------- baseline configs


def nginx_conf(tmp: Path, port: int, stub_port: int, token: str) -> Path:
    """The reverse proxy a user would write: streaming responses, keep-alive to the upstream, the token
    injected and the client's own credential dropped."""
    d = tmp / "nginx"
    d.mkdir()
    conf = d / "nginx.conf"
    conf.write_text(f"""
worker_processes auto;
daemon off;
pid {d}/nginx.pid;
error_log {d}/error.log warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    client_body_temp_path {d}/body; proxy_temp_path {d}/proxy; fastcgi_temp_path {d}/fastcgi;
    uwsgi_temp_path {d}/uwsgi; scgi_temp_path {d}/scgi;
    client_max_body_size 64m;
    keepalive_requests 1000000;
    upstream anthropic {{
        server {LOOPBACK}:{stub_port};
        keepalive 64;
        keepalive_requests 1000000;
    }}
    server {{
        listen {LOOPBACK}:{port};
        location / {{
            proxy_pass http://anthropic;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Authorization "Bearer {token}";
            proxy_set_header x-api-key "";
            proxy_buffering off;
            proxy_request_buffering off;
            proxy_read_timeout 600s;
        }}
    }}
}}
""")
    return conf


def squid_conf(tmp: Path, port: int, sink_port: int) -> Path:
    """CONNECT to the sink's host:port only, everything else denied; no cache, no access log (the gate runs
    without its audit log too)."""
    d = tmp / "squid"
    d.mkdir()
    os.chmod(d, 0o777)  # squid drops to its own user when started as root
    conf = d / "squid.conf"
    conf.write_text(f"""
http_port {LOOPBACK}:{port}
acl sink_host dst {SINK_HOST}
acl sink_port port {sink_port}
acl CONNECT method CONNECT
http_access allow CONNECT sink_host sink_port
http_access deny all
cache deny all
cache_mem 8 MB
access_log none
cache_store_log none
cache_log {d}/cache.log
pid_filename {d}/squid.pid
coredump_dir {d}
shutdown_lifetime 1 seconds
max_filedescriptors 8192
pinger_enable off
""")
    return conf


# ----------------------------------------------------------------------------------------- gate part


class Loopback:
    """Stub, sink and gate (benchkit.phases), nginx, squid and sandbox-runtime's proxy as subprocesses;
    this process is the client."""

    def __init__(self, args: argparse.Namespace, deadline: Deadline, children: Children, tmp: Path,
                 entries: list[Entry], details: dict[str, Any]) -> None:
        self.args, self.deadline, self.children, self.tmp = args, deadline, children, tmp
        self.entries, self.details = entries, details

    def setup(self, need_egress: bool) -> None:
        ch = self.children
        # The gate and Python's floors run on the Python the gate ships with (Debian's, in the gate image), not
        # on this one, whose build may be slower (a shared libpython, no profile-guided optimization).
        image = None
        if not self.args.gate_on_host:
            image, python = phases.gate_image()
            self.details["gate_runs_in"] = {"image": image, "python": python}
        else:
            self.details["gate_runs_in"] = {"image": None, "python": f"Python {sys.version.split()[0]}"}
        self.lb = lb = phases.start_loopback(ch, self.tmp, image=image)
        self.gate = lb.gate
        nginx = shutil.which("nginx") or "/usr/sbin/nginx"
        if not Path(nginx).exists():
            raise BenchError("nginx is not installed: apt-get install nginx-light")
        nport = free_port()
        conf = nginx_conf(self.tmp, nport, lb.stub_port, lb.token)
        self.nginx = ch.start("nginx", [nginx, "-c", str(conf), "-p", str(conf.parent), "-e", "stderr"])
        wait_port(self.nginx, LOOPBACK, nport, 20)
        self.nginx_addr = (LOOPBACK, nport)
        # Python's floor for the API latency phase only: it does not stream.
        self.floors = {name: floor.start(ch, name, lb.stub_port, self.tmp / "token", checks, image)
                       for name, checks in (("python floor", False), ("python checks", True))}
        self.egress: dict[str, tuple[Child, tuple[str, int]]] = {}
        if need_egress:
            squid = shutil.which("squid") or "/usr/sbin/squid"
            if not Path(squid).exists():
                raise BenchError("squid is not installed: apt-get install squid")
            sport = free_port()
            sconf = squid_conf(self.tmp, sport, lb.sink[1])
            squid_child = ch.start("squid", [squid, "-N", "-f", str(sconf)])
            wait_port(squid_child, LOOPBACK, sport, 60)
            self.egress["squid"] = (squid_child, (LOOPBACK, sport))
            srt_child, srt_addr, _ = srt.start_proxy(ch, "srt", Path(self.args.srt), lb.sink[0], lb.sink[1], None,
                                                     terminate=False)
            self.egress["srt"] = (srt_child, srt_addr)
        log(f"stub :{lb.stub_port} gate API :{lb.api[1]} proxy :{lb.proxy[1]} nginx :{nport} sink "
            f"{lb.sink_target}" + "".join(f" {k} :{a[1]}" for k, (_, a) in self.egress.items()))

    def api_paths(self) -> dict[str, tuple[str, int]]:
        return {"direct": (LOOPBACK, self.lb.stub_port), "gate": self.lb.api, "nginx": self.nginx_addr}

    def egress_paths(self, target: str) -> dict[str, tuple[tuple[str, int], str | None]]:
        """direct (to the sink itself; omitted when ``target`` is not the sink), gate, squid, srt."""
        paths: dict[str, tuple[tuple[str, int], str | None]] = {}
        if target == self.lb.sink_target:
            paths["direct"] = (self.lb.sink, None)
        paths["gate"] = (self.lb.proxy, target)
        paths.update({k: (addr, target) for k, (_, addr) in self.egress.items()})
        return paths

    def egress_pids(self) -> dict[str, int]:
        return {"gate": self.gate.pid, **{k: c.pid for k, (c, _) in self.egress.items()}}

    def peer_rows(self, name: str, unit: str, values: dict[str, float], note: str = "",
                  target: str | None = None, passed: bool | None = None) -> None:
        """One row per egress peer: ``name`` against squid (with the target, if any), ``name_vs_srt``
        against sandbox-runtime's proxy."""
        g = values["gate"]
        self.entries.append(Entry(name, unit, g, "squid", values["squid"], ratio(g, values["squid"]), target,
                                  passed, note))
        self.entries.append(Entry(f"{name}_vs_srt", unit, g, "sandbox-runtime", values["srt"],
                                  ratio(g, values["srt"])))

    # -- API latency -------------------------------------------------------------------------------

    def api_latency(self) -> None:
        n = self.args.requests
        log(f"API latency: {n} sequential small POST /v1/messages per path (direct, gate, nginx, Python's floor "
            "without and with the gate's checks), keep-alive")
        floors = {name: addr for name, (_, addr) in self.floors.items()}
        st = phases.api_latency({**self.api_paths(), **floors}, n, self.deadline,
                                {"gate": self.gate.pid, "nginx": self.nginx.pid,
                                 **{name: child.pid for name, (child, _) in self.floors.items()}})
        self.details["api_latency_ms"] = st
        added = {k: {q: v[q] - st["direct"][q] for q in ("p50", "p99")} for k, v in st.items()}
        for q in ("p50", "p99"):
            g_add, n_add = added["gate"][q], added["nginx"][q]
            self.entries.append(Entry(f"api_latency_{q}", "ms", st["gate"][q], "direct", st["direct"][q],
                                      ratio(st["gate"][q], st["direct"][q]), note="gate, total"))
            tgt = f"<= {ADDED_LATENCY_TARGET_X_NGINX:g} x nginx" if q == "p50" else None
            self.entries.append(Entry(f"api_added_latency_{q}", "ms", g_add, "nginx", n_add, ratio(g_add, n_add),
                                      tgt, (g_add <= ADDED_LATENCY_TARGET_X_NGINX * n_add) if tgt else None,
                                      f"{q} over the direct {q}; {n} sequential small non-streaming requests"))
        n_add = added["nginx"]["p50"]
        for name, note in (("python floor", "the least a Python proxy adds (benchkit/floor.py): protocol callbacks, "
                                            "no checks"),
                           ("python checks", "the same with the gate's checks called directly: Messages policy, "
                                             "DLP, reflection scan")):
            value = added[name]["p50"]
            self.entries.append(Entry(f"api_added_latency_p50_{name.replace(' ', '_')}", "ms", value, "nginx",
                                      n_add, ratio(value, n_add), note=note))
        cpu = {k: v["cpu_ms_per_request"] for k, v in st.items() if "cpu_ms_per_request" in v}
        self.entries.append(Entry("api_cpu_per_request", "ms", cpu["gate"], "nginx", cpu["nginx"],
                                  ratio(cpu["gate"], cpu["nginx"]),
                                  note="CPU the proxy spent per request (/proc, all its processes); Python's "
                                       f"floor {cpu['python floor']:.3f}, with the checks {cpu['python checks']:.3f}"))
        log("   " + " | ".join(f"{k} p50 {v['p50']:.3f} p99 {v['p99']:.3f} ms" for k, v in st.items())
            + " | CPU/request " + " ".join(f"{k} {v:.3f}" for k, v in cpu.items()))

    # -- a real request head's check ---------------------------------------------------------------

    def head_check(self) -> None:
        """DLP's check of Claude Code's request head as the API route's DLP filter sees it, on a matcher
        prepared as the gate's is (the default rules, the gate's token held): in this process, median of
        rounds."""
        target, headers = api_route_head(CLAUDE_CODE_HEAD.read_bytes())
        matcher = DlpPolicy().matcher([self.lb.token.encode()])
        size = len(target) + sum(len(n) + len(v) + 4 for n, v in headers)
        n, rounds = 2000, 7
        log(f"Claude Code request head check: {size} bytes (target + headers as DLP sees them), {rounds} x {n}")

        def one_round() -> float:
            t0 = time.perf_counter()
            for _ in range(n):
                matcher.scanner().check_head(target, headers)
            return (time.perf_counter() - t0) / n * 1e6

        def floor_round() -> float:  # one search of the token over the same bytes: what any scan costs
            needle = self.lb.token.encode()
            t0 = time.perf_counter()
            for _ in range(n):
                needle in b"".join([name + b": " + value + b"\r\n" for name, value in headers])  # noqa: B015
            return (time.perf_counter() - t0) / n * 1e6

        one_round()  # warm-up
        us = [one_round() for _ in range(rounds)]
        floor_us = percentile([floor_round() for _ in range(rounds)], 50)
        med = percentile(us, 50)
        self.details["claude_code_head_check_us"] = {"rounds": us, "bytes": size, "find_floor_us": floor_us}
        self.entries.append(Entry("claude_code_head_check", "us", med, "join + one find", floor_us,
                                  ratio(med, floor_us),
                                  f"<= {HEAD_CHECK_TARGET_US:g} us", med <= HEAD_CHECK_TARGET_US,
                                  f"DLP check_head on a real Claude Code head ({size} bytes as checked); median of "
                                  f"{rounds} x {n}, in the benchmark's process"))
        log(f"   {med:.1f} us per head (the headers joined and one search of the token: {floor_us:.1f} us)")

    # -- SSE per-event delay -----------------------------------------------------------------------

    def sse_delay(self) -> None:
        events, interval, streams = 200, 0.005, self.args.sse_streams
        log(f"SSE per-event delay: {streams} streams x {events} events, {interval * 1000:g} ms apart, per path")
        st = phases.sse_delay(self.api_paths(), streams, self.deadline, events, interval)
        self.details["sse_event_delay_ms"] = st
        g_add = st["gate"]["median"] - st["direct"]["median"]
        n_add = st["nginx"]["median"] - st["direct"]["median"]
        self.entries.append(Entry("sse_added_delay_median", "ms", g_add, "nginx", n_add, ratio(g_add, n_add),
                                  "<= 1.0 ms", g_add <= 1.0,
                                  f"per-event delay over direct's; {streams} x {events} events"))
        g99 = st["gate"]["p99"] - st["direct"]["p99"]
        n99 = st["nginx"]["p99"] - st["direct"]["p99"]
        self.entries.append(Entry("sse_added_delay_p99", "ms", g99, "nginx", n99, ratio(g99, n99)))
        log("   " + " | ".join(f"{k} median {v['median']:.3f} p99 {v['p99']:.3f} ms" for k, v in st.items()))

    # -- 256 concurrent streams --------------------------------------------------------------------

    def streams(self) -> None:
        n, events, interval = self.args.streams, 50, 0.010
        log(f"{n} concurrent SSE streams ({events} events, {interval * 1000:g} ms apart): direct, gate, nginx")
        out = phases.concurrent_streams(self.api_paths(), {"gate": self.gate.pid, "nginx": self.nginx.pid}, n,
                                        self.deadline, events, interval)
        for k, rec in out.items():
            log(f"   {k}: errors {rec['error_count']} {rec['errors'] or ''}"
                + (f", VmHWM {rec['vmhwm_mb']:.1f} MB, CPU {rec['cpu_s']:.2f} s" if "cpu_s" in rec else ""))
        self.gate.ensure_alive()
        self.details[f"streams{n}"] = out
        g, ng = out["gate"], out["nginx"]
        self.entries.append(Entry(f"streams{n}_errors", "count", g["error_count"], "nginx", ng["error_count"], None,
                                  "== 0", g["error_count"] == 0,
                                  f"direct errors {out['direct']['error_count']}; gate {g['errors'] or 'none'}"))
        self.entries.append(Entry(f"streams{n}_gate_peak_rss", "MB", g["vmhwm_mb"], "nginx", ng["vmhwm_mb"],
                                  ratio(g["vmhwm_mb"], ng["vmhwm_mb"]), "<= 120 MB", g["vmhwm_mb"] <= 120,
                                  "VmHWM (lifetime peak, after the API and SSE phases); nginx: sum over master "
                                  "+ workers"))
        self.entries.append(Entry(f"streams{n}_cpu_seconds", "s", g["cpu_s"], "nginx", ng["cpu_s"],
                                  ratio(g["cpu_s"], ng["cpu_s"]), note=f"CPU spent on {n} x {events} events"))

    # -- 10 MB request bodies ----------------------------------------------------------------------

    def big_bodies(self) -> None:
        reps, size = self.args.body_reps, 10 * MB
        log(f"10 MB request bodies: {reps} sequential POST /v1/messages per path, keep-alive")
        filler = "x" * (size - 200)
        conns = {k: SyncHttp(*a) for k, a in self.api_paths().items()}
        rates: dict[str, list[float]] = {k: [] for k in conns}
        try:
            request = messages_request({**SMALL_PAYLOAD, "messages": [{"role": "user", "content": filler}]})
            body_len = len(request[2])
            for k, c in conns.items():  # warm-up
                if c.exchange(request)[0] != 200:
                    raise BenchError(f"{k}: 10 MB request refused")
            pids = {"gate": self.gate.pid, "nginx": self.nginx.pid}
            cpu0 = {k: tree_cpu(pid) for k, pid in pids.items()}
            for _ in range(reps):
                for k, c in conns.items():
                    self.deadline.check()
                    t0 = time.perf_counter()
                    status, _ = c.exchange(request)
                    secs = time.perf_counter() - t0
                    if status != 200:
                        raise BenchError(f"{k}: 10 MB request answered {status}")
                    rates[k].append(body_len / MB / secs)
            cpu = {k: (tree_cpu(pid) - cpu0[k]) / reps * 1000 for k, pid in pids.items()}
        finally:
            for c in conns.values():
                c.close()
        med = {k: percentile(v, 50) for k, v in rates.items()}
        self.details["body10mb_mb_s"] = {**rates, "body_bytes": body_len}
        self.details["body10mb_cpu_ms_per_request"] = cpu
        self.entries.append(Entry("body10mb_throughput", "MB/s", med["gate"], "nginx", med["nginx"],
                                  ratio(med["gate"], med["nginx"]), ">= nginx", med["gate"] >= med["nginx"],
                                  note=f"median of {reps}; request sent -> response read; direct {med['direct']:.0f}"
                                  " MB/s (the stub parses the JSON on every path)"))
        self.entries.append(Entry("body10mb_cpu_per_request", "ms", cpu["gate"], "nginx", cpu["nginx"],
                                  ratio(cpu["gate"], cpu["nginx"]),
                                  note="CPU the proxy spent per 10 MB request (/proc, all its processes)"))
        log("   " + " | ".join(f"{k} {v:.0f} MB/s" for k, v in med.items()))

    # -- egress ------------------------------------------------------------------------------------

    def _connect_once(self, first_hop: tuple[str, int], target: str | None) -> tuple[int, float]:
        """One setup: TCP connect, CONNECT (unless direct), an empty exchange with the sink, close.
        Returns (status, seconds); status is the proxy's answer (200 direct)."""
        t0 = time.perf_counter()
        sock, status = open_tunnel(first_hop, target)
        try:
            if status != 200:
                return status, time.perf_counter() - t0
            sock.sendall(b"\0" * 8)  # the sink: expect 0 bytes; it answers with the 8-byte count
            ack = b""
            while len(ack) < 8:
                data = sock.recv(8 - len(ack))
                if not data:
                    raise BenchError("the sink closed early")
                ack += data
            return 200, time.perf_counter() - t0
        finally:
            sock.close()

    def _sequential(self, paths: dict[str, tuple[tuple[str, int], str | None]], n: int, expect: int,
                    warm: int) -> dict[str, list[float]]:
        """``n`` setups per path after ``warm`` unrecorded ones, paths interleaved in blocks; ms each."""
        times: dict[str, list[float]] = {k: [] for k in paths}
        done = -warm
        while done < n:
            self.deadline.check()
            m = min(phases.BLOCK, n - done) if done >= 0 else -done
            for k, (hop, target) in paths.items():
                for _ in range(m):
                    status, secs = self._connect_once(hop, target)
                    if status != expect:
                        raise BenchError(f"{k}: CONNECT {target} answered {status}, expected {expect}")
                    if done >= 0:
                        times[k].append(secs * 1000)
            done += m
        return times

    def connect_rate(self) -> None:
        n = self.args.connects
        paths = self.egress_paths(self.lb.sink_target)
        log(f"CONNECT setups: {n} sequential per path ({', '.join(paths)}): connect, CONNECT, 8-byte exchange "
            "with the sink, close")
        times = self._sequential(paths, n, 200, min(50, n))
        rate = {k: len(v) * 1000 / sum(v) for k, v in times.items()}
        self.details["connect_setup_ms"] = {k: {"p50": percentile(v, 50), "p99": percentile(v, 99),
                                                "per_s": rate[k]} for k, v in times.items()}
        self.peer_rows("egress_connect_setups_per_s", "1/s", rate,
                       f"sequential, one client; direct {rate['direct']:.0f}/s")
        log("   " + " | ".join(f"{k} {v:.0f}/s" for k, v in rate.items()))

    def denied_latency(self) -> None:
        n = self.args.denied
        paths = self.egress_paths(DENIED_TARGET)
        log(f"Denied CONNECT {DENIED_TARGET}: {n} per path ({', '.join(paths)}), fresh connection each, time to "
            "the refusal")
        times = self._sequential(paths, n, 403, 10)
        st = {k: {"p50": percentile(v, 50), "p99": percentile(v, 99)} for k, v in times.items()}
        self.details["denied_decision_ms"] = st
        self.peer_rows("egress_denied_decision_p50", "ms", {k: v["p50"] for k, v in st.items()},
                       "TCP connect + CONNECT to a 403 answer (IP literal, no DNS)")
        self.peer_rows("egress_denied_decision_p99", "ms", {k: v["p99"] for k, v in st.items()})
        log("   " + " | ".join(f"{k} p50 {v['p50']:.3f} p99 {v['p99']:.3f} ms" for k, v in st.items()))

    def tunnel(self) -> None:
        total, reps = self.args.tunnel_bytes, self.args.tunnel_reps
        paths = self.egress_paths(self.lb.sink_target)
        log(f"Tunnel throughput: {total / 2**20:.0f} MiB, {reps} run(s) per path ({', '.join(paths)}), alternating")
        out = phases.tunnel_throughput(paths, self.egress_pids(), total, reps, self.deadline)
        self.details["tunnel_mb_s"] = out
        med = out["median_mb_s"]
        self.peer_rows("tunnel_throughput", "MB/s", med, f"median of {reps} x {total / 2**20:.0f} MiB, "
                       f"sink-confirmed; direct {med['direct']:.0f} MB/s", ">= squid", med["gate"] >= med["squid"])
        log("   " + " | ".join(f"{k} {v:.0f} MB/s" for k, v in med.items()))


def api_route_head(raw: bytes) -> tuple[bytes, list[tuple[bytes, bytes]]]:
    """``raw`` (a request head) parsed by the gate's parser: its target and headers as the API route's DLP
    filter sees them (gate/api.py): end-to-end only, no framing, without the client's credentials, Host and
    Accept-Encoding (the gate sets those after DLP)."""
    parser = MessageParser(False, MAX_HEADER_BYTES)
    parser.receive(raw)
    request = parser.events[0]
    if not isinstance(request, Request):
        raise BenchError(f"{CLAUDE_CODE_HEAD}: not a request head")
    drop = CLIENT_CREDENTIAL_SPELLINGS | GATE_SET_HEADERS | FRAMING_HEADERS
    return request.target, [(n, v) for n, v in end_to_end(request.headers) if n not in drop]


# ----------------------------------------------------------------------------------------------- output


def write(doc: dict[str, Any]) -> None:
    m = doc["machine"]
    v = doc["versions"]
    lines = [
        "# claude-bottle benchmark", "",
        f"Date: {m['date']}  ",
        f"Command: `{doc['command']}`  ",
        f"Machine: {m['cpu_model']}, {m['cores']} cores ({m['cores_usable']} usable), {m['ram_gb']} GB RAM, "
        f"{m['kernel']}, load average at start {m['loadavg_at_start']:.2f}  ",
        "Versions: " + ", ".join(f"{k} {val}" for k, val in v.items() if val) + "  ",
        f"Commit: {m['commit'] or '?'}{' + uncommitted changes in src' if m['src_modified_since_commit'] else ''}  ",
        f"Status: {'complete' if doc['complete'] else 'INCOMPLETE: ' + str(doc.get('error'))}; "
        f"duration {doc['duration_s']:.0f} s", "",
        f"Gate = `claude-bottle gate` ({_gate_runs_in(doc['details'].get('gate_runs_in'))}); direct = straight to "
        "the stub (or sink); nginx = Debian's nginx as a "
        "reverse proxy (proxy_buffering off, keep-alive upstream, Authorization injected); squid = Debian's "
        "squid allowing CONNECT to the sink only; sandbox-runtime = the HTTP proxy of Anthropic's "
        "`@anthropic-ai/sandbox-runtime` (`srt`) allowing the sink only, opaque tunnels; Python's floor = the "
        "cheapest API proxy Python allows (benchkit/floor.py), without and with the gate's checks. Added = path - "
        "direct. MB = 10^6 bytes.", "",
        *results_table(doc["results"]),
        "", "Targets:", "",
        *target_lines(doc["results"]),
    ]
    if doc.get("analysis"):
        lines += ["", "Analysis:", ""] + [f"- {a}" for a in doc["analysis"]]
    lines += ["", "Details:", "", *details_block(doc["details"])]
    write_results("latest", doc, lines)


def _gate_runs_in(where: dict[str, Any] | None) -> str:
    """Where the gate and Python's floors ran, as the report's header says it."""
    if not where:
        return "on the benchmark's Python"
    return (f"it and Python's floors ran in the gate image {where['image']}, on {where['python']}"
            if where.get("image") else f"it and Python's floors ran on the benchmark's Python, {where['python']}: "
            "--gate-on-host")


ANALYSIS_FILE = HERE / "analysis.json"  # hand-written notes on misses, copied into the report if present


def versions(args: argparse.Namespace) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    with contextlib.suppress(Exception):
        from importlib.metadata import version
        out["claude-bottle"] = version("claude-bottle")
        out["h11"] = version("h11")
        out["httptools"] = version("httptools")
    out["nginx"] = (tool_version(["nginx", "-v"]) or "").replace("nginx version: ", "") or None
    out["squid"] = tool_version(["squid", "-v"])
    out["sandbox-runtime"] = srt.version(Path(args.srt))
    out["node"] = tool_version(["node", "--version"])
    out["docker"] = tool_version(["docker", "version", "-f", "{{.Server.Version}}"])
    with contextlib.suppress(Exception):
        from claude_bottle.claude_code import DEFAULT_CLAUDE_CODE_VERSION
        out["claude-code"] = DEFAULT_CLAUDE_CODE_VERSION
    return out


def run(args: argparse.Namespace) -> int:
    started_at = time.monotonic()
    deadline = Deadline(args.deadline)
    tmp = Path(tempfile.mkdtemp(prefix="cb-bench-"))
    os.chmod(tmp, 0o755)
    children = Children(tmp)
    entries: list[Entry] = []
    details: dict[str, Any] = {}
    doc: dict[str, Any] = {"benchmark": "claude-bottle", "quick": args.quick, "command": command_line(),
                           "machine": machine_info(), "versions": versions(args), "parameters": {
                               k: v for k, v in vars(args).items() if k not in ("write",)},
                           "results": [], "details": {}, "complete": False}
    status = 1
    bottle: Bottle | None = None
    bottle_entries: list[Entry] = []  # measured first (below), listed last
    try:
        parts = args.only or ["api", "egress", "bottle"]
        # Bottles first: the loopback phases leave thousands of connections in the kernel's connection tracking
        # (TIME_WAIT, two minutes), which slows every container's network setup and teardown on the engine.
        if "bottle" in parts:
            bottle = Bottle(args, deadline, tmp, bottle_entries, details)
            with deadline.for_phase("bottle", 600):
                bottle.setup()
                bottle.measure()
                bottle.start_breakdown()
                bottle.idle_and_sizes()
        if "api" in parts or "egress" in parts:
            lb = Loopback(args, deadline, children, tmp, entries, details)
            with deadline.for_phase("loopback setup", 90):
                lb.setup("egress" in parts)
            phases: list[tuple[str, str, float, Callable[[], None]]] = [
                ("api", "head check", 60, lb.head_check),
                ("api", "api latency", 240, lb.api_latency),
                ("api", "sse delay", 180, lb.sse_delay),
                ("api", "streams", 240, lb.streams),
                ("api", "10 MB bodies", 180, lb.big_bodies),
                ("egress", "connect rate", 120, lb.connect_rate),
                ("egress", "denied", 120, lb.denied_latency),
                ("egress", "tunnel", 300, lb.tunnel),
            ]
            for part, name, limit, fn in phases:
                if part not in parts:
                    continue
                with deadline.for_phase(name, limit):
                    for c in children.items:
                        c.ensure_alive()
                    fn()
            children.stop_all()
        doc["complete"] = True
        status = 0
    except BenchError as exc:
        doc["error"] = f"{deadline.phase}: {exc}"
        print(f"benchmark failed in {deadline.phase}: {exc}", file=sys.stderr)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        status = 130
    except Exception as exc:
        doc["error"] = f"{deadline.phase}: {type(exc).__name__}: {exc}"
        print(f"benchmark failed in {deadline.phase}: {type(exc).__name__}: {exc}", file=sys.stderr)
    finally:
        with contextlib.suppress(BaseException):
            children.stop_all()
        if bottle is not None:
            with contextlib.suppress(BaseException):
                bottle.cleanup()
        for child in children.items:
            text = child.tail(3000)
            if "Traceback" in text:
                doc.setdefault("child_output", {})[child.name] = text
        shutil.rmtree(tmp, ignore_errors=True)
    if status == 130:
        return status
    doc["results"] = [e.as_json() for e in entries + bottle_entries]
    doc["details"] = rounded(details)
    doc["duration_s"] = round(time.monotonic() - started_at, 1)
    with contextlib.suppress(OSError, ValueError):
        doc["analysis"] = json.loads(ANALYSIS_FILE.read_text())
    if args.write and doc["results"]:
        write(doc)
    print_verdicts(doc["results"])
    return status


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller phases (about 2 minutes)")
    parser.add_argument("--only", nargs="+", choices=["api", "egress", "bottle"], help="run these parts only")
    parser.add_argument("--no-write", dest="write", action="store_false", help="do not write results files")
    parser.add_argument("--deadline", type=float, default=20 * 60, help="global deadline, seconds")
    parser.add_argument("--srt", default=srt.default_package(),
                        help="node_modules/@anthropic-ai/sandbox-runtime of an npm install (the egress peer)")
    parser.add_argument("--gate-on-host", action="store_true",
                        help="run the gate and Python's floors on this Python, not in the gate image (no Docker "
                             "needed; a Python built without optimizations makes the gate slower than shipped)")
    parser.add_argument("--render", action="store_true",
                        help="only rewrite results/latest.md from results/latest.json and analysis.json")
    args = parser.parse_args()
    if args.render:
        doc = json.loads((RESULTS / "latest.json").read_text())
        with contextlib.suppress(OSError, ValueError):
            doc["analysis"] = json.loads(ANALYSIS_FILE.read_text())
        write(doc)
        return 0
    q = args.quick
    args.requests = 300 if q else 2000
    args.sse_streams = 2 if q else 5
    args.streams = 256
    args.body_reps = 3 if q else 10
    args.connects = 200 if q else 1000
    args.denied = 100 if q else 500
    args.tunnel_bytes = (200 if q else 1024) * 2**20
    args.tunnel_reps = 1 if q else 3
    args.bottle_reps = 2 if q else 11
    interrupt_on_sigterm()
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
