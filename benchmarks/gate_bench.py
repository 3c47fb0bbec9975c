#!/usr/bin/env python3
"""Benchmark the gate against a direct connection, on loopback, in one run.

    .venv/bin/python benchmarks/gate_bench.py [--quick]

The stub upstream, the gate and a TCP sink each run as their own subprocess; this process is the client.
Every number is measured side by side: DIRECT (client -> stub, or client -> sink) and THROUGH THE GATE
(client -> gate API listener -> stub, or client -> gate proxy CONNECT tunnel -> sink), with the same client
code for both paths. See benchmarks/README.md for what each number means.

Writes benchmarks/results/gate.json and benchmarks/results/gate.md. Exit status: 0 when the benchmark ran
(whether or not every target was met: it is a measurement, not a test), 1 when it could not run, 130 on
Ctrl-C.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchkit import (
    LOOPBACK,
    BenchError,
    Children,
    Deadline,
    Entry,
    command_line,
    details_block,
    interrupt_on_sigterm,
    kb_to_mb,
    log,
    machine_info,
    machine_line,
    phases,
    print_verdicts,
    proc_status_kb,
    ratio,
    results_table,
    rounded,
    status_lines,
    target_lines,
    write_results,
)
from benchkit.phases import Loopback

GLOBAL_DEADLINE_S = 15 * 60


@dataclass
class Bench:
    args: argparse.Namespace
    deadline: Deadline
    lb: Loopback
    entries: list[Entry] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)

    def paths(self) -> dict[str, tuple[str, int]]:
        return {"direct": (LOOPBACK, self.lb.stub_port), "gate": self.lb.api}

    # -- 1. API latency ----------------------------------------------------------------------------

    def api_latency(self) -> None:
        n = self.args.requests
        log(f"1. API latency: {n} sequential small POST /v1/messages each, direct vs gate, keep-alive")
        stats = phases.api_latency(self.paths(), n, self.deadline,
                                   {"gate": self.lb.gate.pid, "direct": self.lb.stub.pid})
        gate_cpu, stub_cpu = stats["gate"].pop("cpu_ms_per_request"), stats["direct"].pop("cpu_ms_per_request")
        self.details["api_cpu_ms_per_request"] = {"gate": gate_cpu, "stub": stub_cpu / 2}  # the stub serves both
        self.details["api_latency_ms"] = stats
        d, g = stats["direct"], stats["gate"]
        for q in ("p50", "p99"):
            self.entries.append(Entry(f"api_latency_{q}", "ms", g[q], "direct", d[q], ratio(g[q], d[q]),
                                      note=f"{n} sequential non-streaming POST /v1/messages, keep-alive"))
        self.entries.append(Entry("api_latency_p50_added", "ms", g["p50"] - d["p50"], "direct", d["p50"],
                                  ratio(g["p50"], d["p50"]), "<= 1.0 ms", g["p50"] - d["p50"] <= 1.0,
                                  "gate p50 - direct p50"))
        self.entries.append(Entry("api_latency_p99_added", "ms", g["p99"] - d["p99"], "direct", d["p99"],
                                  ratio(g["p99"], d["p99"]), note="gate p99 - direct p99"))
        log(f"   direct p50 {d['p50']:.3f} ms p99 {d['p99']:.3f} ms | gate p50 {g['p50']:.3f} ms "
            f"p99 {g['p99']:.3f} ms | added p50 {g['p50'] - d['p50']:.3f} ms p99 {g['p99'] - d['p99']:.3f} ms")
        log(f"   CPU per request: gate {gate_cpu:.3f} ms, stub {stub_cpu / 2:.3f} ms")

    # -- 2. SSE per-event delay ------------------------------------------------------------------------

    def sse_delay(self) -> None:
        events, interval, streams = 200, 0.005, self.args.sse_streams
        log(f"2. SSE per-event delay: {streams} streams of {events} events {interval * 1000:g} ms apart, "
            "each path, alternating")
        stats = phases.sse_delay(self.paths(), streams, self.deadline, events, interval)
        self.details["sse_event_delay_ms"] = stats
        d, g = stats["direct"], stats["gate"]
        note = f"{streams} x {events} events, {interval * 1000:g} ms apart: arrival - sent_ns per event"
        self.entries.append(Entry("sse_event_delay_median", "ms", g["median"], "direct", d["median"],
                                  ratio(g["median"], d["median"]), note=note))
        self.entries.append(Entry("sse_event_delay_p99", "ms", g["p99"], "direct", d["p99"],
                                  ratio(g["p99"], d["p99"]), note=note))
        added = g["median"] - d["median"]
        self.entries.append(Entry("sse_event_delay_median_added", "ms", added, "direct", d["median"],
                                  ratio(g["median"], d["median"]), "<= 1.0 ms", added <= 1.0,
                                  "gate median - direct median"))
        log(f"   direct median {d['median']:.3f} ms p99 {d['p99']:.3f} ms | gate median {g['median']:.3f} ms "
            f"p99 {g['p99']:.3f} ms | added median {added:.3f} ms")

    # -- 3. concurrent streams -------------------------------------------------------------------------

    def concurrent_streams(self) -> None:
        n, events, interval = 64, 50, 0.010
        log(f"3. {n} concurrent SSE streams ({events} events, {interval * 1000:g} ms apart): direct, then gate")
        gate = self.lb.gate
        out = phases.concurrent_streams(self.paths(), {"gate": gate.pid}, n, self.deadline, events, interval)
        gate.ensure_alive()
        d, g = out["direct"], out["gate"]
        self.details["streams64"] = out
        self.entries.append(Entry("streams64_errors", "count", g["error_count"], "direct", d["error_count"], None,
                                  "== 0", g["error_count"] == 0,
                                  f"{n} concurrent streams x {events} events; gate errors: "
                                  f"{g['errors'] or 'none'}; direct errors: {d['errors'] or 'none'}"))
        peak = g["vmhwm_mb"]
        self.entries.append(Entry("streams64_gate_peak_rss", "MB", peak, "gate VmRSS before", g["rss_before_mb"],
                                  ratio(peak, g["rss_before_mb"]), "<= 80 MB", peak <= 80.0,
                                  "gate VmHWM (lifetime peak) after the 64 streams; MB = 10^6 bytes"))
        for q, key in (("median", "event_delay_median_ms"), ("p99", "event_delay_p99_ms")):
            self.entries.append(Entry(f"streams64_event_delay_{q}", "ms", g[key], "direct", d[key],
                                      ratio(g[key], d[key]),
                                      note="per-event delay with 64 streams at once (client in one event loop)"))
        log(f"   errors gate {g['error_count']} {g['errors'] or ''} direct {d['error_count']} {d['errors'] or ''}"
            f" | gate RSS before {g['rss_before_mb']:.1f} MB, VmHWM {peak:.1f} MB | event delay median direct "
            f"{d['event_delay_median_ms']:.3f} ms gate {g['event_delay_median_ms']:.3f} ms")

    # -- 4. tunnel throughput ------------------------------------------------------------------------

    def tunnel_throughput(self) -> None:
        total, reps = self.args.tunnel_bytes, self.args.tunnel_reps
        log(f"4. CONNECT tunnel throughput: {total / 2**20:.0f} MiB in 256 KiB writes, {reps} run(s) per path, "
            "alternating")
        lb = self.lb
        out = phases.tunnel_throughput({"direct": (lb.sink, None), "gate": (lb.proxy, lb.sink_target)},
                                       {"gate": lb.gate.pid}, total, reps, self.deadline)
        lb.gate.ensure_alive()
        d, g = out["median_mb_s"]["direct"], out["median_mb_s"]["gate"]
        out["gate_vmhwm_after_mb"] = kb_to_mb(proc_status_kb(lb.gate.pid, "VmHWM"))
        self.details["tunnel_mb_s"] = out
        self.entries.append(Entry("tunnel_throughput", "MB/s", g, "direct", d, ratio(g, d), ">= 0.5 x direct",
                                  (ratio(g, d) or 0) >= 0.5,
                                  f"median of {reps} x {total / 2**20:.0f} MiB, sink-confirmed; MB = 10^6 bytes"))
        log(f"   median direct {d:.0f} MB/s, gate {g:.0f} MB/s, ratio {ratio(g, d) or 0:.2f}")


# ----------------------------------------------------------------------------------------------- output


def write(doc: dict[str, Any]) -> None:
    m = doc["machine"]
    lines = [
        "# Gate benchmark",
        "",
        f"Date: {m['date']}  ",
        f"Command: `{doc['command']}`{' (quick)' if doc['quick'] else ''}  ",
        machine_line(m, f"h11 {m['libraries'].get('h11', '?')}"),
        f"Load average (1 min) at start: {m['loadavg_at_start']:.2f}  ",
        *status_lines(doc),
        "",
        "Direct = client -> stub (or sink); gate = client -> gate -> stub (or CONNECT tunnel -> sink). "
        "Ratio = gate / direct. MB = 10^6 bytes.",
        "",
        *results_table(doc["results"], "gate"),
        "", "Targets:", "",
        *target_lines(doc["results"]),
        "", "Details (all phases, raw statistics):", "",
        *details_block(doc["details"]),
    ]
    write_results("gate", doc, lines)


# ------------------------------------------------------------------------------------------------- main


def run(args: argparse.Namespace) -> int:
    started = time.monotonic()
    deadline = Deadline(args.deadline)
    tmp = Path(tempfile.mkdtemp(prefix="gate-bench-"))
    children = Children(tmp)
    doc: dict[str, Any] = {"benchmark": "gate", "quick": args.quick, "command": command_line(),
                           "machine": machine_info(), "parameters": {}, "results": [], "details": {},
                           "complete": False}
    bench: Bench | None = None
    status = 1
    try:
        with deadline.for_phase("setup", 60):
            profile = Path(args.profile_gate).resolve() if args.profile_gate else None
            flags = ("--audit-log", str(tmp / "audit.jsonl")) if args.audit else ()
            lb = phases.start_loopback(children, tmp, flags, profile)
        print(f"stub pid {lb.stub.pid} on :{lb.stub_port}; gate pid {lb.gate.pid} API {lb.api[0]}:{lb.api[1]} "
              f"proxy {lb.proxy[0]}:{lb.proxy[1]}; sink pid {lb.sink_child.pid} on {lb.sink_target}", flush=True)
        doc["parameters"] = {"requests": args.requests, "sse_streams": args.sse_streams,
                             "tunnel_bytes": args.tunnel_bytes, "tunnel_reps": args.tunnel_reps,
                             "gate_audit_log": bool(args.audit), "gate_profiled": bool(args.profile_gate)}
        bench = Bench(args, deadline, lb)
        steps: list[tuple[str, float, Callable[[], None]]] = [
            ("api latency", 240, bench.api_latency),
            ("sse delay", 180, bench.sse_delay),
            ("64 streams", 180, bench.concurrent_streams),
            ("tunnel", 300, bench.tunnel_throughput),
        ]
        for name, limit, step in steps:
            if args.only and name.split()[0] not in args.only:
                continue
            with deadline.for_phase(name, limit):
                lb.gate.ensure_alive()
                lb.stub.ensure_alive()
                step()
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
        for child in children.items:
            text = child.tail(4000)
            if "Traceback" in text or "error" in text.lower():
                print(f"--- {child.name} output (exit {child.proc.returncode}) ---\n{text}", file=sys.stderr)
                doc.setdefault("child_output", {})[child.name] = text
        shutil.rmtree(tmp, ignore_errors=True)
    if status == 130:
        return status
    if bench is not None:
        doc["results"] = [e.as_json() for e in bench.entries]
        doc["details"] = rounded(bench.details)
    doc["duration_s"] = round(time.monotonic() - started, 1)
    if args.write and (doc["complete"] or doc["results"]):
        write(doc)
    print_verdicts(doc["results"])
    return status


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer requests and a 200 MB tunnel (about 1 minute)")
    parser.add_argument("--requests", type=int, help="phase 1 requests per path (default 2000, quick 300)")
    parser.add_argument("--sse-streams", type=int, help="phase 2 streams per path (default 5, quick 2)")
    parser.add_argument("--tunnel-mb", type=int, help="phase 4 MiB per run (default 1024, quick 200)")
    parser.add_argument("--tunnel-reps", type=int, help="phase 4 runs per path (default 3, quick 1)")
    parser.add_argument("--only", nargs="+", choices=["api", "sse", "64", "tunnel"], help="run these phases only")
    parser.add_argument("--audit", action="store_true", help="run the gate with --audit-log to a temporary file")
    parser.add_argument("--profile-gate", metavar="FILE", help="run the gate under cProfile, write stats to FILE")
    parser.add_argument("--no-write", dest="write", action="store_false", help="do not write results files")
    parser.add_argument("--deadline", type=float, default=GLOBAL_DEADLINE_S, help="global deadline, seconds")
    args = parser.parse_args()
    args.requests = max(1, args.requests or (300 if args.quick else 2000))
    args.sse_streams = max(1, args.sse_streams or (2 if args.quick else 5))
    args.tunnel_bytes = max(1, args.tunnel_mb or (200 if args.quick else 1024)) * 2**20
    args.tunnel_reps = max(1, args.tunnel_reps or (1 if args.quick else 3))
    interrupt_on_sigterm()
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
