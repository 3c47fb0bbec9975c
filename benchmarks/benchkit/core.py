"""What every benchmark here shares: deadlines, percentiles, /proc readings, the machine block, the
subprocesses, the result rows and their formatting."""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import platform
import re
import secrets
import signal
import socket
import statistics
import string
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from claude_bottle.gate.ready import Ready

HERE = Path(__file__).resolve().parent.parent  # benchmarks/
ROOT = HERE.parent
RESULTS = HERE / "results"

LOOPBACK = "127.0.0.1"  # stub and gate listeners
SINK_HOST = "127.0.0.2"  # proxy targets: the upstream's host is refused as a proxy target on every port
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


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (1..99 or 50), linear interpolation between closest ranks."""
    if not values:
        return float("nan")
    if len(values) == 1:
        return float(values[0])
    return statistics.quantiles(values, n=100, method="inclusive")[round(q) - 1]


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


def tree_pids(pid: int) -> list[int]:
    """pid and all its descendants (nginx master + workers, squid + helpers)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        with contextlib.suppress(OSError):
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo += [int(x) for x in f.read().split()]
    return out


def tree_kb(pid: int, field_name: str) -> int:
    total = 0
    for p in tree_pids(pid):
        with contextlib.suppress(OSError, BenchError):
            total += proc_status_kb(p, field_name)
    return total


def tree_cpu(pid: int) -> float:
    total = 0.0
    for p in tree_pids(pid):
        with contextlib.suppress(OSError):
            total += proc_cpu_s(p)
    return total

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
    for mod in ("h11", "httptools"):
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


# ------------------------------------------------------------------------------------- ports and tools


def free_port(host: str = LOOPBACK) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def wait_port(child: Child, host: str, port: int, timeout: float) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        child.ensure_alive()
        with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=1):
            return
        time.sleep(0.05)
    raise BenchError(f"{child.name} did not listen on {host}:{port} within {timeout:g}s: {child.tail()}")


def tool_version(argv: list[str]) -> str | None:
    with contextlib.suppress(Exception):
        r = subprocess.run(argv, capture_output=True, text=True, timeout=10)
        text = (r.stdout + r.stderr).strip().splitlines()
        return text[0] if text else None
    return None


# ------------------------------------------------------------------------------------------ subprocesses


def interrupt_on_sigterm() -> None:
    """SIGTERM (a CI job's cancel, ``timeout``) ends the benchmark as Ctrl-C does: its ``finally`` stops every
    child it started and writes what was measured."""

    def on_term(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)


@dataclass
class Child:
    name: str
    proc: subprocess.Popen[bytes]
    stdout: Path
    stderr: Path
    container: str | None = None  # a `docker run` in the foreground: the container it runs
    _container_pid: int | None = field(default=None, repr=False)

    @property
    def pid(self) -> int:
        """The process measured: for a container, its first process as the host sees it (not the CLI's)."""
        if self.container is None:
            return self.proc.pid
        if self._container_pid is None:
            r = subprocess.run(["docker", "inspect", "-f", "{{.State.Pid}}", self.container], capture_output=True,
                               text=True, timeout=30)
            if r.returncode or not r.stdout.strip().isdigit() or r.stdout.strip() == "0":
                raise BenchError(f"{self.name}: no process for container {self.container}: {r.stderr.strip()}")
            self._container_pid = int(r.stdout)
        return self._container_pid

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

    def wait_for_gate(self, timeout: float) -> Ready:
        """What a gate announced once it listens, read by the package's one parser (gate/ready.py)."""
        from claude_bottle.gate.ready import parse_ready

        end = time.monotonic() + timeout
        while time.monotonic() < end:
            with contextlib.suppress(OSError):
                if (ready := parse_ready(self.stderr.read_text(errors="replace"))) is not None:
                    return ready
            self.ensure_alive()
            time.sleep(0.02)
        raise BenchError(f"{self.name} did not start within {timeout:g}s: {self.tail()}")

    def stop(self) -> None:
        if self.container is not None:  # the CLI passes its signals on, but a killed CLI leaves the container
            subprocess.run(["docker", "rm", "-f", self.container], capture_output=True, timeout=60)
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

    def start(self, name: str, argv: list[str], stdin_pipe: bool = False, cwd: Path = ROOT) -> Child:
        out, err = self.tmp / f"{name}.out", self.tmp / f"{name}.err"
        with open(out, "wb") as fo, open(err, "wb") as fe:
            # A session of its own: a terminal's Ctrl-C reaches this process only, which then stops the
            # children in order (the gate would otherwise start a drain of its own).
            proc = subprocess.Popen(argv, stdout=fo, stderr=fe, cwd=cwd, start_new_session=True,
                                    stdin=subprocess.PIPE if stdin_pipe else subprocess.DEVNULL)
        child = Child(name, proc, out, err)
        self.items.append(child)
        return child

    def start_in_image(self, name: str, image: str, argv: list[str], mounts: tuple[Path, ...] = ()) -> Child:
        """``python argv`` in ``image`` (the gate's), confined as a run confines its gate (runtime/run.py) but on
        the host's network, as this user (to read the benchmark's files), each of ``mounts`` at its own path."""
        from claude_bottle.runtime.docker_values import CAP_DROP, SECURITY_OPT
        from claude_bottle.runtime.gate import GATE_MEMORY, GATE_PIDS_LIMIT, GATE_PYTHON, GATE_TMPFS

        container = f"claude-bottle-bench-{name.replace(' ', '-')}-{os.getpid()}"
        confined = ["--read-only", *(f"--tmpfs={path}:{options}" for path, options in GATE_TMPFS.items()),
                    f"--pids-limit={GATE_PIDS_LIMIT}", f"--memory={GATE_MEMORY}",
                    *(f"--cap-drop={cap}" for cap in CAP_DROP), *(f"--security-opt={opt}" for opt in SECURITY_OPT)]
        docker = ["docker", "run", "--rm", "--name", container, "--network", "host",
                  f"--user={os.getuid()}:{os.getgid()}", *confined,
                  *(f"--volume={path}:{path}:ro" for path in mounts), "--entrypoint", GATE_PYTHON, image]
        # A container of that name is left only by an earlier benchmark killed outright that had this pid.
        subprocess.run(["docker", "rm", "-f", container], capture_output=True, timeout=60)
        child = self.start(name, [*docker, *argv])
        child.container = container
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
    return [str(script)] if script.exists() else [sys.executable, "-P", "-m", "claude_bottle"]


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


def print_verdicts(results: list[dict[str, Any]]) -> None:
    """One PASS/MISS line per result that has a target."""
    print()
    for e in results:
        if e["target"]:
            print(f"{'PASS' if e['pass'] else 'MISS'}  {e['name']} = {fmt(e['value'])} {e['unit']} "
                  f"(target {e['target']}; {e['baseline']} {fmt(e['baseline_value'])})")
