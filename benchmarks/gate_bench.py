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
import asyncio
import contextlib
import datetime as dt
import json
import os
import platform
import re
import secrets
import signal
import socket
import string
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results"

LOOPBACK = "127.0.0.1"  # stub and gate listeners
SINK_HOST = "127.0.0.2"  # proxy targets: the upstream's host is refused as a proxy target on every port
GLOBAL_DEADLINE_S = 15 * 60
SOCKET_TIMEOUT_S = 30.0
MB = 1_000_000  # all MB here are 10^6 bytes


class BenchError(Exception):
    """The benchmark itself could not run (as opposed to a target being missed)."""


# --------------------------------------------------------------------------------------------- deadlines


class Deadline:
    """A global deadline and, nested inside it, one per phase. ``check()`` in every loop."""

    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds
        self.phase_end = self.end
        self.phase = "setup"

    @contextlib.contextmanager
    def for_phase(self, name: str, seconds: float) -> Iterator[None]:
        self.phase, self.phase_end = name, min(self.end, time.monotonic() + seconds)
        yield  # on an exception, self.phase still names the phase that failed
        self.phase, self.phase_end = "between phases", self.end

    def left(self) -> float:
        return self.phase_end - time.monotonic()

    def check(self) -> None:
        if time.monotonic() > self.phase_end:
            which = "global" if self.phase_end >= self.end else f"phase {self.phase!r}"
            raise BenchError(f"{which} deadline passed")


# ----------------------------------------------------------------------------------------------- helpers


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0..100), linear interpolation between closest ranks."""
    if not values:
        return float("nan")
    s = sorted(values)
    k = (len(s) - 1) * q / 100
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def proc_status_kb(pid: int, field_name: str) -> int:
    """A ``kB`` field of /proc/<pid>/status, e.g. VmRSS or VmHWM."""
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith(field_name + ":"):
                return int(line.split()[1])
    raise BenchError(f"/proc/{pid}/status has no {field_name}")


def proc_cpu_s(pid: int) -> float:
    """User + system CPU seconds a process has used so far (/proc/<pid>/stat)."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def kb_to_mb(kb: int) -> float:
    return kb * 1024 / MB


def make_token() -> str:
    alphabet = string.ascii_letters
    return "sk-ant-oat01-" + "".join(secrets.choice(alphabet) for _ in range(60))


def machine_info() -> dict[str, Any]:
    """What the numbers were measured on, without the hostname."""
    cpu = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith(("model name", "hardware", "cpu model")):
                cpu = line.split(":", 1)[1].strip()
                break
    ram_gb = None
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                ram_gb = round(int(line.split()[1]) * 1024 / 1e9, 1)
    versions = {}
    for mod in ("h11",):
        with contextlib.suppress(Exception):
            from importlib.metadata import version

            versions[mod] = version(mod)
    commit = None
    src_modified = None
    with contextlib.suppress(Exception):
        env = {**os.environ, "GIT_OPTIONAL_LOCKS": "0"}  # read-only: never touch the index
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                text=True, timeout=5, env=env).stdout.strip() or None
        diff = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", "src", "pyproject.toml"], cwd=ROOT,
                              capture_output=True, timeout=5, env=env)
        src_modified = {0: False, 1: True}.get(diff.returncode)
    return {
        "cpu_model": cpu,
        "cores": os.cpu_count(),
        "cores_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "ram_gb": ram_gb,
        "kernel": f"{platform.system()} {platform.release()}",
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "libraries": versions,
        "commit": commit,
        "src_modified_since_commit": src_modified,
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "loadavg_at_start": os.getloadavg()[0],  # other work on the machine skews the numbers
    }


# ---------------------------------------------------------------------------- HTTP/1.1 client, sans I/O


class ResponseParser:
    """Incremental HTTP/1.1 response parser: Content-Length, chunked, or read-to-close bodies.

    ``feed(data)`` returns the body bytes decoded from that data. ``done`` turns true at the end of the
    message. Identical for direct and gated runs; it is deliberately small so client overhead stays low.
    """

    def __init__(self) -> None:
        self.buf = bytearray()
        self.state = "head"
        self.status = 0
        self.headers: dict[bytes, bytes] = {}
        self.remaining = 0
        self.done = False

    def feed(self, data: bytes) -> bytes:
        buf = self.buf
        buf += data
        out = bytearray()
        while True:
            st = self.state
            if st == "head":
                i = buf.find(b"\r\n\r\n")
                if i < 0:
                    break
                lines = bytes(buf[:i]).split(b"\r\n")
                del buf[: i + 4]
                self.status = int(lines[0].split(b" ", 2)[1])
                self.headers = {}
                for line in lines[1:]:
                    name, _, value = line.partition(b":")
                    self.headers[name.strip().lower()] = value.strip()
                if 100 <= self.status < 200:
                    continue
                if b"chunked" in self.headers.get(b"transfer-encoding", b"").lower():
                    self.state = "size"
                elif b"content-length" in self.headers:
                    self.remaining = int(self.headers[b"content-length"])
                    self.state = "body" if self.remaining else "done"
                elif self.status in (204, 304):
                    self.state = "done"
                else:
                    self.state = "eof"
            elif st in ("body", "data"):
                if not buf:
                    break
                n = min(len(buf), self.remaining)
                out += buf[:n]
                del buf[:n]
                self.remaining -= n
                if not self.remaining:
                    self.state = "done" if st == "body" else "crlf"
            elif st == "size":
                i = buf.find(b"\r\n")
                if i < 0:
                    break
                size = int(bytes(buf[:i]).split(b";", 1)[0], 16)
                del buf[: i + 2]
                self.remaining = size
                self.state = "data" if size else "trailer"
            elif st == "crlf":
                if len(buf) < 2:
                    break
                if buf[:2] != b"\r\n":
                    raise ValueError("bad chunk terminator")
                del buf[:2]
                self.state = "size"
            elif st == "trailer":
                i = buf.find(b"\r\n")
                if i < 0:
                    break
                empty = i == 0
                del buf[: i + 2]
                if empty:
                    self.state = "done"
            elif st == "eof":
                out += buf
                buf.clear()
                break
            else:  # done
                break
        self.done = self.state == "done"
        return bytes(out)

    def eof(self) -> None:
        if self.state == "eof":
            self.state, self.done = "done", True


class SseScanner:
    """Counts the stub's SSE events and turns each ``: sent_ns=`` comment into a delivery delay."""

    def __init__(self) -> None:
        self.pending = b""
        self.delays_ns: list[int] = []
        self.deltas = 0
        self.stopped = False

    def feed(self, payload: bytes, arrival_ns: int) -> None:
        data = self.pending + payload
        lines = data.split(b"\n")
        self.pending = lines.pop()
        for line in lines:
            if line.startswith(b": sent_ns="):
                self.delays_ns.append(arrival_ns - int(line[10:]))
            elif line == b"event: content_block_delta":
                self.deltas += 1
            elif line == b"event: message_stop":
                self.stopped = True


def messages_request(host: str, payload: dict[str, Any]) -> bytes:
    body = json.dumps(payload, separators=(",", ":")).encode()
    return (
        f"POST /v1/messages HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"anthropic-version: 2023-06-01\r\nx-api-key: sk-ant-api03-placeholder-{'0' * 24}\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body


SMALL_PAYLOAD: dict[str, Any] = {"model": "claude-bench", "max_tokens": 16,
                                 "messages": [{"role": "user", "content": "ping"}]}


def stream_payload(events: int, interval: float) -> dict[str, Any]:
    return {**SMALL_PAYLOAD, "stream": True, "stub": {"events": events, "interval": interval}}


class SyncHttp:
    """One keep-alive connection with blocking sockets: the lowest-overhead client for sequential work."""

    def __init__(self, host: str, port: int) -> None:
        self.authority = f"{host}:{port}"
        self.sock = socket.create_connection((host, port), timeout=SOCKET_TIMEOUT_S)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()

    def exchange(self, request: bytes, sse: SseScanner | None = None) -> tuple[int, int]:
        """Send one request, read the whole response. Returns (status, body bytes)."""
        sock = self.sock
        sock.sendall(request)
        parser = ResponseParser()
        size = 0
        while not parser.done:
            data = sock.recv(65536)
            arrival = time.time_ns()
            if not data:
                parser.eof()
                if not parser.done:
                    raise BenchError("connection closed in the middle of a response")
                break
            body = parser.feed(data)
            size += len(body)
            if sse is not None and body:
                sse.feed(body, arrival)
        if parser.headers.get(b"connection", b"").lower() == b"close":
            raise BenchError(f"{self.authority} closed keep-alive (status {parser.status})")
        return parser.status, size


# ------------------------------------------------------------------------------------------ subprocesses


@dataclass
class Child:
    name: str
    proc: subprocess.Popen[bytes]
    stdout: Path
    stderr: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def ensure_alive(self) -> None:
        if not self.alive():
            raise BenchError(f"{self.name} exited with status {self.proc.returncode}: {self.tail()}")

    def tail(self, n: int = 2000) -> str:
        text = ""
        for p in (self.stdout, self.stderr):
            with contextlib.suppress(OSError):
                text += p.read_text(errors="replace")
        return text[-n:].strip()

    def wait_for_line(self, pattern: re.Pattern[str], timeout: float) -> re.Match[str]:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            for p in (self.stdout, self.stderr):
                with contextlib.suppress(OSError):
                    if m := pattern.search(p.read_text(errors="replace")):
                        return m
            self.ensure_alive()
            time.sleep(0.02)
        raise BenchError(f"{self.name} did not start within {timeout:g}s: {self.tail()}")

    def stop(self) -> None:
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    self.proc.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.proc.wait(5)
        if self.proc.stdin:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()


@dataclass
class Children:
    tmp: Path
    items: list[Child] = field(default_factory=list)

    def start(self, name: str, argv: list[str], stdin_pipe: bool = False) -> Child:
        out, err = self.tmp / f"{name}.out", self.tmp / f"{name}.err"
        with open(out, "wb") as fo, open(err, "wb") as fe:
            # A session of its own: a terminal's Ctrl-C reaches this process only, which then stops the
            # children in order (the gate would otherwise start a drain of its own).
            proc = subprocess.Popen(argv, stdout=fo, stderr=fe, cwd=ROOT, start_new_session=True,
                                    stdin=subprocess.PIPE if stdin_pipe else subprocess.DEVNULL)
        child = Child(name, proc, out, err)
        self.items.append(child)
        return child

    def stop_all(self) -> None:
        for child in reversed(self.items):
            child.stop()


def command_line() -> str:
    exe = Path(sys.executable)
    with contextlib.suppress(ValueError):
        exe = exe.relative_to(ROOT)
    script = Path(sys.argv[0]).resolve()
    with contextlib.suppress(ValueError):
        script = script.relative_to(ROOT)
    return " ".join([str(exe), str(script), *sys.argv[1:]])


def claude_bottle_argv() -> list[str]:
    script = Path(sys.executable).parent / "claude-bottle"
    return [str(script)] if script.exists() else [sys.executable, "-m", "claude_bottle"]


# ------------------------------------------------------------------------------------------------ sink


def sink_main(listen: str) -> None:
    """A TCP sink (run as a subprocess): per connection, read an 8-byte length, then read and discard that
    many bytes, then answer with the 8-byte count received. Exits when its standard input closes."""
    host, port = listen.rsplit(":", 1)
    server = socket.create_server((host, int(port)), backlog=64)
    print(f"sink on {host}:{server.getsockname()[1]}", flush=True)

    def watchdog() -> None:
        sys.stdin.buffer.read()  # EOF: the parent is gone
        os._exit(0)

    def serve(conn: socket.socket) -> None:
        buf = bytearray(1 << 20)
        view = memoryview(buf)
        with conn:
            conn.settimeout(120)
            try:
                head = b""
                while len(head) < 8:
                    data = conn.recv(8 - len(head))
                    if not data:
                        return
                    head += data
                (expected,) = struct.unpack("!Q", head)
                got = 0
                while got < expected:
                    n = conn.recv_into(view, min(len(buf), expected - got))
                    if not n:
                        break
                    got += n
                conn.sendall(struct.pack("!Q", got))
                conn.recv(1)  # wait for the client to close first
            except OSError:
                pass

    threading.Thread(target=watchdog, daemon=True).start()
    while True:
        conn, _ = server.accept()
        threading.Thread(target=serve, args=(conn,), daemon=True).start()


def open_tunnel(first_hop: tuple[str, int], connect_to: str | None) -> tuple[socket.socket, int]:
    """A connection to ``first_hop`` (TCP_NODELAY), through ``CONNECT connect_to`` when given: (socket, the
    proxy's status; 200 when direct). The caller closes the socket."""
    sock = socket.create_connection(first_hop, timeout=SOCKET_TIMEOUT_S)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if connect_to is None:
        return sock, 200
    sock.sendall(f"CONNECT {connect_to} HTTP/1.1\r\nHost: {connect_to}\r\n\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head:
        data = sock.recv(4096)
        if not data or len(head) > 65536:
            return sock, 0
        head += data
    status = int(head.split(b" ", 2)[1]) if head.startswith(b"HTTP/") else 0
    if status == 200 and head.split(b"\r\n\r\n", 1)[1]:
        raise BenchError("unexpected bytes after the CONNECT answer")
    return sock, status


def push_bytes(first_hop: tuple[str, int], connect_to: str | None, total: int, chunk: int,
               payload: memoryview, deadline: Deadline) -> float:
    """Send ``total`` bytes in ``chunk``-byte writes to the sink, directly or through a CONNECT tunnel;
    return the seconds from the first byte until the sink confirmed it had every byte."""
    sock, status = open_tunnel(first_hop, connect_to)
    try:
        if status != 200:
            raise BenchError(f"CONNECT {connect_to} answered {status or 'nothing'}")
        start = time.perf_counter()
        sock.sendall(struct.pack("!Q", total))
        sent = 0
        checks = 0
        while sent < total:
            n = min(chunk, total - sent)
            sock.sendall(payload[:n])
            sent += n
            checks += 1
            if checks % 256 == 0:
                deadline.check()
        ack = b""
        while len(ack) < 8:
            data = sock.recv(8 - len(ack))
            if not data:
                raise BenchError("the sink closed before confirming receipt")
            ack += data
        elapsed = time.perf_counter() - start
        (got,) = struct.unpack("!Q", ack)
        if got != total:
            raise BenchError(f"the sink received {got} of {total} bytes")
        return elapsed
    finally:
        sock.close()


# --------------------------------------------------------------------------------------------- results


@dataclass
class Entry:
    name: str
    unit: str
    value: float | int
    baseline: str | None = None
    baseline_value: float | int | None = None
    ratio: float | None = None
    target: str | None = None
    passed: bool | None = None
    note: str = ""

    def as_json(self) -> dict[str, Any]:
        def r(x: float | int | None) -> float | int | None:
            return round(x, 4) if isinstance(x, float) else x

        return {"name": self.name, "unit": self.unit, "value": r(self.value), "baseline": self.baseline,
                "baseline_value": r(self.baseline_value), "ratio": r(self.ratio), "target": self.target,
                "pass": self.passed, "note": self.note}


def ratio(a: float, b: float) -> float | None:
    return a / b if b else None


@dataclass
class Bench:
    args: argparse.Namespace
    deadline: Deadline
    stub_port: int
    stub: Child
    gate: Child
    api: tuple[str, int]
    proxy: tuple[str, int]
    sink: tuple[str, int]
    entries: list[Entry] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)

    def log(self, msg: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)

    # -- 1. API latency ----------------------------------------------------------------------------

    def api_latency(self) -> None:
        n = self.args.requests
        block = 50
        self.log(f"1. API latency: {n} sequential small POST /v1/messages each, direct vs gate, keep-alive")
        conns = {"direct": SyncHttp(LOOPBACK, self.stub_port), "gate": SyncHttp(*self.api)}
        try:
            reqs = {k: messages_request(c.authority, SMALL_PAYLOAD) for k, c in conns.items()}
            lat: dict[str, list[float]] = {"direct": [], "gate": []}
            for k, c in conns.items():  # warm up both paths (and the gate's upstream pool)
                for _ in range(min(100, n)):
                    status, _ = c.exchange(reqs[k])
                    if status != 200:
                        raise BenchError(f"{k}: warm-up request answered {status}")
            cpu0 = {k: proc_cpu_s(c.pid) for k, c in (("gate", self.gate), ("stub", self.stub))}
            done = 0
            while done < n:  # interleave blocks so drift affects both paths alike
                self.deadline.check()
                m = min(block, n - done)
                for k, c in conns.items():
                    req = reqs[k]
                    for _ in range(m):
                        t0 = time.perf_counter_ns()
                        status, _ = c.exchange(req)
                        t1 = time.perf_counter_ns()
                        if status != 200:
                            raise BenchError(f"{k}: request answered {status}")
                        lat[k].append((t1 - t0) / 1e6)
                done += m
            cpu = {k: proc_cpu_s(c.pid) - cpu0[k] for k, c in (("gate", self.gate), ("stub", self.stub))}
        finally:
            for c in conns.values():
                c.close()
        self.details["api_cpu_ms_per_request"] = {"gate": cpu["gate"] * 1000 / n,
                                                  "stub": cpu["stub"] * 1000 / (2 * n)}
        stats = {k: {"p50": percentile(v, 50), "p99": percentile(v, 99), "mean": sum(v) / len(v),
                     "n": len(v)} for k, v in lat.items()}
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
        self.log(f"   direct p50 {d['p50']:.3f} ms p99 {d['p99']:.3f} ms | gate p50 {g['p50']:.3f} ms "
                 f"p99 {g['p99']:.3f} ms | added p50 {g['p50'] - d['p50']:.3f} ms p99 {g['p99'] - d['p99']:.3f} ms")
        self.log(f"   CPU per request: gate {cpu['gate'] * 1000 / n:.3f} ms, "
                 f"stub {cpu['stub'] * 1000 / (2 * n):.3f} ms")

    # -- 2. SSE per-event delay ------------------------------------------------------------------------

    def sse_delay(self) -> None:
        events, interval, streams = 200, 0.005, self.args.sse_streams
        self.log(f"2. SSE per-event delay: {streams} streams of {events} events {interval * 1000:g} ms apart, "
                 "each path, alternating")
        conns = {"direct": SyncHttp(LOOPBACK, self.stub_port), "gate": SyncHttp(*self.api)}
        delays: dict[str, list[float]] = {"direct": [], "gate": []}
        try:
            reqs = {k: messages_request(c.authority, stream_payload(events, interval)) for k, c in conns.items()}
            warm = {k: messages_request(c.authority, stream_payload(20, 0.001)) for k, c in conns.items()}
            for k, c in conns.items():
                c.exchange(warm[k], SseScanner())
            cpu0 = proc_cpu_s(self.gate.pid)
            for _ in range(streams):
                for k, c in conns.items():
                    self.deadline.check()
                    sse = SseScanner()
                    status, _ = c.exchange(reqs[k], sse)
                    if status != 200 or sse.deltas != events or not sse.stopped:
                        raise BenchError(f"{k}: incomplete stream (status {status}, {sse.deltas} of {events} "
                                         f"deltas, stop={sse.stopped})")
                    if len(sse.delays_ns) != events:
                        raise BenchError(f"{k}: {len(sse.delays_ns)} sent_ns stamps for {events} events")
                    delays[k] += [x / 1e6 for x in sse.delays_ns]
            self.details["sse_gate_cpu_us_per_event"] = (proc_cpu_s(self.gate.pid) - cpu0) * 1e6 / (streams * events)
        finally:
            for c in conns.values():
                c.close()
        stats = {k: {"median": percentile(v, 50), "p99": percentile(v, 99), "max": max(v), "n": len(v)}
                 for k, v in delays.items()}
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
        self.log(f"   direct median {d['median']:.3f} ms p99 {d['p99']:.3f} ms | gate median {g['median']:.3f} ms "
                 f"p99 {g['p99']:.3f} ms | added median {added:.3f} ms")

    # -- 3. concurrent streams -------------------------------------------------------------------------

    async def _one_stream(self, host: str, port: int, events: int, interval: float,
                          errors: dict[str, int], delays: list[int], timeout: float) -> None:
        writer = None
        try:
            async with asyncio.timeout(timeout):
                reader, writer = await asyncio.open_connection(host, port)
                writer.write(messages_request(f"{host}:{port}", stream_payload(events, interval)))
                await writer.drain()
                parser, sse = ResponseParser(), SseScanner()
                while not parser.done:
                    data = await reader.read(65536)
                    arrival = time.time_ns()
                    if not data:
                        parser.eof()
                        break
                    body = parser.feed(data)
                    if body:
                        sse.feed(body, arrival)
            if parser.status != 200:
                errors[f"status {parser.status}"] = errors.get(f"status {parser.status}", 0) + 1
            elif not parser.done or sse.deltas != events or not sse.stopped:
                errors["incomplete stream"] = errors.get("incomplete stream", 0) + 1
            else:
                delays.extend(sse.delays_ns)
        except Exception as exc:  # counted, not raised: this phase measures errors
            key = f"{type(exc).__name__}"
            errors[key] = errors.get(key, 0) + 1
        finally:
            if writer is not None:
                writer.close()
                with contextlib.suppress(Exception):
                    await writer.wait_closed()

    async def _streams(self, host: str, port: int, n: int, events: int, interval: float,
                       sample_pid: int | None) -> tuple[dict[str, int], list[int], int]:
        errors: dict[str, int] = {}
        delays: list[int] = []
        peak_sampled = 0
        stop = asyncio.Event()

        async def sample() -> None:
            nonlocal peak_sampled
            while not stop.is_set() and sample_pid is not None:
                with contextlib.suppress(OSError, BenchError):
                    peak_sampled = max(peak_sampled, proc_status_kb(sample_pid, "VmRSS"))
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(0.02):
                        await stop.wait()

        timeout = max(5.0, min(self.deadline.left(), 60.0 + events * interval * 4))
        sampler = asyncio.create_task(sample())
        try:
            await asyncio.gather(*(self._one_stream(host, port, events, interval, errors, delays, timeout)
                                   for _ in range(n)))
        finally:
            stop.set()
            await sampler
        return errors, delays, peak_sampled

    def concurrent_streams(self) -> None:
        n, events, interval = 64, 50, 0.010
        self.log(f"3. {n} concurrent SSE streams ({events} events, {interval * 1000:g} ms apart): direct, then gate")
        d_err, d_delays, _ = asyncio.run(self._streams(LOOPBACK, self.stub_port, n, events, interval, None))
        self.gate.ensure_alive()
        rss_before = proc_status_kb(self.gate.pid, "VmRSS")
        hwm_before = proc_status_kb(self.gate.pid, "VmHWM")
        cpu0, t0 = proc_cpu_s(self.gate.pid), time.monotonic()
        g_err, g_delays, sampled = asyncio.run(self._streams(*self.api, n, events, interval, self.gate.pid))
        gate_cpu = (proc_cpu_s(self.gate.pid) - cpu0) / (time.monotonic() - t0)
        self.gate.ensure_alive()
        hwm = proc_status_kb(self.gate.pid, "VmHWM")
        rss_after = proc_status_kb(self.gate.pid, "VmRSS")
        g_total = sum(g_err.values())
        d_total = sum(d_err.values())

        def ms(v: list[int], q: float) -> float:
            return percentile([x / 1e6 for x in v], q)

        self.details["streams64"] = {
            "direct_errors": d_err, "gate_errors": g_err,
            "gate_rss_before_mb": kb_to_mb(rss_before), "gate_vmhwm_before_mb": kb_to_mb(hwm_before),
            "gate_vmhwm_after_mb": kb_to_mb(hwm), "gate_rss_after_mb": kb_to_mb(rss_after),
            "gate_rss_sampled_peak_mb": kb_to_mb(sampled),
            "gate_cpu_utilisation": gate_cpu,
            "event_delay_ms": {"direct": {"median": ms(d_delays, 50), "p99": ms(d_delays, 99), "n": len(d_delays)},
                               "gate": {"median": ms(g_delays, 50), "p99": ms(g_delays, 99), "n": len(g_delays)}},
        }
        self.entries.append(Entry("streams64_errors", "count", g_total, "direct", d_total, None, "== 0",
                                  g_total == 0, f"{n} concurrent streams x {events} events; gate errors: "
                                  f"{g_err or 'none'}; direct errors: {d_err or 'none'}"))
        peak = kb_to_mb(hwm)
        self.entries.append(Entry("streams64_gate_peak_rss", "MB", peak, "gate VmRSS before", kb_to_mb(rss_before),
                                  ratio(peak, kb_to_mb(rss_before)), "<= 80 MB", peak <= 80.0,
                                  "gate VmHWM (lifetime peak) after the 64 streams; MB = 10^6 bytes"))
        self.entries.append(Entry("streams64_event_delay_median", "ms", ms(g_delays, 50), "direct",
                                  ms(d_delays, 50), ratio(ms(g_delays, 50), ms(d_delays, 50)),
                                  note="per-event delay with 64 streams at once (client in one event loop)"))
        self.entries.append(Entry("streams64_event_delay_p99", "ms", ms(g_delays, 99), "direct",
                                  ms(d_delays, 99), ratio(ms(g_delays, 99), ms(d_delays, 99))))
        self.log(f"   errors gate {g_total} {g_err or ''} direct {d_total} {d_err or ''} | gate RSS before "
                 f"{kb_to_mb(rss_before):.1f} MB, VmHWM {peak:.1f} MB | event delay median direct "
                 f"{ms(d_delays, 50):.3f} ms gate {ms(g_delays, 50):.3f} ms")

    # -- 4. tunnel throughput ------------------------------------------------------------------------

    def tunnel_throughput(self) -> None:
        total, chunk, reps = self.args.tunnel_bytes, 256 * 1024, self.args.tunnel_reps
        self.log(f"4. CONNECT tunnel throughput: {total / 2**20:.0f} MiB in {chunk // 1024} KiB writes, "
                 f"{reps} run(s) per path, alternating")
        payload = memoryview(os.urandom(chunk))
        target = f"{self.sink[0]}:{self.sink[1]}"
        paths: dict[str, tuple[tuple[str, int], str | None]] = {"direct": (self.sink, None),
                                                               "gate": (self.proxy, target)}
        for first_hop, connect_to in paths.values():  # warm up
            push_bytes(first_hop, connect_to, 32 * 2**20, chunk, payload, self.deadline)
        rates: dict[str, list[float]] = {"direct": [], "gate": []}
        gate_cpu: list[float] = []  # gate CPU seconds / wall seconds, per gated run
        for _ in range(reps):
            for k, (first_hop, connect_to) in paths.items():
                self.deadline.check()
                cpu0 = proc_cpu_s(self.gate.pid)
                secs = push_bytes(first_hop, connect_to, total, chunk, payload, self.deadline)
                cpu = proc_cpu_s(self.gate.pid) - cpu0
                rates[k].append(total / MB / secs)
                if k == "gate":
                    gate_cpu.append(cpu / secs)
                self.log(f"   {k}: {total / MB / secs:.0f} MB/s ({secs:.2f} s)"
                         + (f", gate CPU {cpu / secs * 100:.0f}% of one core" if k == "gate" else ""))
        self.gate.ensure_alive()
        d, g = percentile(rates["direct"], 50), percentile(rates["gate"], 50)
        self.details["tunnel_mb_s"] = {**rates, "bytes": total, "write_size": chunk,
                                       "gate_cpu_utilisation": gate_cpu,
                                       "gate_vmhwm_after_mb": kb_to_mb(proc_status_kb(self.gate.pid, "VmHWM"))}
        self.entries.append(Entry("tunnel_throughput", "MB/s", g, "direct", d, ratio(g, d), ">= 0.5 x direct",
                                  (ratio(g, d) or 0) >= 0.5,
                                  f"median of {reps} x {total / 2**20:.0f} MiB, sink-confirmed; MB = 10^6 bytes"))
        self.log(f"   median direct {d:.0f} MB/s, gate {g:.0f} MB/s, ratio {ratio(g, d) or 0:.2f}")


# ----------------------------------------------------------------------------------------------- output


def fmt(x: Any) -> str:
    if x is None:
        return "—"
    if isinstance(x, bool):
        return "PASS" if x else "MISS"
    if isinstance(x, float):
        return f"{x:.3f}" if abs(x) < 10 else f"{x:.1f}"
    return str(x)


def rounded(x: Any) -> Any:
    if isinstance(x, float):
        return round(x, 4)
    if isinstance(x, dict):
        return {k: rounded(v) for k, v in x.items()}
    if isinstance(x, list):
        return [rounded(v) for v in x]
    return x


def write_results(doc: dict[str, Any]) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "gate.json").write_text(json.dumps(doc, indent=2) + "\n")
    m = doc["machine"]
    lines = [
        "# Gate benchmark",
        "",
        f"Date: {m['date']}  ",
        f"Command: `{doc['command']}`{' (quick)' if doc['quick'] else ''}  ",
        f"Machine: {m['cpu_model']}, {m['cores']} cores ({m['cores_usable']} usable), {m['ram_gb']} GB RAM, "
        f"{m['kernel']}, {m['python']}, h11 {m['libraries'].get('h11', '?')}, commit {m['commit'] or '?'}"
        f"{' + uncommitted changes in src' if m['src_modified_since_commit'] else ''}  ",
        f"Load average (1 min) at start: {m['loadavg_at_start']:.2f}  ",
        f"Status: {'complete' if doc['complete'] else 'INCOMPLETE: ' + str(doc.get('error'))}  ",
        f"Duration: {doc['duration_s']:.0f} s",
        "",
        "Direct = client -> stub (or sink); gate = client -> gate -> stub (or CONNECT tunnel -> sink). "
        "Ratio = gate / direct. MB = 10^6 bytes.",
        "",
        "| metric | unit | gate | baseline | baseline value | ratio | target | result | note |",
        "| --- | --- | ---: | --- | ---: | ---: | --- | --- | --- |",
    ]
    for e in doc["results"]:
        lines.append(f"| {e['name']} | {e['unit']} | {fmt(e['value'])} | {e['baseline'] or ''} | "
                     f"{fmt(e['baseline_value'])} | "
                     f"{fmt(e['ratio'])} | {e['target'] or ''} | {fmt(e['pass']) if e['target'] else ''} | "
                     f"{e['note'].replace('|', '/')} |")
    lines += ["", "Targets:", ""]
    for e in doc["results"]:
        if e["target"]:
            lines.append(f"- {'PASS' if e['pass'] else 'MISS'}: {e['name']} = {fmt(e['value'])} {e['unit']} "
                         f"(target {e['target']})")
    lines += ["", "Details (all phases, raw statistics):", "", "```json",
              json.dumps(doc["details"], indent=2), "```", ""]
    (RESULTS / "gate.md").write_text("\n".join(lines))


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
        token = tmp / "token"
        fd = os.open(token, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(make_token() + "\n")
        cb = claude_bottle_argv()
        with deadline.for_phase("setup", 60):
            stub = children.start("stub", [*cb, "stub-upstream", "--listen", f"{LOOPBACK}:0"])
            stub_port = int(stub.wait_for_line(re.compile(r"stub upstream on http://[\d.]+:(\d+)"), 20)[1])
            sink = children.start("sink", [sys.executable, str(Path(__file__).resolve()), "--_sink",
                                           f"{SINK_HOST}:0"], stdin_pipe=True)
            sink_port = int(sink.wait_for_line(re.compile(r"sink on [\d.]+:(\d+)"), 20)[1])
            gate_argv = [*cb, "gate", "--api-listen", f"{LOOPBACK}:0", "--proxy-listen", f"{LOOPBACK}:0",
                         "--upstream", f"http://{LOOPBACK}:{stub_port}", "--token-file", str(token),
                         "--allow-tcp", f"{SINK_HOST}:{sink_port}", "--allow-private", "127.0.0.0/8",
                         "--max-tunnels", "256", "--drain-seconds", "1"]
            if args.audit:
                gate_argv += ["--audit-log", str(tmp / "audit.jsonl")]
            if args.profile_gate:
                prof = Path(args.profile_gate).resolve()
                gate_argv = [sys.executable, "-m", "cProfile", "-o", str(prof), "-m", "claude_bottle",
                             *gate_argv[len(cb):]]
            gate = children.start("gate", gate_argv)
            m = gate.wait_for_line(re.compile(r"API on ([\d.]+):(\d+), proxy on ([\d.]+):(\d+)"), 30)
            api, proxy = (m[1], int(m[2])), (m[3], int(m[4]))
        print(f"stub pid {stub.pid} on :{stub_port}; gate pid {gate.pid} API {api[0]}:{api[1]} proxy "
              f"{proxy[0]}:{proxy[1]}; sink pid {sink.pid} on {SINK_HOST}:{sink_port}", flush=True)
        doc["parameters"] = {"requests": args.requests, "sse_streams": args.sse_streams,
                             "tunnel_bytes": args.tunnel_bytes, "tunnel_reps": args.tunnel_reps,
                             "gate_audit_log": bool(args.audit), "gate_profiled": bool(args.profile_gate)}
        bench = Bench(args, deadline, stub_port, stub, gate, api, proxy, (SINK_HOST, sink_port))
        phases: list[tuple[str, float, Callable[[], None]]] = [
            ("api latency", 240, bench.api_latency),
            ("sse delay", 180, bench.sse_delay),
            ("64 streams", 180, bench.concurrent_streams),
            ("tunnel", 300, bench.tunnel_throughput),
        ]
        for name, limit, phase in phases:
            if args.only and name.split()[0] not in args.only:
                continue
            with deadline.for_phase(name, limit):
                gate.ensure_alive()
                stub.ensure_alive()
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
        for child in children.items:
            text = child.tail(4000)
            if "Traceback" in text or "error" in text.lower():
                print(f"--- {child.name} output (exit {child.proc.returncode}) ---\n{text}", file=sys.stderr)
                doc.setdefault("child_output", {})[child.name] = text
        for p in tmp.iterdir():
            with contextlib.suppress(OSError):
                p.unlink()
        with contextlib.suppress(OSError):
            tmp.rmdir()
    if status == 130:
        return status
    if bench is not None:
        doc["results"] = [e.as_json() for e in bench.entries]
        doc["details"] = rounded(bench.details)
    doc["duration_s"] = round(time.monotonic() - started, 1)
    if args.write and (doc["complete"] or doc["results"]):
        write_results(doc)
        print(f"wrote {RESULTS / 'gate.json'} and {RESULTS / 'gate.md'}")
    print_verdicts(doc["results"])
    return status


def print_verdicts(results: list[dict[str, Any]]) -> None:
    """One PASS/MISS line per result that has a target."""
    print()
    for e in results:
        if e["target"]:
            print(f"{'PASS' if e['pass'] else 'MISS'}  {e['name']} = {fmt(e['value'])} {e['unit']} "
                  f"(target {e['target']}; {e['baseline']} {fmt(e['baseline_value'])})")


def main() -> int:
    if len(sys.argv) == 3 and sys.argv[1] == "--_sink":
        sink_main(sys.argv[2])
        return 0
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

    def on_term(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
