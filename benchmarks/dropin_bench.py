#!/usr/bin/env python3
"""The drop-in `claude-bottle-claude`: its overhead to Claude's first byte of output against the same Claude
Code binary run on the host, and against `claude-bottle run -p`, side by side in one run.

    .venv/bin/python benchmarks/dropin_bench.py [--reps N] [--no-write] [--render]

The bottle part's set-up (benchkit/bottle.py: the images, a throw-away agent and token, the stub Messages API
in containers), then a warm-up of each path and N rounds of them, the order rotated each round and reversed
every other (benchkit/dropin.py). Writes benchmarks/results/dropin.json and benchmarks/results/dropin.md and
prints one PASS/MISS line per target. Exit status: 0 when it ran (targets met or not), 1 when it could not, 130
on Ctrl-C. Everything it starts is removed on the way out. Needs a Docker engine. See benchmarks/README.md.
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
from pathlib import Path
from typing import Any

from benchkit import (
    RESULTS,
    BenchError,
    Deadline,
    Entry,
    command_line,
    details_block,
    interrupt_on_sigterm,
    machine_info,
    machine_line,
    print_verdicts,
    results_table,
    rounded,
    status_lines,
    target_lines,
    tool_version,
    write_results,
)
from benchkit.bottle import Bottle
from benchkit.dropin import DropIn


def write(doc: dict[str, Any]) -> None:
    setup = doc["details"].get("dropin_setup", {})
    lines = [
        "# The drop-in `claude-bottle-claude`: overhead to Claude's first byte", "",
        f"Date: {doc['machine']['date']}  ",
        f"Command: `{doc['command']}`  ",
        machine_line(doc["machine"], f"docker {doc['docker']}", f"Claude Code {setup.get('claude_version', '?')}"),
        f"Load average (1 min) at start {doc['machine']['loadavg_at_start']:.2f}, at the end "
        f"{doc.get('loadavg_at_end', float('nan')):.2f}  ",
        *status_lines(doc), "",
        "Every path runs `-p 'say hi'` against the same stub Messages API (a container of the gate image) and is "
        "timed from its start to its first byte on standard output and to its exit, with an empty standard "
        "input. claude on the host = the bottle image's own Claude Code binary, copied out of the image and run "
        "here as a process with a fresh HOME; drop-in = `claude-bottle-claude` in the workspace "
        "(`$CLAUDE_BOTTLE_AGENT`, `$CLAUDE_BOTTLE_UPSTREAM`); run -p = `claude-bottle run AGENT -p`; docker run = "
        "`docker run --rm` of the bottle image. Medians of alternating rounds, one warm-up each.", "",
        *results_table(doc["results"]),
        "", "Targets:", "", *target_lines(doc["results"]),
        "", "Details:", "", *details_block(doc["details"]),
    ]
    write_results("dropin", doc, lines)


def run(args: argparse.Namespace) -> int:
    started_at = time.monotonic()
    deadline = Deadline(args.deadline)
    tmp = Path(tempfile.mkdtemp(prefix="cb-bench-dropin-"))
    os.chmod(tmp, 0o755)
    entries: list[Entry] = []
    details: dict[str, Any] = {}
    doc: dict[str, Any] = {"benchmark": "dropin", "command": command_line(), "machine": machine_info(),
                           "docker": tool_version(["docker", "version", "-f", "{{.Server.Version}}"]),
                           "parameters": {"reps": args.reps}, "results": [], "details": {}, "complete": False}
    status = 1
    bottle = Bottle(args, deadline, tmp, entries, details)
    try:
        with deadline.for_phase("setup", 900):
            bottle.setup()
            dropin = DropIn(bottle, entries, details)
            dropin.setup()
        with deadline.for_phase("rounds", deadline.left()):
            dropin.measure(args.reps)
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
            bottle.cleanup()
        shutil.rmtree(tmp, ignore_errors=True)
    if status == 130:
        return status
    doc["results"] = [e.as_json() for e in entries]
    doc["details"] = rounded(details)
    doc["duration_s"] = round(time.monotonic() - started_at, 1)
    doc["loadavg_at_end"] = os.getloadavg()[0]  # other work on the machine (tests, builds) skews the rounds
    if args.write and doc["results"]:
        write(doc)
    print_verdicts(doc["results"])
    return status


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=11, help="rounds (each runs every path once)")
    parser.add_argument("--no-write", dest="write", action="store_false", help="do not write results files")
    parser.add_argument("--deadline", type=float, default=20 * 60, help="global deadline, seconds")
    parser.add_argument("--render", action="store_true", help="only rewrite results/dropin.md from dropin.json")
    args = parser.parse_args()
    if args.render:
        write(json.loads((RESULTS / "dropin.json").read_text()))
        return 0
    args.bottle_reps = args.reps  # Bottle's name for it
    interrupt_on_sigterm()
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
