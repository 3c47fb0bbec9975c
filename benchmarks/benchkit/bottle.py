"""The bottle part of the benchmark: real bottles on the Docker engine, `claude-bottle run -p` against a plain
`docker run` of the same image, each start and teardown step timed, the gate's idle memory and the images' sizes.
Needs a Docker engine and the images (`claude-bottle build`)."""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import os
import pty
import re
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from .core import MB, BenchError, Deadline, Entry, kb_to_mb, log, percentile, ratio, tree_kb

VENV_BIN = Path(sys.executable).parent

STEP_NOTES = {
    "until_gate_started": "config, image check, the internal network claimed and the egress one found, the gate "
                          "created, connected and started",
    "create_bottle": "the bottle created, held (with its state volume, its trust store and git configuration "
                     "written)",
    "start_bottle": "the engine's client started (`docker start --attach`) to the bottle's StartedAt: it overlaps "
                    "the release below (its entrypoint holds Claude Code until then)",
    "wait_gate_ready": "what is left of the gate's boot once the client was started (its CA announced)",
    "release": "the gate's CA appended to the bottle's trust store and the bottle let go",
    "claude_runs": "Claude Code in the bottle, from its release to the client's exit",
    "teardown_gate_stop": "the gate stopped (SIGTERM, its network endpoints released) for its audit, while the "
                          "engine finishes with the bottle",
    "after_claude_exit": "the client's exit to the gate stopped and the bottle's exit code read (in parallel)",
    "teardown": "everything removed: bottle, gate, the claim on the internal network",
    "total": "in-process run -p: no CLI start-up",
}


def engine_time(stamp: str) -> float:
    """An engine's RFC 3339 time (``2026-11-26T00:15:01.123456789Z``, nanoseconds) as seconds since the epoch."""
    whole, _, fraction = stamp.rstrip("Z").partition(".")
    seconds = dt.datetime.fromisoformat(whole).replace(tzinfo=dt.UTC).timestamp()
    return seconds + float(f"0.{fraction or 0}")


class Bottle:
    """Real bottles: `claude-bottle run -p` against plain `docker run` of the bottle image."""

    def __init__(self, args: argparse.Namespace, deadline: Deadline, tmp: Path, entries: list[Entry],
                 details: dict[str, Any]) -> None:
        self.args, self.deadline, self.tmp, self.entries, self.details = args, deadline, tmp, entries, details
        self.tag = secrets.token_hex(3)
        self.agent = f"bench-{self.tag}"
        self.net = f"claude-bottle-bench-{self.tag}"
        self.egress_stub = f"claude-bottle-bench-stub-{self.tag}"  # its name on the egress network
        self.label = f"claude-bottle.bench={self.tag}"
        self.token = "sk-ant-oat01-" + secrets.token_urlsafe(45)[:60]
        cas = sorted(str(p) for p in Path("/usr/local/share/ca-certificates").glob("*.crt"))
        self.env = {**os.environ, "CLAUDE_BOTTLE_OAUTH_TOKEN": self.token,
                    "XDG_CONFIG_HOME": str(tmp / "config")}
        if cas and "CLAUDE_BOTTLE_EXTRA_CA_CERTS" not in os.environ:
            self.env["CLAUDE_BOTTLE_EXTRA_CA_CERTS"] = ":".join(cas)
        self.cli = [str(VENV_BIN / "claude-bottle")] if (VENV_BIN / "claude-bottle").exists() else \
            [sys.executable, "-P", "-m", "claude_bottle"]
        self.workspace = tmp / "project"
        self.started: list[str] = []

    def docker(self, *argv: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess[str]:
        r = subprocess.run(["docker", *argv], capture_output=True, text=True, timeout=timeout)
        if check and r.returncode:
            raise BenchError(f"docker {' '.join(argv[:3])}: {r.stderr.strip()[-500:]}")
        return r

    def setup(self) -> None:
        if shutil.which("docker") is None:
            raise BenchError("no docker CLI")
        (self.workspace / ".git" / "hooks").mkdir(parents=True)
        (self.workspace / ".git" / "config").write_text("[core]\n")
        self.workspace.chmod(0o777)
        agents = self.tmp / "config" / "claude-bottle" / "agents"
        agents.mkdir(parents=True)
        # The CLI as installed: pip compiles a package's modules at install, where an editable checkout run
        # with PYTHONDONTWRITEBYTECODE (as on CI machines) would compile them again at every start.
        import claude_bottle

        subprocess.run([sys.executable, "-m", "compileall", "-q", str(Path(claude_bottle.__file__).parent)],
                       check=True, timeout=120)
        (agents / f"{self.agent}.toml").write_text("version = 1\n")
        log("images: claude-bottle build (builds only what is missing; the images are normally cached)")
        t0 = time.monotonic()
        r = subprocess.run([*self.cli, "build", self.agent], capture_output=True, text=True, timeout=900,
                           env=self.env, cwd=self.workspace)
        build_s = time.monotonic() - t0
        if r.returncode:
            raise BenchError(f"claude-bottle build failed: {r.stderr[-800:]}")
        out = r.stdout + r.stderr
        self.bottle_image = re.search(r"bottle image:\s*(\S+)", out)[1]  # type: ignore[index]
        self.gate_image = re.search(r"gate image:\s*(\S+)", out)[1]  # type: ignore[index]
        built = "building" in out
        self.details["images"] = {"bottle": self.bottle_image, "gate": self.gate_image, "build_s": build_s,
                                  "built_now": built, "build_output_tail": out[-600:] if built else None}
        log(f"   {self.bottle_image} {self.gate_image} ({build_s:.1f} s{', built now' if built else ', cached'})")
        self.docker("network", "create", "--label", self.label, self.net)
        self.started.append("network")
        # The stub where users' upstream is, for the gate: behind the egress network every gate joins anyway
        # (its two network endpoints, as in use); and a second one on a network of its own, which the gate
        # joins with --upstream-network (a third endpoint) and where `docker run` reaches it.
        from claude_bottle.runtime.engines import open_engine
        from claude_bottle.runtime.pool import egress_network

        egress = egress_network(open_engine()).name
        for name, network, host in ((f"{self.net}-stub", self.net, "stub"),
                                    (f"{self.net}-egress-stub", egress, self.egress_stub)):
            self.docker("run", "-d", "--name", name, "--label", self.label, "--network", network,
                        "--network-alias", host, "--entrypoint", "/opt/gate/bin/python", self.gate_image, "-m",
                        "claude_bottle", "stub-upstream", "--listen", f"{host}:8000")
            end = time.monotonic() + 30
            while "stub upstream on" not in self.docker("logs", name).stdout + self.docker("logs", name).stderr:
                if time.monotonic() > end:
                    raise BenchError(f"the stub container {name} did not start")
                time.sleep(0.1)

    def cleanup(self) -> None:
        for flt in (f"label={self.label}", f"label=claude-bottle.agent={self.agent}"):
            ids = self.docker("ps", "-aq", "--filter", flt, check=False).stdout.split()
            if ids:
                self.docker("rm", "-f", *ids, check=False)
        for flt in (f"label=claude-bottle.agent={self.agent}", f"label={self.label}"):
            ids = self.docker("network", "ls", "-q", "--filter", flt, check=False).stdout.split()
            if ids:
                self.docker("network", "rm", *ids, check=False)
        ids = self.docker("volume", "ls", "-q", "--filter", f"label=claude-bottle.agent={self.agent}",
                          check=False).stdout.split()
        if ids:
            self.docker("volume", "rm", "-f", *ids, check=False)

    def leftovers(self) -> list[str]:
        flt = f"label=claude-bottle.agent={self.agent}"
        return self.docker("ps", "-aq", "--filter", flt, check=False).stdout.split() + \
            self.docker("network", "ls", "-q", "--filter", flt, check=False).stdout.split()

    def timed(self, argv: list[str], timeout: float = 180, env: dict[str, str] | None = None,
              stderr_terminal: bool = False) -> dict[str, float]:
        """Run argv in the workspace with ``env`` (by default the benchmark's) and an empty standard input, as a
        script would; times (from start) of the first and last stdout chunk, of the CLI's `starting gate` step
        on standard error (written only to a terminal: ``stderr_terminal`` gives it a pseudo-terminal there)
        and of the exit."""
        t0 = time.monotonic()
        master, child_err = pty.openpty() if stderr_terminal else (None, subprocess.PIPE)
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=child_err,
                                    env=self.env if env is None else env, cwd=self.workspace, start_new_session=True)
        finally:
            if master is not None:
                os.close(child_err)
        try:
            return self._timed(proc, argv, t0, timeout, master)
        finally:
            if master is not None:
                os.close(master)

    def _timed(self, proc: subprocess.Popen[bytes], argv: list[str], t0: float, timeout: float,
               err_fd: int | None) -> dict[str, float]:
        assert proc.stderr is not None or err_fd is not None
        err_fd = proc.stderr.fileno() if err_fd is None else err_fd  # type: ignore[union-attr]
        marks: dict[str, float] = {}
        out = bytearray()
        err = bytearray()

        def read_out() -> None:
            assert proc.stdout is not None
            while chunk := proc.stdout.read1(65536):  # type: ignore[attr-defined]
                now = time.monotonic() - t0
                marks.setdefault("first_out", now)
                marks["last_out"] = now
                out.extend(chunk)

        def read_err() -> None:
            with contextlib.suppress(OSError):  # a pseudo-terminal's reads end in EIO once the child has gone
                while chunk := os.read(err_fd, 65536):
                    now = time.monotonic() - t0
                    if b"starting gate" in chunk:
                        marks.setdefault("gate_msg", now)
                    err.extend(chunk)

        threads = [threading.Thread(target=read_out, daemon=True), threading.Thread(target=read_err, daemon=True)]
        for t in threads:
            t.start()
        try:
            code = proc.wait(min(timeout, max(5.0, self.deadline.left())))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(20)
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)
            raise BenchError(f"{argv[:3]} timed out") from None
        except BaseException:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(30)
            raise
        marks["exit"] = time.monotonic() - t0
        for t in threads:
            t.join(5)
        if code != 0 or b"Hello from the stub upstream" not in out:
            raise BenchError(f"{argv[:3]} exit {code}: {bytes(out)[-300:]!r} {bytes(err)[-800:]!r}")
        return marks

    def run_p(self, upstream_network: bool = False, steps: bool = True) -> dict[str, float]:
        """`run -p` at the stub behind the egress network, or with ``upstream_network`` at the one on a network
        of its own that the gate joins; ``steps``: its standard error a terminal, so it writes its steps there
        (the `starting gate` mark) as at a user's terminal, where a script's pipe gets none."""
        where = ["--upstream", "http://stub:8000", "--upstream-network", self.net] if upstream_network else \
            ["--upstream", f"http://{self.egress_stub}:8000"]
        m = self.timed([*self.cli, "run", self.agent, "-p", "say hi", *where], stderr_terminal=steps)
        m["leftovers_at_exit"] = len(self.leftovers())
        return m

    def docker_run(self) -> dict[str, float]:
        env = ["-e", "ANTHROPIC_BASE_URL=http://stub:8000", "-e", f"CLAUDE_CODE_OAUTH_TOKEN={self.token}",
               "-e", "HOME=/tmp", "-e", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1", "-e", "DISABLE_AUTOUPDATER=1",
               "-e", "DISABLE_TELEMETRY=1", "-e", "DISABLE_ERROR_REPORTING=1"]
        return self.timed(["docker", "run", "--rm", "--label", self.label, "--network", self.net, "--user",
                           "1000:1000", *env, self.bottle_image, "claude", "--dangerously-skip-permissions", "-p",
                           "say hi"])

    def measure(self) -> None:
        reps = self.args.bottle_reps
        log("bottle: warm-up docker run, then the first run -p, then "
            f"{reps} x (run -p, docker run, run -p --upstream-network) alternating")
        self.docker_run()
        self.deadline.check()
        first = self.run_p()
        log(f"   first run -p: {first['exit']:.2f} s")
        runs: list[dict[str, float]] = []
        plain: list[dict[str, float]] = []
        third: list[dict[str, float]] = []  # the gate on a third network: the upstream's (--upstream-network)
        for i in range(reps):
            self.deadline.check()
            runs.append(self.run_p())
            plain.append(self.docker_run())
            third.append(self.run_p(upstream_network=True))
            r = runs[-1]
            log(f"   rep {i + 1}: run -p {r['exit']:.2f} s (teardown {r['exit'] - r['last_out']:.2f} s), "
                f"docker run {plain[-1]['exit']:.2f} s, run -p --upstream-network {third[-1]['exit']:.2f} s")

        def med(xs: list[float]) -> float:
            return percentile(xs, 50)

        r_wall, p_wall = med([r["exit"] for r in runs]), med([p["exit"] for p in plain])
        teardown = med([r["exit"] - r["last_out"] for r in runs])
        plain_tail = med([p["exit"] - p["last_out"] for p in plain])
        setup = med([r["gate_msg"] for r in runs if "gate_msg" in r] or [float("nan")])
        t_wall = med([r["exit"] for r in third])
        self.details["bottle"] = {"first_run_p": first, "run_p": runs, "docker_run": plain,
                                  "run_p_upstream_network": third}
        self.entries.append(Entry("run_p_wall", "s", r_wall, "docker run", p_wall, ratio(r_wall, p_wall),
                                  note=f"median of {reps}; `claude-bottle run -p 'say hi'` vs `docker run` of the "
                                  "bottle image running `claude -p` at the stub (the gate reaching it over the "
                                  "egress network, as it reaches Anthropic)"))
        self.entries.append(Entry("run_p_overhead", "s", r_wall - p_wall, "docker run", p_wall, None, "<= 1.0 s",
                                  r_wall - p_wall <= 1.0, "gate, networks, volume, setup and teardown"))
        self.entries.append(Entry("run_p_overhead_upstream_network", "s", t_wall - p_wall, "docker run", p_wall,
                                  note="the same with the stub on a network of its own that the gate joins "
                                  "(--upstream-network: a third network endpoint for the gate, to start and "
                                  "to release)"))
        self.entries.append(Entry("run_p_first_start", "s", first["exit"], "run -p median", r_wall,
                                  ratio(first["exit"], r_wall),
                                  note="the first run -p of this benchmark, right after `claude-bottle build` "
                                  + ("built the changed images (details.images.build_s)"
                                     if self.details["images"]["built_now"] else
                                     "found both images cached (nothing rebuilt)")))
        self.entries.append(Entry("run_p_teardown", "s", teardown, "docker run tail", plain_tail,
                                  ratio(teardown, plain_tail),
                                  note="Claude's output printed -> CLI exited with the run's containers removed "
                                  f"(leftovers at exit: {max(r['leftovers_at_exit'] for r in runs):.0f})"))
        self.entries.append(Entry("run_p_until_gate_start", "s", setup,
                                  note="CLI start -> 'starting gate' (config, token, image check)"))
        log(f"   run -p {r_wall:.2f} s, docker run {p_wall:.2f} s, overhead {r_wall - p_wall:.2f} s, "
            f"teardown {teardown:.2f} s")

    def start_breakdown(self) -> None:
        """Where `run -p`'s seconds go: the same steps as `launch.run_attached`, in this process, each timed. The
        engine calls are the product's own (launch.started, Run, the engine's attach command); only the clock is
        added around them."""
        self._use_bench_environment()
        from claude_bottle import tokens
        from claude_bottle.agent.load import load_agent
        from claude_bottle.gate.settings import parse_upstream
        from claude_bottle.launch import Launch, claude_command, started
        from claude_bottle.runtime.docker_api import connect
        from claude_bottle.runtime.run import Run

        credential, _ = tokens.find()
        agent = load_agent(self.agent, self.workspace)
        reps = self.args.bottle_reps
        log(f"start breakdown: {reps} x run -p in process, each step timed")
        steps: list[dict[str, float]] = []
        wait_for_gate, stop_gate = Run.wait_for_gate, Run.stop_gate

        def timed(t: dict[str, float], name: str, call: Any) -> Any:
            def run_timed(*a: Any, **k: Any) -> Any:
                t0 = time.monotonic()
                try:
                    return call(*a, **k)
                finally:
                    t[name] = t.get(name, 0.0) + time.monotonic() - t0
            return run_timed

        try:
            for _ in range(reps):
                self.deadline.check()
                t: dict[str, float] = {}
                Run.wait_for_gate = timed(t, "wait_gate_ready", wait_for_gate)  # type: ignore[method-assign]
                Run.stop_gate = timed(t, "teardown_gate_stop", stop_gate)  # type: ignore[method-assign]
                launch = Launch(agent, self.workspace, credential, parse_upstream(f"http://{self.egress_stub}:8000"))
                t0 = time.monotonic()
                with started(launch, lambda line: None) as run:
                    t["until_gate_started"] = time.monotonic() - t0
                    t1 = time.monotonic()
                    run.create_held_bottle(claude_command(agent, "-p", "say hi"), False)
                    t["create_bottle"] = time.monotonic() - t1
                    launched = time.time()  # the engine's clock: the bottle's State.StartedAt
                    t2 = time.monotonic()
                    client = subprocess.Popen(run.engine.attach_command(run.names.bottle, interactive=False),
                                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                              stderr=subprocess.DEVNULL, start_new_session=True)
                    try:
                        run.release()
                        t["release"] = time.monotonic() - t2 - t["wait_gate_ready"]
                        t3 = time.monotonic()
                        client.wait(max(5.0, self.deadline.left()))
                        t["claude_runs"] = time.monotonic() - t3
                    finally:
                        if client.poll() is None:
                            client.kill()
                            client.wait()
                    t4 = time.monotonic()
                    with ThreadPoolExecutor(1) as pool:  # as run_attached: the gate stops while the bottle ends
                        pool.submit(run.stop_gate)
                        run.engine.wait(run.names.bottle)
                    t["after_claude_exit"] = time.monotonic() - t4
                    state = connect().containers.get(run.names.bottle).attrs["State"]
                    t["start_bottle"] = engine_time(state["StartedAt"]) - launched
                    t5 = time.monotonic()
                t["teardown"] = time.monotonic() - t5
                t["total"] = time.monotonic() - t0
                steps.append(t)
        finally:
            Run.wait_for_gate, Run.stop_gate = wait_for_gate, stop_gate  # type: ignore[method-assign]
        median = {k: percentile([s[k] for s in steps], 50) for k in steps[0]}
        self.details["start_breakdown_s"] = {"median": median, "runs": steps}
        for k, v in median.items():
            self.entries.append(Entry(f"run_p_step_{k}", "s", v, note=STEP_NOTES.get(k, "")))
        log("   " + ", ".join(f"{k} {v:.3f}" for k, v in median.items()))

    def _use_bench_environment(self) -> None:
        os.environ.update({k: self.env[k] for k in ("CLAUDE_BOTTLE_OAUTH_TOKEN", "XDG_CONFIG_HOME")})
        if "CLAUDE_BOTTLE_EXTRA_CA_CERTS" in self.env:
            os.environ["CLAUDE_BOTTLE_EXTRA_CA_CERTS"] = self.env["CLAUDE_BOTTLE_EXTRA_CA_CERTS"]

    def idle_and_sizes(self) -> None:
        # A kept-alive bottle (sleep) through the product's own API, as the tests do: the gate idles.
        self._use_bench_environment()
        from claude_bottle import tokens
        from claude_bottle.agent.load import load_agent
        from claude_bottle.gate.settings import parse_upstream
        from claude_bottle.launch import Launch, started
        from claude_bottle.runtime.docker_api import connect

        credential, _ = tokens.find()
        launch = Launch(load_agent(self.agent, self.workspace), self.workspace, credential,
                        parse_upstream(f"http://{self.egress_stub}:8000"))
        log("gate idle RSS (a bottle running `sleep`), then the time to remove that run")
        t_exit = None
        with started(launch, lambda line: None) as run:
            run.start_bottle(["sleep", "600"])
            time.sleep(3)
            gate = connect().containers.get(run.names.gate)  # the SDK's view: its process and its cgroup
            pid = int(gate.attrs["State"]["Pid"])
            rss = tree_kb(pid, "VmRSS")
            stats = gate.stats(stream=False)
            mem = stats.get("memory_stats", {})
            cgroup_mb = (mem.get("usage", 0) - mem.get("stats", {}).get("inactive_file", 0)) / MB
            t_exit = time.monotonic()
        remove_s = time.monotonic() - t_exit
        self.details["gate_idle"] = {"vmrss_mb": kb_to_mb(rss),
                                     "cgroup_usage_mb": cgroup_mb, "remove_kept_run_s": remove_s,
                                     "leftovers_after_remove": len(self.leftovers())}
        self.entries.append(Entry("gate_idle_rss", "MB", kb_to_mb(rss), "gate container cgroup usage", cgroup_mb,
                                  note="VmRSS of the gate container's processes, 3 s after start, bottle idle"))
        self.entries.append(Entry("teardown_running_bottle", "s", remove_s,
                                  note="remove a run whose bottle is still running (what `stop` does)"))
        sizes = {}
        for name, image in (("bottle", self.bottle_image), ("gate", self.gate_image),
                            ("debian base", "debian:bookworm-slim")):
            r = self.docker("image", "inspect", "-f", "{{.Size}}", image, check=False)
            if r.returncode == 0:
                sizes[name] = int(r.stdout.strip()) / MB
        hist = self.docker("history", "--no-trunc", "--format", "{{.Size}}\t{{.CreatedBy}}", self.bottle_image,
                           check=False).stdout.splitlines()
        self.details["image_sizes_mb"] = sizes
        self.details["bottle_image_layers"] = [h[:300] for h in hist if not h.startswith("0B")]
        self.entries.append(Entry("bottle_image_size", "MB", sizes.get("bottle", float("nan")), "debian:bookworm-slim",
                                  sizes.get("debian base"), ratio(sizes.get("bottle", 0), sizes.get("debian base", 0)),
                                  "<= 450 MB", sizes.get("bottle", 1e9) <= 450, "docker image inspect .Size"))
        self.entries.append(Entry("gate_image_size", "MB", sizes.get("gate", float("nan")), "debian:bookworm-slim",
                                  sizes.get("debian base"), ratio(sizes.get("gate", 0), sizes.get("debian base", 0))))
        log(f"   gate idle VmRSS {kb_to_mb(rss):.1f} MB (cgroup {cgroup_mb:.1f} MB); remove {remove_s:.2f} s; "
            f"sizes {', '.join(f'{k} {v:.0f} MB' for k, v in sizes.items())}")
