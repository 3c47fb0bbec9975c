#!/usr/bin/env python3
"""What the API route's body policy costs per request, on loopback, in one run.

    .venv/bin/python benchmarks/api_policy_bench.py [--quick] [--no-write]

1. Parse and decide (in this process): ``MessagesPolicy().decide(body)`` on request bodies captured from Claude
   Code 2.1.126 (tests/testdata), from a 1 KB WebSearch call to a long conversation, with ``json.loads`` of the
   same bytes for comparison.
2. End to end: sequential ``POST /v1/messages`` with those bodies, keep-alive, to the stub directly, through
   the gate (the body read whole and judged), and through the same gate code with the policy off (the body
   streamed, as before the policy), in interleaved blocks. Added cost = judged p50 - unjudged p50.

The stub, the gate and the gate without the policy each run as their own subprocess; the clients, the
subprocess handling and the machine block are benchkit's. Writes benchmarks/results/api-policy.json and
api-policy.md. Exit status: 0 when it ran, 1 when it could not, 130 on Ctrl-C.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchkit import (
    LOOPBACK,
    ROOT,
    BenchError,
    Children,
    SyncHttp,
    claude_bottle_argv,
    command_line,
    machine_info,
    machine_line,
    make_token,
    percentile,
    post,
    rounded,
    write_results,
)

from claude_bottle.policy.messages import MessagesPolicy

TESTDATA = ROOT / "tests" / "testdata"


def bodies() -> dict[str, bytes]:
    """Claude Code's own requests, and a long session made of its turn with the conversation repeated."""
    search = (TESTDATA / "claude-code-web-search.json").read_bytes()
    turn = json.loads((TESTDATA / "claude-code-messages.json").read_bytes())
    first = turn["messages"][0]
    found = {"web search call (1 KB)": search, "ordinary turn (100 KB)": json.dumps(turn).encode()}
    answer = {"role": "assistant", "content": [{"type": "text", "text": "Done: " + "the file reads as planned. " * 20}]}
    per_round = len(json.dumps([first, answer]))
    for label, size in (("long session (1 MB)", 1_000_000), ("long session (10 MB)", 10_000_000)):
        history = [first, answer] * ((size - len(found["ordinary turn (100 KB)"])) // per_round)
        found[label] = json.dumps({**turn, "messages": [*history, first]}).encode()
    return found


def time_call(call: Any, reps: int) -> float:
    """Median microseconds of ``call()`` over ``reps`` runs."""
    times = []
    for _ in range(reps):
        t0 = time.perf_counter_ns()
        call()
        times.append((time.perf_counter_ns() - t0) / 1e3)
    return statistics.median(times)


def decide_costs(samples: dict[str, bytes], quick: bool) -> list[dict[str, Any]]:
    policy = MessagesPolicy()
    rows = []
    for label, body in samples.items():
        reps = max(5, min(2000, int(2e8 // (len(body) * (10 if quick else 1)))))
        if not policy.decide(body).allow:
            raise BenchError(f"{label}: refused by the policy")
        rows.append({"body": label, "bytes": len(body), "reps": reps,
                     "decide_us": time_call(lambda b=body: policy.decide(b), reps),
                     "json_loads_us": time_call(lambda b=body: json.loads(b), reps)})
        print(f"   {label}: decide {rows[-1]['decide_us']:.1f} us, json.loads {rows[-1]['json_loads_us']:.1f} us",
              flush=True)
    return rows


def end_to_end(paths: dict[str, tuple[str, int]], samples: dict[str, bytes], n: int) -> list[dict[str, Any]]:
    rows = []
    for label, body in samples.items():
        count = max(20, n * 100_000 // max(len(body), 100_000))
        conns = {k: SyncHttp(*a) for k, a in paths.items()}
        lat: dict[str, list[float]] = {k: [] for k in paths}
        try:
            request = post("/v1/messages?beta=true", body)
            for k, c in conns.items():  # warm-up, and every path must answer 200
                for _ in range(min(10, count)):
                    if c.exchange(request)[0] != 200:
                        raise BenchError(f"{k}: {label} not answered 200")
            done, block = 0, 25
            while done < count:  # interleaved blocks, so drift affects every path alike
                m = min(block, count - done)
                for k, c in conns.items():
                    # A block of 10 MB bodies through the gate can outlast the gate's keep-alive idle time
                    # (30 s on a loaded host), and the other paths' connections wait idle meanwhile.
                    c.reopen_if_closed()
                    for _ in range(m):
                        t0 = time.perf_counter_ns()
                        c.exchange(request)
                        lat[k].append((time.perf_counter_ns() - t0) / 1e6)
                done += m
        finally:
            for c in conns.values():
                c.close()
        row: dict[str, Any] = {"body": label, "bytes": len(body), "requests_per_path": count}
        for k, values in lat.items():
            row[k] = {"p50_ms": percentile(values, 50), "p99_ms": percentile(values, 99)}
        row["policy_added_p50_ms"] = row["judged"]["p50_ms"] - row["unjudged"]["p50_ms"]
        row["gate_added_p50_ms"] = row["judged"]["p50_ms"] - row["direct"]["p50_ms"]
        rows.append(row)
        print(f"   {label}: direct {row['direct']['p50_ms']:.3f} ms, unjudged {row['unjudged']['p50_ms']:.3f} ms, "
              f"judged {row['judged']['p50_ms']:.3f} ms (p50): the policy adds {row['policy_added_p50_ms']:.3f} ms",
              flush=True)
    return rows


def unjudged_gate_main(upstream: str, token_file: str) -> None:
    """The gate with the body policy off (run as a subprocess): bodies stream as they did before the policy."""
    from claude_bottle.credentials import read_token_file
    from claude_bottle.gate import settings as gc
    from claude_bottle.gate.audit import AuditLog
    from claude_bottle.gate.server import serve

    config = gc.GateSettings(api_listen=gc.Endpoint(LOOPBACK, 0), proxy_listen=gc.Endpoint(LOOPBACK, 0),
                           credential=read_token_file(token_file), upstream=gc.parse_upstream(upstream),
                           messages_policy=MessagesPolicy(paths=frozenset()))
    serve(config, AuditLog(None))


def write(doc: dict[str, Any]) -> None:
    m = doc["machine"]
    lines = [
        "# API body policy benchmark", "",
        f"Date: {m['date']}  ",
        f"Command: `{doc['command']}`  ",
        machine_line(m),
        f"Load average (1 min) at start: {m['loadavg_at_start']:.2f}", "",
        "## Parse and decide, in process", "",
        "| body | bytes | `decide()` median µs | `json.loads` median µs | runs |",
        "| --- | ---: | ---: | ---: | ---: |",
        *(f"| {r['body']} | {r['bytes']} | {r['decide_us']:.1f} | {r['json_loads_us']:.1f} | {r['reps']} |"
          for r in doc["decide"]),
        "", "## End to end, sequential `POST /v1/messages`, keep-alive", "",
        "Direct = client -> stub; unjudged = through the gate with the body policy off (streamed); judged = "
        "through the gate as shipped (read whole, parsed, decided, then sent).", "",
        "| body | requests per path | direct p50 ms | unjudged p50 ms | judged p50 ms | judged p99 ms | "
        "policy adds (p50) ms |", "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
        *(f"| {r['body']} | {r['requests_per_path']} | {r['direct']['p50_ms']:.3f} | {r['unjudged']['p50_ms']:.3f} | "
          f"{r['judged']['p50_ms']:.3f} | {r['judged']['p99_ms']:.3f} | {r['policy_added_p50_ms']:.3f} |"
          for r in doc["end_to_end"]),
        "",
    ]
    write_results("api-policy", doc, lines)


def run(args: argparse.Namespace) -> int:
    tmp = Path(tempfile.mkdtemp(prefix="api-policy-bench-"))
    children = Children(tmp)
    doc: dict[str, Any] = {"benchmark": "api-policy", "quick": args.quick, "command": command_line(),
                           "machine": machine_info()}
    try:
        samples = bodies()
        print("1. parse and decide, in process", flush=True)
        doc["decide"] = decide_costs(samples, args.quick)
        token = tmp / "token"
        fd = os.open(token, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(make_token() + "\n")
        cb = claude_bottle_argv()
        stub = children.start("stub", [*cb, "stub-upstream", "--listen", f"{LOOPBACK}:0"])
        stub_port = int(stub.wait_for_line(re.compile(r"on http://[\d.]+:(\d+)"), 20)[1])
        upstream = f"http://{LOOPBACK}:{stub_port}"
        judged = children.start("gate", [*cb, "gate", "--api-listen", f"{LOOPBACK}:0", "--proxy-listen",
                                         f"{LOOPBACK}:0", "--upstream", upstream, "--token-file", str(token)])
        unjudged = children.start("unjudged-gate", [sys.executable, str(Path(__file__).resolve()), "--_unjudged",
                                                    upstream, str(token)])
        paths = {"direct": (LOOPBACK, stub_port)}
        for name, child in (("unjudged", unjudged), ("judged", judged)):
            ready = child.wait_for_gate(30)
            paths[name] = (ready.api.host, ready.api.port)
        print("2. end to end: direct, through the gate without the policy, through the gate", flush=True)
        doc["end_to_end"] = end_to_end(paths, samples, 40 if args.quick else 1000)
        doc["machine"]["libraries"] = machine_info()["libraries"]
    except BenchError as exc:
        print(f"benchmark failed: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    finally:
        children.stop_all()
        for p in tmp.iterdir():
            with contextlib.suppress(OSError):
                p.unlink()
        with contextlib.suppress(OSError):
            tmp.rmdir()
    doc = rounded(doc)
    if args.write:
        write(doc)
    return 0


def main() -> int:
    if len(sys.argv) == 4 and sys.argv[1] == "--_unjudged":
        unjudged_gate_main(sys.argv[2], sys.argv[3])
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer runs (about 20 seconds)")
    parser.add_argument("--no-write", dest="write", action="store_false", help="do not write results files")
    return run(parser.parse_args())


if __name__ == "__main__":
    sys.exit(main())
