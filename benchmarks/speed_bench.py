#!/usr/bin/env python3
"""The gate's API route at two revisions side by side: the working tree's gate against the gate of a git
revision (``--base``, default ``main``), nginx and a direct connection, in one run, requests alternating
between the paths, so a change to the gate's hot path is measured against its baseline under the same load.

    .venv/bin/python benchmarks/speed_bench.py [--base REV] [--small N] [--bodies N] [--dlp-formats-off]

Small requests: N sequential small ``POST /v1/messages`` per path in blocks of 50, plus Python's floor proxy
without and with the gate's checks (benchkit/floor.py). 10 MB bodies: N rounds, one request per path per
round. For each path: median latency, added over direct, ratio to nginx's added latency (small) or to
nginx's throughput (bodies), and CPU per request of every proxy process (``/proc``: robust to other load,
unlike latency). ``--dlp-formats-off`` runs both gates with every DLP format rule off (the held secret is
still matched), to measure the path apart from DLP's format rules. Writes results/gate-speed.{json,md}.
Needs nginx (``apt-get install nginx-light``). Loopback only; every process it starts is stopped on exit.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchkit import (
    LOOPBACK,
    MB,
    ROOT,
    SMALL_PAYLOAD,
    BenchError,
    Children,
    SyncHttp,
    command_line,
    floor,
    free_port,
    log,
    machine_info,
    messages_request,
    percentile,
    phases,
    rounded,
    tree_cpu,
    wait_port,
    write_results,
)
from benchkit.client import Request
from benchkit.results import machine_line
from run import nginx_conf

from claude_bottle.gate.dlp import BUILTIN_NAMES

BLOCK = 50


def base_gate(children: Children, tmp: Path, rev: str, stub_port: int, flags: list[str]) -> tuple[int, tuple[str, int]]:
    """The gate of ``rev`` (its ``src`` tree from git, run with the same interpreter and libraries)."""
    src = tmp / "base"
    src.mkdir()
    archive = subprocess.run(["git", "archive", rev, "src"], cwd=ROOT, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(src)], input=archive, check=True)
    argv = ["env", f"PYTHONPATH={src / 'src'}", sys.executable, "-m", "claude_bottle", "gate",
            "--api-listen", f"{LOOPBACK}:0", "--proxy-listen", f"{LOOPBACK}:0",
            "--upstream", f"http://{LOOPBACK}:{stub_port}", "--token-file", str(tmp / "token"),
            "--allow-private", "127.0.0.0/8", "--drain-seconds", "1", *flags]
    child = children.start("base gate", argv)
    ready = child.wait_for_gate(30)
    return child.pid, (ready.api.host, ready.api.port)


def measure(paths: dict[str, tuple[str, int]], pids: dict[str, int], request: Request, n: int, block: int,
            warm: int) -> dict[str, Any]:
    """``n`` requests per path, ``block`` at a time per path in turn; seconds each, CPU ms per request."""
    conns = {k: SyncHttp(*a) for k, a in paths.items()}
    times: dict[str, list[float]] = {k: [] for k in conns}
    try:
        for k, c in conns.items():
            for _ in range(warm):
                if c.exchange(request)[0] != 200:
                    raise BenchError(f"{k}: warm-up request failed")
        cpu0 = {k: tree_cpu(pid) for k, pid in pids.items()}
        for _ in range(n // block):
            for k, c in conns.items():
                for _ in range(block):
                    t0 = time.perf_counter()
                    status, _ = c.exchange(request)
                    times[k].append(time.perf_counter() - t0)
                    if status != 200:
                        raise BenchError(f"{k}: answered {status}")
        cpu = {k: (tree_cpu(pid) - cpu0[k]) / len(times[k]) * 1000 for k, pid in pids.items()}
    finally:
        for c in conns.values():
            c.close()
    return {"median_ms": {k: percentile(v, 50) * 1000 for k, v in times.items()}, "cpu_ms_per_request": cpu}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", default="main", help="the git revision whose gate is the baseline")
    parser.add_argument("--small", type=int, default=3000, help="small requests per path (0: none)")
    parser.add_argument("--bodies", type=int, default=10, help="10 MB rounds (0: none)")
    parser.add_argument("--dlp-formats-off", action="store_true", help="both gates with every DLP format rule off")
    parser.add_argument("--no-write", dest="write", action="store_false")
    args = parser.parse_args()
    started = time.monotonic()
    doc: dict[str, Any] = {"command": command_line(), "machine": machine_info(), "base": args.base,
                           "dlp_formats_off": args.dlp_formats_off}
    flags = [a for name in BUILTIN_NAMES for a in ("--dlp-off", name)] if args.dlp_formats_off else []
    tmp = Path(tempfile.mkdtemp(prefix="cb-speed-"))
    os.chmod(tmp, 0o755)
    children = Children(tmp)
    try:
        lb = phases.start_loopback(children, tmp, tuple(flags))
        base_pid, base_api = base_gate(children, tmp, args.base, lb.stub_port, flags)
        nport = free_port()
        conf = nginx_conf(tmp, nport, lb.stub_port, lb.token)
        nginx = children.start("nginx", [shutil.which("nginx") or "/usr/sbin/nginx", "-c", str(conf),
                                         "-p", str(conf.parent), "-e", "stderr"])
        wait_port(nginx, LOOPBACK, nport, 20)
        paths = {"direct": (LOOPBACK, lb.stub_port), "base": base_api, "gate": lb.api, "nginx": (LOOPBACK, nport)}
        pids = {"base": base_pid, "gate": lb.gate.pid, "nginx": nginx.pid}
        if args.small:
            floors = {name: floor.start(children, name, lb.stub_port, tmp / "token", checks)
                      for name, checks in (("python floor", False), ("python checks", True))}
            log(f"small requests: {args.small} per path, blocks of {BLOCK}")
            small = measure({**paths, **{k: a for k, (_, a) in floors.items()}},
                            {**pids, **{k: c.pid for k, (c, _) in floors.items()}},
                            messages_request(SMALL_PAYLOAD), args.small, BLOCK, 100)
            direct = small["median_ms"]["direct"]
            small["added_ms"] = {k: v - direct for k, v in small["median_ms"].items()}
            small["added_x_nginx"] = {k: v / small["added_ms"]["nginx"] for k, v in small["added_ms"].items()}
            doc["small"] = small
            log("   " + " | ".join(f"{k} +{v:.3f} ms ({small['added_x_nginx'][k]:.2f} x nginx)"
                                   for k, v in small["added_ms"].items()))
            log("   CPU ms/request " + " ".join(f"{k} {v:.3f}" for k, v in small["cpu_ms_per_request"].items()))
        if args.bodies:
            request = messages_request({**SMALL_PAYLOAD, "messages": [{"role": "user",
                                                                       "content": "x" * (10 * MB - 200)}]})
            log(f"10 MB bodies: {args.bodies} rounds, one request per path each")
            bodies = measure(paths, pids, request, args.bodies, 1, 2)
            size = len(request[2]) / MB
            bodies["mb_s"] = {k: size / v * 1000 for k, v in bodies["median_ms"].items()}
            bodies["x_nginx"] = {k: v / bodies["mb_s"]["nginx"] for k, v in bodies["mb_s"].items()}
            doc["bodies"] = bodies
            log("   " + " | ".join(f"{k} {v:.1f} MB/s" for k, v in bodies["mb_s"].items()))
            log("   CPU ms/request " + " ".join(f"{k} {v:.1f}" for k, v in bodies["cpu_ms_per_request"].items()))
        doc["loadavg_at_end"] = os.getloadavg()[0]
    finally:
        children.stop_all()
        shutil.rmtree(tmp, ignore_errors=True)
    doc["duration_s"] = round(time.monotonic() - started, 1)
    if args.write:
        write_results("gate-speed", rounded(doc), render(doc))
    return 0


def render(doc: dict[str, Any]) -> list[str]:
    m = doc["machine"]
    lines = ["# The gate at two revisions, side by side", "",
             f"Date: {m['date']}  ", f"Command: `{doc['command']}`  ", machine_line(m),
             f"Load average (1 min): {m['loadavg_at_start']:.2f} at start, {doc['loadavg_at_end']:.2f} at end "
             "(a shared machine: compare the paths of one run, and prefer CPU per request to latency)  ",
             f"Baseline gate: `{doc['base']}`; DLP format rules {'off' if doc['dlp_formats_off'] else 'on'} in "
             "both gates. MB = 10^6 bytes.", ""]
    if "small" in doc:
        s = doc["small"]
        lines += ["Small `POST /v1/messages`, keep-alive, median:", "",
                  "| path | latency ms | added ms | added x nginx | CPU ms/request |",
                  "| --- | ---: | ---: | ---: | ---: |"]
        lines += [f"| {k} | {v:.3f} | {s['added_ms'][k]:.3f} | {s['added_x_nginx'][k]:.2f} | "
                  f"{s['cpu_ms_per_request'].get(k, float('nan')):.3f} |" for k, v in s["median_ms"].items()]
        lines.append("")
    if "bodies" in doc:
        b = doc["bodies"]
        lines += ["10 MB Messages bodies, one per path per round, median:", "",
                  "| path | ms | MB/s | x nginx | CPU ms/request |", "| --- | ---: | ---: | ---: | ---: |"]
        lines += [f"| {k} | {v:.1f} | {b['mb_s'][k]:.1f} | {b['x_nginx'][k]:.2f} | "
                  f"{b['cpu_ms_per_request'].get(k, float('nan')):.1f} |" for k, v in b["median_ms"].items()]
        lines.append("")
    return lines


if __name__ == "__main__":
    sys.exit(main())
