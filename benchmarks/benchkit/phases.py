"""The phases both entry points run, written once: the loopback set-up (stub, sink, gate) and the API,
SSE, concurrent-stream and tunnel phases over any set of named paths. Each phase returns its raw
statistics; the entry point turns them into result rows against its own baseline."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .client import SMALL_PAYLOAD, SseScanner, SyncHttp, messages_request, push_bytes, stream_once, stream_payload
from .core import (
    HERE,
    LOOPBACK,
    MB,
    SINK_HOST,
    BenchError,
    Child,
    Children,
    Deadline,
    claude_bottle_argv,
    kb_to_mb,
    log,
    make_token,
    percentile,
    proc_status_kb,
    tree_cpu,
    tree_kb,
)

Addr = tuple[str, int]
BLOCK = 50  # requests per path before switching paths: drift on the machine hits every path alike


# ------------------------------------------------------------------------------------------------ set-up


@dataclass
class Loopback:
    """The stub upstream, the TCP sink on 127.0.0.2 and the gate, each a subprocess of its own."""

    token: str
    stub: Child
    stub_port: int
    sink_child: Child
    sink: Addr
    gate: Child
    api: Addr
    proxy: Addr

    @property
    def sink_target(self) -> str:
        return f"{self.sink[0]}:{self.sink[1]}"


def gate_image() -> tuple[str, str]:
    """The gate image of this checkout (built now if missing, as ``claude-bottle build`` builds it) and the
    Python it runs the gate on."""
    from claude_bottle.agent.schema import AgentConfig
    from claude_bottle.errors import BottleError
    from claude_bottle.launch import build_inputs
    from claude_bottle.runtime import images
    from claude_bottle.runtime.engines import open_engine
    from claude_bottle.runtime.gate import GATE_PYTHON

    try:
        tag = images.build(open_engine(), images.gate_spec(build_inputs(AgentConfig())), log)
    except BottleError as exc:
        raise BenchError(f"the gate image: {exc} (or pass --gate-on-host)") from None
    r = subprocess.run(["docker", "run", "--rm", "--entrypoint", GATE_PYTHON, tag, "-VV"], capture_output=True,
                       text=True, timeout=120)
    if r.returncode:
        raise BenchError(f"the gate image {tag} does not run: {r.stderr.strip()[-500:]}")
    return tag, " ".join(r.stdout.split()[:2])  # "Python 3.11.2"


def start_loopback(children: Children, tmp: Path, gate_flags: tuple[str, ...] = (), profile: Path | None = None,
                   image: str | None = None) -> Loopback:
    """Start stub, sink and gate; the gate allows a plain tunnel to the sink only (``--allow-tcp``). With
    ``image`` the gate runs in the gate image, as shipped (``Children.start_in_image``); else on this Python."""
    token_value = make_token()
    token = tmp / "token"
    fd = os.open(token, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token_value + "\n")
    cb = claude_bottle_argv()
    stub = children.start("stub", [*cb, "stub-upstream", "--listen", f"{LOOPBACK}:0"])
    stub_port = int(stub.wait_for_line(re.compile(r"stub upstream on http://[\d.]+:(\d+)"), 20)[1])
    sink = children.start("sink", [sys.executable, "-m", "benchkit.client", f"{SINK_HOST}:0"], stdin_pipe=True,
                          cwd=HERE)
    sink_port = int(sink.wait_for_line(re.compile(r"sink on [\d.]+:(\d+)"), 20)[1])
    args = ["gate", "--api-listen", f"{LOOPBACK}:0", "--proxy-listen", f"{LOOPBACK}:0",
            "--upstream", f"http://{LOOPBACK}:{stub_port}", "--token-file", str(token),
            "--allow-tcp", f"{SINK_HOST}:{sink_port}", "--allow-private", "127.0.0.0/8",
            "--max-tunnels", "256", "--drain-seconds", "1", *gate_flags]
    if image is not None:
        gate = children.start_in_image("gate", image, ["-m", "claude_bottle", *args], mounts=(tmp,))
    elif profile is not None:
        gate = children.start("gate", [sys.executable, "-m", "cProfile", "-o", str(profile), "-m", "claude_bottle",
                                       *args])
    else:
        gate = children.start("gate", [*cb, *args])
    ready = gate.wait_for_gate(30)
    return Loopback(token_value, stub, stub_port, sink, (SINK_HOST, sink_port), gate,
                    (ready.api.host, ready.api.port), (ready.proxy.host, ready.proxy.port))


# ---------------------------------------------------------------------------------------------- phases


def api_latency(paths: Mapping[str, Addr], n: int, deadline: Deadline, pids: Mapping[str, int] = {}
                ) -> dict[str, dict[str, float]]:
    """``n`` sequential small non-streaming ``POST /v1/messages`` per path on one keep-alive connection
    each, paths interleaved in blocks, after a warm-up (which also fills the proxies' upstream pools).
    Per path: p50, p99, mean (ms), n, and for a process in ``pids`` its CPU ms per request
    (``cpu_ms_per_request``; a process serving several paths, like the stub, is shared among them)."""
    conns = {k: SyncHttp(*a) for k, a in paths.items()}
    lat: dict[str, list[float]] = {k: [] for k in conns}
    request = messages_request(SMALL_PAYLOAD)
    try:
        for k, c in conns.items():
            for _ in range(min(100, n)):
                if c.exchange(request)[0] != 200:
                    raise BenchError(f"{k}: warm-up request failed")
        cpu0 = {k: tree_cpu(pid) for k, pid in pids.items()}
        done = 0
        while done < n:
            deadline.check()
            m = min(BLOCK, n - done)
            for k, c in conns.items():
                for _ in range(m):
                    t0 = time.perf_counter_ns()
                    status, _ = c.exchange(request)
                    t1 = time.perf_counter_ns()
                    if status != 200:
                        raise BenchError(f"{k}: request answered {status}")
                    lat[k].append((t1 - t0) / 1e6)
            done += m
        cpu = {k: tree_cpu(pid) - cpu0[k] for k, pid in pids.items()}
    finally:
        for c in conns.values():
            c.close()
    stats: dict[str, dict[str, float]] = {
        k: {"p50": percentile(v, 50), "p99": percentile(v, 99), "mean": sum(v) / len(v), "n": len(v)}
        for k, v in lat.items()}
    for k, seconds in cpu.items():
        stats.setdefault(k, {})["cpu_ms_per_request"] = seconds * 1000 / n
    return stats


def sse_delay(paths: Mapping[str, Addr], streams: int, deadline: Deadline, events: int = 200,
              interval: float = 0.005) -> dict[str, dict[str, float]]:
    """``streams`` streams of ``events`` events per path, one stream per path in turn; each event's delay
    is its arrival minus the stub's ``sent_ns``. Per path: median, p99, max (ms), n."""
    conns = {k: SyncHttp(*a) for k, a in paths.items()}
    delays: dict[str, list[float]] = {k: [] for k in conns}
    request = messages_request(stream_payload(events, interval))
    try:
        for c in conns.values():
            c.exchange(messages_request(stream_payload(20, 0.001)), SseScanner())
        for _ in range(streams):
            for k, c in conns.items():
                deadline.check()
                sse = SseScanner()
                status, _ = c.exchange(request, sse)
                if status != 200 or sse.deltas != events or not sse.stopped or len(sse.delays_ns) != events:
                    raise BenchError(f"{k}: incomplete stream (status {status}, {sse.deltas} of {events} deltas, "
                                     f"stop={sse.stopped}, {len(sse.delays_ns)} sent_ns stamps)")
                delays[k] += [x / 1e6 for x in sse.delays_ns]
    finally:
        for c in conns.values():
            c.close()
    return {k: {"median": percentile(v, 50), "p99": percentile(v, 99), "max": max(v), "n": len(v)}
            for k, v in delays.items()}


async def _streams(host: str, port: int, n: int, events: int, interval: float, sample_pid: int | None,
                   timeout: float) -> tuple[dict[str, int], list[int], int]:
    errors: dict[str, int] = {}
    delays: list[int] = []
    peak_sampled = 0
    stop = asyncio.Event()

    async def sample() -> None:
        nonlocal peak_sampled
        while not stop.is_set() and sample_pid is not None:
            with contextlib.suppress(OSError, BenchError):
                peak_sampled = max(peak_sampled, tree_kb(sample_pid, "VmRSS"))
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(0.02):
                    await stop.wait()

    sampler = asyncio.create_task(sample())
    try:
        await asyncio.gather(*(stream_once(host, port, events, interval, errors, delays, timeout)
                               for _ in range(n)))
    finally:
        stop.set()
        await sampler
    return errors, delays, peak_sampled


def concurrent_streams(paths: Mapping[str, Addr], pids: Mapping[str, int], n: int, deadline: Deadline,
                       events: int = 50, interval: float = 0.010) -> dict[str, dict[str, Any]]:
    """``n`` SSE streams at once per path, one path after the other. An error is a non-200 status, an
    incomplete stream or an exception (a per-stream timeout included). For a path with a process in
    ``pids`` (its whole process tree): CPU seconds, VmRSS before, sampled peak VmRSS and VmHWM after."""
    out: dict[str, dict[str, Any]] = {}
    for k, (host, port) in paths.items():
        deadline.check()
        pid = pids.get(k)
        cpu0 = tree_cpu(pid) if pid else 0.0
        rss0 = tree_kb(pid, "VmRSS") if pid else 0
        t0 = time.monotonic()
        timeout = max(5.0, min(deadline.left(), 60.0 + events * interval * 4))
        errors, delays, sampled = asyncio.run(_streams(host, port, n, events, interval, pid, timeout))
        ms = [d / 1e6 for d in delays]
        rec: dict[str, Any] = {"errors": errors, "error_count": sum(errors.values()),
                               "wall_s": time.monotonic() - t0, "event_delay_median_ms": percentile(ms, 50),
                               "event_delay_p99_ms": percentile(ms, 99)}
        if pid:
            rec.update(cpu_s=tree_cpu(pid) - cpu0, rss_before_mb=kb_to_mb(rss0),
                       rss_sampled_peak_mb=kb_to_mb(sampled), vmhwm_mb=kb_to_mb(tree_kb(pid, "VmHWM")))
        out[k] = rec
    return out


def tunnel_throughput(paths: Mapping[str, tuple[Addr, str | None]], pids: Mapping[str, int], total: int,
                      reps: int, deadline: Deadline) -> dict[str, Any]:
    """``total`` bytes in 256 KiB writes through each path (first hop, CONNECT target or None when
    direct), sink-confirmed, after a 32 MiB warm-up each, paths alternating. Returns MB/s per run and per
    path, and for paths with a process in ``pids`` its CPU use per run (1.0 = one core busy)."""
    chunk = 256 * 1024
    payload = memoryview(os.urandom(chunk))
    for hop, target in paths.values():
        push_bytes(hop, target, 32 * 2**20, chunk, payload, deadline)
    rates: dict[str, list[float]] = {k: [] for k in paths}
    cpu: dict[str, list[float]] = {k: [] for k in paths if k in pids}
    for _ in range(reps):
        for k, (hop, target) in paths.items():
            deadline.check()
            pid = pids.get(k)
            c0 = tree_cpu(pid) if pid else 0.0
            secs = push_bytes(hop, target, total, chunk, payload, deadline)
            rates[k].append(total / MB / secs)
            if pid:
                cpu[k].append((tree_cpu(pid) - c0) / secs)
    return {"mb_s": rates, "median_mb_s": {k: percentile(v, 50) for k, v in rates.items()},
            "cpu_utilisation": cpu, "bytes": total, "write_size": chunk}


def gate_vmhwm_mb(gate: Child) -> float:
    return kb_to_mb(proc_status_kb(gate.pid, "VmHWM"))
