"""The bottle's entrypoint (runtime/dockerfiles/bottle-entry.sh) run with bash on this host, its watch of the
gate shortened (GATE_GONE_SECONDS) and pointed at a listener here: a command whose gate answers runs to its
own end, one whose gate is gone is ended, and nothing of the watch reaches the command or standard output."""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import time
from importlib import resources
from pathlib import Path

import pytest

GONE_SECONDS = 4  # above the watch's period (a probe, then 2 s)

pytestmark = pytest.mark.skipif(not (shutil.which("bash") and shutil.which("timeout")),
                                reason="the entrypoint is a bash script using coreutils' timeout")


@pytest.fixture
def entry(tmp_path: Path) -> Path:
    script = resources.files("claude_bottle.runtime").joinpath("dockerfiles/bottle-entry.sh").read_text()
    assert "\nGATE_GONE_SECONDS=15\n" in script
    path = tmp_path / "entry.sh"
    path.write_text(script.replace("\nGATE_GONE_SECONDS=15\n", f"\nGATE_GONE_SECONDS={GONE_SECONDS}\n"))
    return path


def start(entry: Path, gate: str, command: str) -> subprocess.Popen[bytes]:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(entry.parent), "CLAUDE_BOTTLE_GATE": gate}
    return subprocess.Popen(["bash", str(entry), "bash", "-c", command], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env)


def test_a_command_whose_gate_answers_runs_to_its_own_end(entry: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as gate:
        port = gate.getsockname()[1]
        process = start(entry, f"127.0.0.1:{port}", f"sleep {GONE_SECONDS + 2}; echo \"[$CLAUDE_BOTTLE_GATE]\"; exit 7")
        process.wait(60)  # reaped (as tini does in the bottle): the watch then sees it gone and ends too
        stdout, stderr = process.communicate(timeout=30)
    assert process.returncode == 7, stderr
    assert stdout == b"[]\n", "the command sees no gate variable, and the watch writes nothing there"
    assert b"gate is gone" not in stderr


def test_a_command_whose_gate_is_gone_is_ended(entry: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as gate:
        port = gate.getsockname()[1]
    started = time.monotonic()
    process = start(entry, f"127.0.0.1:{port}", "sleep 600")  # nothing listens there: refused
    process.wait(60)
    stdout, stderr = process.communicate(timeout=30)
    assert process.returncode == -signal.SIGTERM
    assert time.monotonic() - started < GONE_SECONDS + 8
    assert stdout == b""
    assert b"claude-bottle: the gate is gone" in stderr


def test_without_a_gate_the_command_runs_unwatched(entry: Path) -> None:
    process = subprocess.run(["bash", str(entry), "true"], capture_output=True, timeout=30,
                             env={"PATH": "/usr/bin:/bin", "HOME": str(entry.parent)})
    assert process.returncode == 0 and process.stdout == b"" and process.stderr == b""
