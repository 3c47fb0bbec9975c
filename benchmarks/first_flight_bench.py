#!/usr/bin/env python3
"""What the first-flight check costs per CONNECT, in one run.

    .venv/bin/python benchmarks/first_flight_bench.py [--quick]

1. Parse cost: ``read_client_hello`` + ``decide_server_name`` on the captured ClientHellos of Python, curl,
   node and git (tests/testdata/first-flight), in this process, whole and split into 1-byte TLS records.
2. Setup latency: TCP connect, CONNECT, a full TLS handshake with a local TLS server (a trustme CA), close;
   sequential, three paths interleaved in blocks: direct to the server, through a gate that checks the first
   flight (``--no-inspect``: an opaque tunnel under the TLS name check; an ``--allow`` target would be
   terminated by the gate's CA instead), and through a gate that does not (``--allow-tcp``: raw TCP, the
   same gate code with the check skipped). Added cost of the check = checked - unchecked.

The TLS server and both gates are subprocesses (the gates started as ``claude-bottle gate``); this process is
the client. Writes benchmarks/results/first-flight.json and .md. Exit status as for gate_bench.py.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import ssl
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trustme
from benchkit import (
    LOOPBACK,
    ROOT,
    BenchError,
    Children,
    claude_bottle_argv,
    command_line,
    machine_info,
    machine_line,
    make_token,
    open_tunnel,
    percentile,
    write_results,
)

from claude_bottle.gate.tls import MAX_RECORDS, read_client_hello
from claude_bottle.policy.decide import decide_server_name
from claude_bottle.policy.hosts import parse_authority

HELLOS = ROOT / "tests" / "testdata" / "first-flight"
SERVER_NAME = "localhost"  # resolved by the gate's own resolver (/etc/hosts) to 127.0.0.1
BLOCK = 50


def tls_server_main(listen_port_file: str, cert_dir: str) -> None:
    """A TLS server (run as a subprocess): completes each handshake, then waits for the client to close."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(f"{cert_dir}/server.pem")
    port_file = Path(listen_port_file)

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, ssl.SSLError):
            await reader.read()
        writer.close()

    async def main() -> None:
        server = await asyncio.start_server(serve, LOOPBACK, 0, ssl=context, backlog=512)
        port_file.write_text(str(server.sockets[0].getsockname()[1]))  # noqa: ASYNC240 - once, before serving
        async with server:
            await server.serve_forever()

    asyncio.run(main())


def parse_cost(iterations: int) -> dict[str, Any]:
    """Microseconds per hello: parse and decide, whole and in as many records as accepted (the worst case)."""
    target = parse_authority("first-flight.example:443")
    out: dict[str, Any] = {}
    for path in sorted(HELLOS.glob("*.bin")):
        whole = path.read_bytes()
        body = whole[5:]
        size = -(-len(body) // MAX_RECORDS)
        tiny = b"".join(b"\x16\x03\x01" + len(body[i : i + size]).to_bytes(2, "big") + body[i : i + size]
                        for i in range(0, len(body), size))
        row = {"bytes": len(whole)}
        for label, data in (("whole", whole), ("max_records", tiny)):
            hello = read_client_hello(data)
            if hello is None or not decide_server_name(target, hello.server_name).allow:
                raise BenchError(f"{path.name}: the captured hello did not parse")
            rounds = iterations if label == "whole" else max(1, iterations // 20)
            started = time.perf_counter()
            for _ in range(rounds):
                hello = read_client_hello(data)
                assert hello is not None
                decide_server_name(target, hello.server_name)
            row[f"{label}_us"] = round((time.perf_counter() - started) / rounds * 1e6, 2)
        out[path.stem] = row
    return out


def setup_once(first_hop: tuple[str, int], connect_to: str | None, context: ssl.SSLContext) -> float:
    started = time.perf_counter()
    sock, status = open_tunnel(first_hop, connect_to)
    try:
        if status != 200:
            raise BenchError(f"CONNECT {connect_to} answered {status}")
        with context.wrap_socket(sock, server_hostname=SERVER_NAME) as tls:
            tls.do_handshake()
            elapsed = time.perf_counter() - started  # closed without a TLS shutdown round trip
    finally:
        sock.close()
    return elapsed


def latency(paths: dict[str, tuple[tuple[str, int], str | None]], context: ssl.SSLContext, n: int,
            deadline: float) -> dict[str, dict[str, float]]:
    times: dict[str, list[float]] = {name: [] for name in paths}
    for hop, connect_to in paths.values():  # warm up each path
        for _ in range(10):
            setup_once(hop, connect_to, context)
    while min(len(v) for v in times.values()) < n:
        for name, (hop, connect_to) in paths.items():
            for _ in range(BLOCK):
                if time.monotonic() > deadline:
                    raise BenchError("deadline passed in the latency phase")
                times[name].append(setup_once(hop, connect_to, context) * 1000)
    return {name: {"n": len(v), "p50_ms": round(percentile(v, 50), 3), "p90_ms": round(percentile(v, 90), 3),
                   "p99_ms": round(percentile(v, 99), 3), "mean_ms": round(sum(v) / len(v), 3)}
            for name, v in times.items()}


def start_gate(children: Children, name: str, token: Path, policy_flag: str, server_port: int) -> tuple[str, int]:
    gate = children.start(name, [*claude_bottle_argv(), "gate", "--api-listen", f"{LOOPBACK}:0", "--proxy-listen",
                                 f"{LOOPBACK}:0", "--upstream", f"http://{LOOPBACK}:9", "--token-file", str(token),
                                 policy_flag, f"{SERVER_NAME}:{server_port}", "--allow-private", "127.0.0.0/8"])
    proxy = gate.wait_for_gate(30).proxy
    return proxy.host, proxy.port


def write(doc: dict[str, Any]) -> None:
    m, lat, cost = doc["machine"], doc["latency"], doc["parse_cost"]
    lines = [
        "# First-flight check: cost per CONNECT",
        "",
        f"Date: {m['date']}  ",
        f"Command: `{doc['command']}`  ",
        machine_line(m),
        f"Load average (1 min) at start: {m['loadavg_at_start']:.2f}",
        "",
        "## Parse and decide, per ClientHello (in process)",
        "",
        f"| client | hello bytes | whole (µs) | in {MAX_RECORDS} TLS records (µs) |",
        "| --- | ---: | ---: | ---: |",
        *(f"| {name} | {row['bytes']} | {row['whole_us']} | {row['max_records_us']} |"
          for name, row in cost.items()),
        "",
        f"## CONNECT + TLS handshake, sequential, {lat['direct']['n']} per path, interleaved in blocks of {BLOCK}",
        "",
        "| path | p50 (ms) | p90 (ms) | p99 (ms) | mean (ms) |",
        "| --- | ---: | ---: | ---: | ---: |",
        *(f"| {name} | {r['p50_ms']} | {r['p90_ms']} | {r['p99_ms']} | {r['mean_ms']} |" for name, r in lat.items()),
        "",
        f"Added by the first-flight check (checked - unchecked): p50 {doc['added_p50_ms']:+.3f} ms, "
        f"mean {doc['added_mean_ms']:+.3f} ms per CONNECT.",
        "",
    ]
    write_results("first-flight", doc, lines)


def run(args: argparse.Namespace) -> int:
    tmp = Path(tempfile.mkdtemp(prefix="first-flight-bench-"))
    children = Children(tmp)
    deadline = time.monotonic() + args.deadline
    try:
        ca = trustme.CA()
        ca.issue_cert(SERVER_NAME).private_key_and_cert_chain_pem.write_to_path(tmp / "server.pem")
        context = ssl.create_default_context()
        ca.configure_trust(context)
        token = tmp / "token"
        token.write_text(make_token() + "\n")
        token.chmod(0o600)
        port_file = tmp / "tls-port"
        children.start("tls-server", [sys.executable, str(Path(__file__).resolve()), "--_tls-server",
                                      str(port_file), str(tmp)])
        for _ in range(200):
            if port_file.exists() and port_file.read_text():
                break
            time.sleep(0.05)
        else:
            raise BenchError(f"the TLS server did not start: {children.items[0].tail()}")
        server_port = int(port_file.read_text())
        checked = start_gate(children, "gate-checked", token, "--no-inspect", server_port)
        unchecked = start_gate(children, "gate-unchecked", token, "--allow-tcp", server_port)
        target = f"{SERVER_NAME}:{server_port}"
        print(f"1. parse cost ({args.parse_iterations} rounds per hello)", flush=True)
        cost = parse_cost(args.parse_iterations)
        print(f"2. CONNECT + TLS handshake, {args.setups} per path", flush=True)
        lat = latency({"direct": ((LOOPBACK, server_port), None), "gate, first flight checked": (checked, target),
                       "gate, raw TCP (no check)": (unchecked, target)}, context, args.setups, deadline)
        doc = {"benchmark": "first-flight", "command": command_line(), "machine": machine_info(),
               "parse_cost": cost, "latency": lat,
               "added_p50_ms": lat["gate, first flight checked"]["p50_ms"] - lat["gate, raw TCP (no check)"]["p50_ms"],
               "added_mean_ms": lat["gate, first flight checked"]["mean_ms"]
               - lat["gate, raw TCP (no check)"]["mean_ms"]}
        if args.write:
            write(doc)
        print(json.dumps({"parse_cost": cost, "latency": lat, "added_p50_ms": round(doc["added_p50_ms"], 3)},
                         indent=2))
        return 0
    except BenchError as exc:
        print(f"first-flight benchmark failed: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    finally:
        children.stop_all()


def main() -> int:
    if len(sys.argv) == 4 and sys.argv[1] == "--_tls-server":
        tls_server_main(sys.argv[2], sys.argv[3])
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds (about 15 seconds)")
    parser.add_argument("--no-write", dest="write", action="store_false", help="do not write results files")
    parser.add_argument("--deadline", type=float, default=600, help="global deadline, seconds")
    args = parser.parse_args()
    args.setups = 200 if args.quick else 1000
    args.parse_iterations = 2000 if args.quick else 20000
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
