"""Ask mode's costs, on loopback: from the host's answer to the held request's first byte upstream, and the
API route's latency with 16 questions pending against none.

A gate in ask mode runs in this process (the tests' way: ``GateOptions`` → ``Gate``) in front of the stub
Messages API on 127.0.0.1; held requests go to a sink on 127.0.0.2 that notes when each request's first byte
arrives. The approver answers at once: the clock starts as the ``decide`` line is written to the control
socket. Rounds alternate so both API phases see the same machine load.

    PYTHONPATH=src .venv/bin/python benchmarks/ask_bench.py [--rounds N] [--requests N] [--out PATH.json]

Writes the numbers as JSON (``--out``) and prints a Markdown table; the machine is noted in both.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import uvloop

from claude_bottle.credentials import Credential
from claude_bottle.gate import settings as gs
from claude_bottle.gate.audit import AuditLog
from claude_bottle.gate.options import GateOptions
from claude_bottle.gate.resolver import StaticResolver
from claude_bottle.gate.server import Gate
from claude_bottle.stub import StubUpstream

TOKEN = "sk-ant-oat01-" + "b" * 80 + "AA"
PENDING = 16


class Sink:
    """A TCP server on 127.0.0.2 noting when each connection's first byte arrives, then answering 204."""

    def __init__(self) -> None:
        self.first_bytes: asyncio.Queue[float] = asyncio.Queue()
        self.port = 0

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError):
            await reader.read(1)
            self.first_bytes.put_nowait(time.perf_counter())
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n")
            await writer.drain()
        writer.close()


@contextlib.asynccontextmanager
async def ask_gate(stub: StubUpstream, socket_path: Path, hosts: list[str]) -> AsyncIterator[Gate]:
    options = GateOptions(
        api_listen=gs.parse_listen("127.0.0.1:0", "--api-listen"),
        proxy_listen=gs.parse_listen("127.0.0.1:0", "--proxy-listen"),
        credential=Credential.parse(TOKEN, "benchmark token"), upstream=gs.parse_upstream(stub.url),
        allow_private=gs.parse_networks(("127.0.0.0/8",)), ask=True, control_socket=socket_path,
        max_tunnels=1024, max_connections=4096,
    )
    resolver = StaticResolver({host: [ipaddress.ip_address("127.0.0.2")] for host in hosts})
    async with Gate(options.settings(), AuditLog(None), resolver) as gate:
        yield gate


async def control(socket_path: Path, request: dict[str, str]) -> dict[str, Any]:
    reader, writer = await asyncio.open_unix_connection(str(socket_path))
    writer.write(json.dumps(request).encode() + b"\n")
    reply = json.loads(await reader.readline())
    writer.close()
    return dict(reply)


async def held(gate: Gate, host: str, port: int) -> None:
    """One plain-HTTP request through the proxy to ``host``; waits for its whole answer."""
    reader, writer = await asyncio.open_connection(gate.proxy_address.host, gate.proxy_address.port)
    writer.write(f"GET http://{host}:{port}/ HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: close\r\n\r\n".encode())
    await reader.read()
    writer.close()


async def pending_ids(socket_path: Path, count: int) -> list[str]:
    for _ in range(2000):  # 2000 x 5 ms at most
        reply = await control(socket_path, {"op": "pending"})
        if len(reply["pending"]) >= count:
            return [question["id"] for question in reply["pending"]]
        await asyncio.sleep(0.005)
    raise RuntimeError(f"{count} questions never came pending")


async def decide_to_first_byte(gate: Gate, socket_path: Path, sink: Sink, host: str) -> float:
    """Milliseconds from writing the decide line to the held request's first byte at the sink."""
    request = asyncio.ensure_future(held(gate, host, sink.port))
    (question,) = await pending_ids(socket_path, 1)
    reader, writer = await asyncio.open_unix_connection(str(socket_path))
    started = time.perf_counter()
    writer.write(json.dumps({"op": "decide", "id": question, "answer": "allow-once", "by": "benchmark"}).encode()
                 + b"\n")
    arrived = await sink.first_bytes.get()
    await reader.readline()
    writer.close()
    await request
    return (arrived - started) * 1000


async def api_latencies(gate: Gate, count: int) -> list[float]:
    """Milliseconds per sequential GET /v1/models on one kept-alive connection to the API listener."""
    reader, writer = await asyncio.open_connection(gate.api_address.host, gate.api_address.port)
    times = []
    for _ in range(count):
        started = time.perf_counter()
        writer.write(b"GET /v1/models HTTP/1.1\r\nHost: gate\r\n\r\n")
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length"))
        await reader.readexactly(length)
        times.append((time.perf_counter() - started) * 1000)
    writer.close()
    return times


def summary(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {"median": round(statistics.median(ordered), 3), "p90": round(ordered[int(len(ordered) * 0.9)], 3),
            "n": len(ordered)}


async def main(rounds: int, requests: int) -> dict[str, Any]:
    hosts = [f"q{n}.ask.bench" for n in range(rounds + PENDING * rounds + 1)]
    sink = Sink()
    server = await asyncio.start_server(sink.serve, "127.0.0.2", 0)
    sink.port = server.sockets[0].getsockname()[1]
    decide_ms: list[float] = []
    api_none: list[float] = []
    api_pending: list[float] = []
    with tempfile.TemporaryDirectory() as folder:
        socket_path = Path(folder) / "control.sock"
        async with StubUpstream() as stub, ask_gate(stub, socket_path, hosts) as gate:
            names = iter(hosts)
            await api_latencies(gate, 50)  # warm up the upstream connection
            for _ in range(rounds):
                decide_ms.append(await decide_to_first_byte(gate, socket_path, sink, next(names)))
                api_none += await api_latencies(gate, requests)
                waiting = [asyncio.ensure_future(held(gate, next(names), sink.port)) for _ in range(PENDING)]
                ids = await pending_ids(socket_path, PENDING)
                api_pending += await api_latencies(gate, requests)
                for question in ids:
                    await control(socket_path, {"op": "decide", "id": question, "answer": "deny-once",
                                                "by": "benchmark"})
                await asyncio.gather(*waiting)
    server.close()
    return {
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
                    "load_average": os.getloadavg()},
        "decide_to_first_byte_ms": summary(decide_ms),
        "api_latency_ms_no_pending": summary(api_none),
        "api_latency_ms_16_pending": summary(api_pending),
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--requests", type=int, default=100, help="API requests per phase and round")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    results = uvloop.run(main(args.rounds, args.requests))
    if args.out is not None:
        args.out.write_text(json.dumps(results, indent=2) + "\n")
    print("| measure | median | p90 | n |\n| --- | --- | --- | --- |")
    for name in ("decide_to_first_byte_ms", "api_latency_ms_no_pending", "api_latency_ms_16_pending"):
        print(f"| {name} | {results[name]['median']} | {results[name]['p90']} | {results[name]['n']} |")
    print(f"machine: {results['machine']}", file=sys.stderr)
