"""The drop-in's part of the benchmark: how much later Claude's first byte of output comes through
`claude-bottle-claude` than from the same Claude Code binary run on the host, next to `claude-bottle run -p`
and a plain `docker run` of the bottle image, all at the same stub Messages API, in alternating rounds.

The set-up (images, the agent, the stub containers, the workspace) is the bottle part's (``bottle.Bottle``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from collections.abc import Callable
from math import comb
from pathlib import Path
from typing import Any

from .bottle import VENV_BIN, Bottle
from .core import ROOT, BenchError, Entry, log, percentile, ratio

PROMPT = "say hi"
STREAM_JSON = ("--output-format", "stream-json", "--verbose")  # what the Agent SDKs ask for
IN_IMAGE = "/usr/local/bin/claude"  # bottle.Dockerfile: Claude Code's native binary
DROPIN = "claude-bottle-claude"

Marks = dict[str, float]


def median_interval(values: list[float], confidence: float = 0.95) -> tuple[float, float, float]:
    """A distribution-free interval for the median of ``values`` (the sign test's: the j-th smallest and the
    j-th largest, with j as large as keeps the coverage at least ``confidence``, or 1 for few values); returns
    (low, high, its coverage)."""
    xs, n = sorted(values), len(values)

    def coverage(j: int) -> float:
        return 1 - 2 * sum(comb(n, i) for i in range(j)) / 2 ** n

    j = 1
    while j + 1 <= (n + 1) // 2 and coverage(j + 1) >= confidence:
        j += 1
    return xs[j - 1], xs[n - j], coverage(j)


def console_script(name: str, folder: Path) -> Path:
    """The package's console script ``name`` as installed next to this Python; where the install predates it
    (an editable install's scripts are written at install time), the same script pip writes, from
    pyproject.toml's entry point, in ``folder``."""
    installed = VENV_BIN / name
    if installed.exists():
        return installed
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    if name not in scripts:
        raise BenchError(f"pyproject.toml has no console script {name}")
    module, function = scripts[name].split(":")
    script = folder / name
    script.write_text(f"#!{sys.executable}\nimport sys\nfrom {module} import {function}\n"
                      f"sys.exit({function}())\n")
    script.chmod(0o755)
    return script


class DropIn:
    """The paths to Claude's first byte, each a command timed by ``Bottle.timed``:

    - ``host``: the bottle image's own Claude Code binary, copied out of it, run here as a process of this host
      (a fresh HOME, the bottle's Claude Code variables, ANTHROPIC_BASE_URL at the stub's address);
    - ``dropin``: `claude-bottle-claude -p` in the workspace, the agent and the stub named by its variables;
    - ``run_p``: `claude-bottle run AGENT -p` (``Bottle.run_p``);
    - ``docker_run``: the bottle image run with `docker run --rm` at the stub (``Bottle.docker_run``);
    - ``host_stream``, ``dropin_stream``: the first two with ``STREAM_JSON``, whose first line (the session's
      init message) comes before Claude calls the API: what an Agent SDK waits for first.
    """

    def __init__(self, bottle: Bottle, entries: list[Entry], details: dict[str, Any]) -> None:
        self.bottle, self.entries, self.details = bottle, entries, details

    def setup(self) -> None:
        """After ``Bottle.setup``: the host's copy of the binary, its home, and the drop-in's command."""
        b = self.bottle
        self.claude = b.tmp / "host-claude"
        name = f"{b.net}-copy"
        b.docker("create", "--name", name, "--label", b.label, b.bottle_image)
        try:
            b.docker("cp", f"{name}:{IN_IMAGE}", str(self.claude))
        finally:
            b.docker("rm", "-f", name, check=False)
        version = subprocess.run([str(self.claude), "--version"], capture_output=True, text=True, timeout=60,
                                 env={"PATH": os.environ.get("PATH", ""), "HOME": str(b.tmp)})
        self.version = version.stdout.strip().removesuffix(" (Claude Code)")
        stub = f"{b.net}-stub"
        address = b.docker("inspect", "-f", f'{{{{(index .NetworkSettings.Networks "{b.net}").IPAddress}}}}',
                           stub).stdout.strip()
        if not address:
            raise BenchError(f"the stub container {stub} has no address on {b.net}")
        self.host_env = self._host_environment(f"http://{address}:8000")
        self.dropin_argv = [str(console_script(DROPIN, b.tmp))]
        self.dropin_env = {**b.env, "CLAUDE_BOTTLE_AGENT": b.agent,
                           "CLAUDE_BOTTLE_UPSTREAM": f"http://{b.egress_stub}:8000"}
        self.details["dropin_setup"] = {"claude_version": self.version, "dropin_command": self.dropin_argv,
                                        "stub_address": address, "host_uid": os.getuid()}
        log(f"   host Claude Code {self.version} (copied from {b.bottle_image}); drop-in: "
            f"{' '.join(Path(a).name for a in self.dropin_argv)}")

    def _host_environment(self, base_url: str) -> dict[str, str]:
        """What Claude Code gets in a bottle that matters to its start, here: a fresh home with the bottle's
        seeded state (onboarding done, the workspace trusted, bypass mode accepted), the bottle's Claude Code
        variables, the credential and the API's address; nothing else of this process's environment."""
        from claude_bottle.runtime.files import CLAUDE_SETTINGS
        from claude_bottle.runtime.run import CLAUDE_ENV

        b = self.bottle
        home = b.tmp / "host-home"
        (home / ".claude").mkdir(parents=True)
        (home / ".claude" / "settings.json").write_text(json.dumps(CLAUDE_SETTINGS))
        (home / ".claude.json").write_text(json.dumps({
            "hasCompletedOnboarding": True, "bypassPermissionsModeAccepted": True,
            "projects": {str(b.workspace): {"hasTrustDialogAccepted": True}}}))
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(home), **CLAUDE_ENV,
               "ANTHROPIC_BASE_URL": base_url, "CLAUDE_CODE_OAUTH_TOKEN": b.token}
        if os.getuid() == 0:
            env["IS_SANDBOX"] = "1"  # Claude Code refuses --dangerously-skip-permissions to root otherwise
        return env

    def host(self, *extra: str) -> Marks:
        return self.bottle.timed([str(self.claude), "--dangerously-skip-permissions", "-p", PROMPT, *extra],
                                 env=self.host_env)

    def dropin(self, *extra: str) -> Marks:
        m = self.bottle.timed([*self.dropin_argv, "-p", PROMPT, *extra], env=self.dropin_env)
        m["leftovers_at_exit"] = len(self.bottle.leftovers())
        return m

    def measure(self, reps: int) -> None:
        b = self.bottle
        paths: dict[str, Callable[[], Marks]] = {
            "host": self.host, "dropin": self.dropin, "run_p": lambda: b.run_p(steps=False), "docker_run": b.docker_run,
            "host_stream": lambda: self.host(*STREAM_JSON), "dropin_stream": lambda: self.dropin(*STREAM_JSON)}
        log(f"drop-in: a warm-up of each path, then {reps} rounds of {', '.join(paths)} (the order rotated, every "
            "other round reversed)")
        first = self.dropin()
        log(f"   first drop-in: first byte {first['first_out']:.2f} s, exit {first['exit']:.2f} s")
        for call in paths.values():
            b.deadline.check()
            call()
        runs: dict[str, list[Marks]] = {k: [] for k in paths}
        names = list(paths)
        for i in range(reps):
            # Rotated, and reversed every other round: no path always follows the same one (a bottle's run
            # right before another's leaves the engine's work and caches warm or busy).
            order = names[i % len(names):] + names[:i % len(names)]
            order = order[::-1] if i % 2 else order
            for name in order:
                b.deadline.check()
                runs[name].append(paths[name]())
            log(f"   round {i + 1}: first byte " + ", ".join(f"{k} {runs[k][-1]['first_out']:.2f}" for k in names))
        self.details["dropin"] = {"first_dropin": first, "runs": runs}
        self._rows(first, runs, reps)

    def _rows(self, first: Marks, runs: dict[str, list[Marks]], reps: int) -> None:
        def med(name: str, mark: str = "first_out") -> float:
            return percentile([m[mark] for m in runs[name]], 50)

        host, dropin, run_p, docker = med("host"), med("dropin"), med("run_p"), med("docker_run")
        add = self.entries.append
        how = f"median of {reps}; `-p '{PROMPT}'` at the stub; from the command's start to its first byte on stdout"
        add(Entry("claude_host_first_byte", "s", host, "docker run", docker, ratio(host, docker),
                  note=f"{how}: the bottle image's Claude Code binary run on this host"))
        add(Entry("dropin_first_byte", "s", dropin, "claude on the host", host, ratio(dropin, host),
                  note=f"{how}: `claude-bottle-claude`"))
        # The drop-in and run -p take one path in the code, so their medians differ by the rounds' noise either
        # way: the verdict is on the paired rounds' differences, whose interval must reach 0.
        paired = [d["first_out"] - r["first_out"] for d, r in zip(runs["dropin"], runs["run_p"], strict=True)]
        low, high, coverage = median_interval(paired)
        add(Entry("dropin_overhead_first_byte", "s", dropin - host, "run -p", run_p - host,
                  ratio(dropin - host, run_p - host), "<= run -p's (paired rounds)", low <= 0,
                  "drop-in first byte - host claude's; baseline: run -p's - host claude's. Per round, drop-in - "
                  f"run -p: median {percentile(paired, 50):+.3f} s, {coverage:.1%} interval [{low:+.3f}, "
                  f"{high:+.3f}] (the sign test's); met when the interval reaches 0: not measurably more"))
        add(Entry("dropin_overhead_first_byte_vs_docker_run", "s", dropin - docker, "run -p", run_p - docker,
                  ratio(dropin - docker, run_p - docker), "<= 1.0 s", dropin - docker <= 1.0,
                  "over a plain `docker run` of the bottle image, as run_p_overhead is (its target)"))
        wall = med("dropin", "exit") - med("host", "exit")
        wall_run_p = med("run_p", "exit") - med("host", "exit")
        add(Entry("dropin_overhead_exit", "s", wall, "run -p", wall_run_p, ratio(wall, wall_run_p),
                  note="to the command's exit, the run removed (leftovers at exit: "
                  f"{max(m['leftovers_at_exit'] for m in runs['dropin']):.0f}); over host claude's exit"))
        stream = med("dropin_stream") - med("host_stream")
        add(Entry("dropin_overhead_first_byte_stream_json", "s", stream, "claude on the host", med("host_stream"),
                  note=f"with {' '.join(STREAM_JSON)}: the first line is the session's init message, before "
                  "the API is called (what an Agent SDK reads first)"))
        add(Entry("dropin_first_start", "s", first["first_out"], "drop-in median", dropin,
                  ratio(first["first_out"], dropin), note="the benchmark's first drop-in, before any warm-up"))
        log(f"   first byte: host {host:.2f} s, drop-in {dropin:.2f} s, run -p {run_p:.2f} s, docker run "
            f"{docker:.2f} s; drop-in overhead {dropin - host:.2f} s (run -p {run_p - host:.2f} s)")

