#!/usr/bin/env python3
"""What going through the gate costs when the gate itself goes out through an upstream proxy (squid).

    .venv/bin/python benchmarks/upstream_proxy_bench.py [--quick]

On loopback, each a subprocess: the stub Messages API, the TCP sink (benchkit), squid (Debian's, no cache,
CONNECT to any port of 127.0.0.0/8), a gate with ``--upstream-proxy`` pointing at squid, and the same gate
without it for reference. Three paths, interleaved in blocks so drift hits each alike:

1. Latency: sequential small ``POST /v1/messages`` on one keep-alive connection per path: a client using
   squid directly (a CONNECT tunnel to the stub, requests inside it), the gate's API route through squid (the
   gate's pooled tunnel), and the gate's API route dialling the stub directly. Added latency of the gate
   through squid = its p50 - squid direct's p50.
2. Tunnel throughput: bytes pushed to the sink through a CONNECT tunnel: squid directly, the gate through
   squid (the gate's tunnel inside squid's), the gate directly. Sink-confirmed MB/s, medians of rounds.

Writes benchmarks/results/upstream-proxy.json and .md. Exit status 0 when the run completed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import h11
from benchkit import (
    LOOPBACK,
    SMALL_PAYLOAD,
    BenchError,
    Children,
    Deadline,
    SyncHttp,
    claude_bottle_argv,
    command_line,
    free_port,
    machine_info,
    machine_line,
    messages_request,
    open_tunnel,
    percentile,
    wait_port,
    write_results,
)
from benchkit.phases import BLOCK, start_loopback, tunnel_throughput

SQUID, GATE_SQUID, GATE = "squid directly", "gate through squid", "gate directly"


class TunnelHttp(SyncHttp):
    """A keep-alive connection to ``target`` inside a CONNECT tunnel through the proxy at ``hop``."""

    def __init__(self, hop: tuple[str, int], target: str) -> None:
        self.target = target
        super().__init__(*hop)

    def _connect(self) -> tuple[Any, h11.Connection]:
        sock, status = open_tunnel(self.address, self.target)
        if status != 200:
            raise BenchError(f"CONNECT {self.target} through squid answered {status or 'nothing'}")
        return sock, h11.Connection(h11.CLIENT)


def squid_conf(folder: Path, port: int) -> Path:
    folder.mkdir()
    os.chmod(folder, 0o777)  # squid drops to its own user when started as root
    conf = folder / "squid.conf"
    conf.write_text(f"""
http_port {LOOPBACK}:{port}
acl loopback dst 127.0.0.0/8
acl CONNECT method CONNECT
http_access allow CONNECT loopback
http_access deny all
cache deny all
cache_mem 8 MB
access_log none
cache_store_log none
cache_log {folder}/cache.log
pid_filename {folder}/squid.pid
coredump_dir {folder}
shutdown_lifetime 1 seconds
max_filedescriptors 8192
pinger_enable off
""")
    return conf


def latency(conns: dict[str, SyncHttp], n: int, deadline: Deadline) -> dict[str, dict[str, float]]:
    request = messages_request(SMALL_PAYLOAD)
    for name, conn in conns.items():
        for _ in range(min(100, n)):
            if conn.exchange(request)[0] != 200:
                raise BenchError(f"{name}: warm-up request failed")
    samples: dict[str, list[float]] = {name: [] for name in conns}
    while len(samples[GATE]) < n:
        deadline.check()
        for name, conn in conns.items():
            for _ in range(min(BLOCK, n - len(samples[name]))):
                began = time.perf_counter_ns()
                status, _ = conn.exchange(request)
                samples[name].append((time.perf_counter_ns() - began) / 1e6)
                if status != 200:
                    raise BenchError(f"{name}: answered {status}")
    return {name: {"p50_ms": percentile(v, 50), "p99_ms": percentile(v, 99), "n": len(v)}
            for name, v in samples.items()}


def report(doc: dict[str, Any]) -> list[str]:
    m, lat, thr = doc["machine"], doc["latency"], doc["throughput"]["median_mb_s"]
    lines = ["# The gate through an upstream proxy (squid) against a client using squid directly", "",
             f"Command: `{doc['command']}`  ", machine_line(m, f"squid {doc['squid']}"),
             f"Load average (1 min) at start: {m['loadavg_at_start']:.2f} (a 2-core machine shared with other "
             "work: compare the paths of this run with each other, not with other runs)", "",
             "## Latency of a small POST /v1/messages (sequential, keep-alive, paths interleaved)", "",
             "| path | p50 ms | p99 ms | n |", "| --- | --- | --- | --- |"]
    lines += [f"| {k} | {v['p50_ms']:.3f} | {v['p99_ms']:.3f} | {v['n']} |" for k, v in lat.items()]
    lines += ["", f"Added by the gate through squid, against a client using squid directly: "
              f"**{doc['added_p50_ms']:.3f} ms** at p50 (the gate directly adds "
              f"{lat[GATE]['p50_ms'] - lat[SQUID]['p50_ms']:+.3f} ms against the same baseline).", "",
              f"## Tunnel throughput ({doc['throughput']['bytes'] // 2**20} MiB per round, sink-confirmed, "
              "median of rounds)", "", "| path | MB/s |", "| --- | --- |"]
    lines += [f"| {k} | {v:.0f} |" for k, v in thr.items()]
    lines += ["", f"The gate through squid reaches {thr[GATE_SQUID] / thr[SQUID]:.2f}x squid's own tunnel "
              "throughput.", ""]
    return lines


def run(args: argparse.Namespace) -> int:
    squid = shutil.which("squid") or "/usr/sbin/squid"
    if not Path(squid).exists():
        print("squid is not installed: apt-get install squid (or squid-openssl)", file=sys.stderr)
        return 1
    tmp = Path(tempfile.mkdtemp(prefix="upstream-proxy-bench-"))
    children = Children(tmp)
    deadline = Deadline(args.deadline)
    try:
        m = machine_info()
        port = free_port()
        proxy = children.start("squid", [squid, "-N", "-f", str(squid_conf(tmp / "squid", port))])
        wait_port(proxy, LOOPBACK, port, 60)
        plain = start_loopback(children, tmp)
        proxied = children.start("gate-proxied", [
            *claude_bottle_argv(), "gate", "--api-listen", f"{LOOPBACK}:0", "--proxy-listen", f"{LOOPBACK}:0",
            "--upstream", f"http://{LOOPBACK}:{plain.stub_port}", "--token-file", str(tmp / "token"),
            "--allow-tcp", plain.sink_target, "--allow-private", "127.0.0.0/8", "--max-tunnels", "256",
            "--drain-seconds", "1", "--upstream-proxy", f"http://{LOOPBACK}:{port}"])
        ready = proxied.wait_for_gate(30)
        print(f"1. API latency, {args.requests} requests per path", flush=True)
        conns: dict[str, SyncHttp] = {SQUID: TunnelHttp((LOOPBACK, port), f"{LOOPBACK}:{plain.stub_port}"),
                                      GATE_SQUID: SyncHttp(ready.api.host, ready.api.port), GATE: SyncHttp(*plain.api)}
        try:
            with deadline.for_phase("latency", args.deadline):
                lat = latency(conns, args.requests, deadline)
        finally:
            for conn in conns.values():
                conn.close()
        print(f"2. tunnel throughput, {args.rounds} rounds of {args.mib} MiB per path", flush=True)
        with deadline.for_phase("throughput", args.deadline):
            thr = tunnel_throughput({SQUID: ((LOOPBACK, port), plain.sink_target),
                                     GATE_SQUID: ((ready.proxy.host, ready.proxy.port), plain.sink_target),
                                     GATE: (plain.proxy, plain.sink_target)},
                                    {GATE_SQUID: proxied.pid, GATE: plain.gate.pid}, args.mib * 2**20, args.rounds,
                                    deadline)
        version = os.popen(f"{squid} -v").read().split("\n")[0].removeprefix("Squid Cache: Version ").strip()
        doc = {"benchmark": "upstream-proxy", "command": command_line(), "machine": m, "squid": version,
               "latency": lat, "added_p50_ms": lat[GATE_SQUID]["p50_ms"] - lat[SQUID]["p50_ms"], "throughput": thr}
        if args.write:
            write_results("upstream-proxy", doc, report(doc))
        print("\n".join(report(doc)))
        return 0
    except BenchError as exc:
        print(f"upstream-proxy benchmark failed: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    finally:
        children.stop_all()
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds (about 30 seconds)")
    parser.add_argument("--no-write", dest="write", action="store_false", help="do not write results files")
    parser.add_argument("--deadline", type=float, default=600, help="global deadline, seconds")
    args = parser.parse_args()
    args.requests, args.rounds, args.mib = (500, 3, 64) if args.quick else (3000, 7, 256)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
