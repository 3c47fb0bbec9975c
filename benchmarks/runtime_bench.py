#!/usr/bin/env python3
"""The bottle on runc and on gVisor (runsc), side by side: its start, and a small workload inside it.

    .venv/bin/python benchmarks/runtime_bench.py [--reps N] [--no-write]

For each runtime, alternating, N times: a bottle of the same agent is started the way `start` starts one
(networks, gate, bottle, the gate's CA in its trust store) against verify's stand-ins, timed until it runs;
then, inside it, `npm install` of a project with 40 packages from a local registry (a container on the
stand-ins' network, reached through the gate's proxy, a fresh npm cache each time), then that project's test
suite (`node --test`, 40 files that read, write and spawn). Needs runsc registered with the engine
(scripts/gvisor). The agent adds nodejs and npm to the bottle image (built on first use).

Writes benchmarks/results/runtimes.json and benchmarks/results/runtimes.md. Exit status: 0 when it ran, 1
when it could not.
"""

from __future__ import annotations

import argparse
import base64
import dataclasses
import hashlib
import io
import json
import os
import statistics
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

from benchkit import write_results

from claude_bottle.agent.schema import AgentConfig
from claude_bottle.errors import BottleError
from claude_bottle.policy.addresses import parse_network
from claude_bottle.policy.hosts import Allowlist
from claude_bottle.runtime.engines import open_engine
from claude_bottle.runtime.names import RunNames
from claude_bottle.runtime.seam import ContainerSpec
from claude_bottle.verify.standins import StandIns, bottle_on, in_bottle, scratch_workspace, stand_ins

REGISTRY = "npm-registry"  # not verify's "registry" (its read-only HTTPS stand-in on the same network)
PORT = 8000
PACKAGES = 40
TESTS = 40
RUNTIMES = ("runc", "runsc")


def _tarball(name: str, files: dict[str, str]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for path, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(f"package/{path}")
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def registry_files() -> dict[str, bytes]:
    """A static npm registry: packuments at /<name> and tarballs at /<name>/-/<name>-1.0.0.tgz. Package i
    depends on package i+1, so the tree is a chain npm resolves one level at a time."""
    files: dict[str, bytes] = {}
    for i in range(PACKAGES):
        name = f"bench-pkg-{i}"
        deps = {f"bench-pkg-{i + 1}": "^1.0.0"} if i + 1 < PACKAGES else {}
        manifest = {"name": name, "version": "1.0.0", "main": "index.js", "dependencies": deps}
        body = f"module.exports = (x) => x + {i};\n" + "// padding\n" * 200
        tgz = _tarball(name, {"package.json": json.dumps(manifest), "index.js": body})
        integrity = "sha512-" + base64.b64encode(hashlib.sha512(tgz).digest()).decode()
        tarball = f"http://{REGISTRY}:{PORT}/{name}/-/{name}-1.0.0.tgz"
        files[f"{name}/-/{name}-1.0.0.tgz"] = tgz
        files[f"{name}/index.json"] = json.dumps({
            "name": name, "dist-tags": {"latest": "1.0.0"},
            "versions": {"1.0.0": {**manifest, "dist": {"tarball": tarball, "integrity": integrity,
                                                         "shasum": hashlib.sha1(tgz).hexdigest()}}},
        }).encode()
    return files


def project_script() -> str:
    """Shell that writes the project (its package.json and test files) in /tmp/project."""
    package = {"name": "bench-project", "version": "1.0.0", "private": True,
               "dependencies": {f"bench-pkg-{i}": "^1.0.0" for i in range(0, PACKAGES, 8)}}
    test = ("const test = require('node:test'); const assert = require('node:assert');\n"
            "const fs = require('node:fs'); const { execFileSync } = require('node:child_process');\n"
            "test('work', () => {\n"
            "  const dir = fs.mkdtempSync('/tmp/t-');\n"
            "  for (let i = 0; i < 200; i++) fs.writeFileSync(`${dir}/${i}.json`, JSON.stringify({i}));\n"
            "  let sum = 0; for (const f of fs.readdirSync(dir)) sum += JSON.parse(fs.readFileSync(`${dir}/${f}`)).i;\n"
            "  assert.strictEqual(sum, 19900);\n"
            "  assert.strictEqual(require('bench-pkg-0')(1), 1);\n"
            "  execFileSync('true');\n"
            "  fs.rmSync(dir, { recursive: true });\n"
            "});\n")
    lines = ["rm -rf /tmp/project && mkdir -p /tmp/project/test && cd /tmp/project",
             f"cat > package.json <<'EOF'\n{json.dumps(package)}\nEOF",
             f"cat > test/t0.test.js <<'EOF'\n{test}EOF"]
    lines += [f"cp test/t0.test.js test/t{i}.test.js" for i in range(1, TESTS)]
    return "\n".join(lines)


def registry_server() -> str:
    """A tiny registry server (python3 in the gate image): /<name> answers <name>/index.json."""
    return ("import http.server, os\n"
            "class H(http.server.SimpleHTTPRequestHandler):\n"
            "    def translate_path(self, path):\n"
            "        p = super().translate_path(path)\n"
            "        return os.path.join(p, 'index.json') if os.path.isdir(p) else p\n"
            "    def log_message(self, *a): pass\n"
            f"http.server.ThreadingHTTPServer(('0.0.0.0', {PORT}), H).serve_forever()\n")


def timed(run: Any, script: str) -> float:
    began = time.monotonic()
    code, output = in_bottle(run, script)
    if code != 0:
        raise BottleError(f"in the bottle, {script.splitlines()[0][:60]!r} failed ({code}): {output[-800:]}")
    return time.monotonic() - began


def start_registry(env: StandIns, served: Path) -> None:
    """The registry (``registry_server``) on the stand-ins' network, known there as ``REGISTRY``, serving
    ``registry_files`` written to ``served`` (mounted read-only); removed with the stand-ins (their run's)."""
    for path, data in registry_files().items():
        target = served / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    served.chmod(0o755)  # its root has no capabilities: it reads what everyone may
    outside = env.engine.network(env.outside)
    labels = outside.labels if outside is not None else {}
    name = RunNames.from_labels(labels).container(REGISTRY)
    env.engine.create_container(ContainerSpec(
        env.gate_image, name, labels, entrypoint=("/opt/gate/bin/python", "-c", registry_server()),
        working_dir="/tmp/registry", network=env.outside, aliases=(REGISTRY,), user="0",
        binds=((str(served), "/tmp/registry", True),)))
    env.engine.start(name)


def measure(reps: int) -> dict[str, Any]:
    about = open_engine().describe()
    if "runsc" not in about.runtimes:
        raise BottleError("the engine has no runsc runtime: scripts/gvisor installs and registers it")
    agent = AgentConfig(name="bench-runtimes", extra_packages=("nodejs", "npm"),
                        allow=Allowlist.parse([f"{REGISTRY}:{PORT}"]),
                        allow_private=tuple(map(parse_network, ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"))))
    samples: dict[str, dict[str, list[float]]] = {r: {"start": [], "npm_install": [], "test_suite": []}
                                                  for r in RUNTIMES}
    with stand_ins(agent, lambda line: print(f"  {line}", file=sys.stderr)) as env, \
            tempfile.TemporaryDirectory(prefix="claude-bottle-registry-") as served:
        start_registry(env, Path(served))
        for i in range(reps):
            for runtime in RUNTIMES:
                env.agent = dataclasses.replace(env.agent, runtime="" if runtime == "runc" else runtime)
                with tempfile.TemporaryDirectory(prefix="claude-bottle-bench-") as scratch:
                    began = time.monotonic()
                    with bottle_on(env, scratch_workspace(scratch)) as target:
                        samples[runtime]["start"].append(time.monotonic() - began)
                        run = target.run
                        timed(run, project_script())
                        samples[runtime]["npm_install"].append(timed(
                            run, f"cd /tmp/project && npm install --registry http://{REGISTRY}:{PORT}/ "
                                 f"--cache /tmp/npm-cache-{i} --no-audit --no-fund --loglevel=error"))
                        samples[runtime]["test_suite"].append(timed(run, "cd /tmp/project && node --test test/"))
                print(f"rep {i + 1} {runtime}: " + ", ".join(f"{k} {v[-1]:.2f} s"
                                                            for k, v in samples[runtime].items()), file=sys.stderr)
    return {"engine": about.describe(), "runtimes": list(about.runtimes), "reps": reps, "cpus": os.cpu_count(),
            "load_average_1m_at_end": os.getloadavg()[0], "samples": samples,
            "median": {r: {k: statistics.median(v) for k, v in s.items()} for r, s in samples.items()}}


def write(doc: dict[str, Any]) -> Path:
    med = doc["median"]
    rows = [f"| {what} | {med['runc'][key]:.2f} s | {med['runsc'][key]:.2f} s | "
            f"{med['runsc'][key] / med['runc'][key]:.2f} |"
            for key, what in (("start", "bottle start (networks, gate, bottle running)"),
                              ("npm_install", f"npm install, {PACKAGES} packages from a local registry"),
                              ("test_suite", f"node --test, {TESTS} files"))]
    return write_results("runtimes", doc, [
        "# The bottle on runc and on gVisor", "",
        f"{doc['engine']}; runsc as scripts/gvisor registers it; median of {doc['reps']} runs each, alternating "
        f"(`benchmarks/runtime_bench.py`); {doc['cpus']} CPUs, load average {doc['load_average_1m_at_end']:.1f} "
        "at the end.", "",
        "| what | runc | runsc | runsc / runc |", "| --- | --- | --- | --- |", *rows, ""])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--no-write", dest="write", action="store_false", help="print only")
    args = parser.parse_args()
    try:
        doc = measure(args.reps)
    except BottleError as exc:
        print(f"runtime_bench: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(doc["median"], indent=2) if not args.write else write(doc).read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
