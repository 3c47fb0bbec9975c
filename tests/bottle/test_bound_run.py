"""A run lives and dies with the process that started it, faults injected into real runs: the CLI killed
outright leaves nothing (the gate, which holds the credential, first of all); the gate killed ends the command
with its error, the bottle removed and the audit kept."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

from claude_bottle import records, trust
from claude_bottle.errors import EXIT_GATE
from claude_bottle.paths import workspace_state_dir
from claude_bottle.runtime.names import AGENT_LABEL, RUN_LABEL
from tests.bottle.conftest import Upstream, write_agent

pytestmark = pytest.mark.docker

# The CLI, its bottle's command a long sleep instead of Claude Code: a run in the middle, for as long as needed.
SLEEPING_CLI = ("import sys\n"
                "from claude_bottle import cli, launch\n"
                "launch.claude_command = lambda agent, *extra: ['sleep', '600']\n"
                "sys.argv[0] = 'claude-bottle'\n"
                "cli.main()\n")
GONE_SECONDS = 10
# After its gate: bottle-entry.sh's GATE_GONE_SECONDS, its last probe and pause (3 s and 2 s), and room.
BOTTLE_GONE_SECONDS = 15 + 5 + 10
READY = b"claude-bottle gate: ready"


def containers_of(client: docker.DockerClient, agent: str) -> list[docker.models.containers.Container]:
    for _ in range(10):
        with contextlib.suppress(docker.errors.APIError):  # Podman: 500, not 404, for one removed meanwhile
            return list(client.containers.list(all=True, filters={"label": f"{AGENT_LABEL}={agent}"},
                                               ignore_removed=True))
        time.sleep(0.2)
    return list(client.containers.list(all=True, filters={"label": f"{AGENT_LABEL}={agent}"}, ignore_removed=True))


@contextlib.contextmanager
def mid_run(client: docker.DockerClient, upstream: Upstream, agent: str, workspace: Path,
            command: str = "run", engine: str = "") -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """``claude-bottle run AGENT -p ...`` (or ``start AGENT``) with its bottle running and its gate ready: the
    process and the run's id. ``engine``: the address of ``client``'s engine (DOCKER_HOST), if not the usual."""
    write_agent(agent, "")
    prompt = ["-p", "hi"] if command == "run" else []
    process = subprocess.Popen([sys.executable, "-c", SLEEPING_CLI, command, agent, *prompt, "--upstream",
                                upstream.url, "--upstream-network", upstream.network],
                               cwd=workspace, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, env={**os.environ, **({"DOCKER_HOST": engine} if engine else {})})
    try:
        deadline = time.monotonic() + 240  # the images are built already: this is the start
        while time.monotonic() < deadline and process.poll() is None:
            running = [c for c in containers_of(client, agent) if c.name.endswith("-bottle") and c.status == "running"]
            gates = [c for c in containers_of(client, agent) if c.name.endswith("-gate")]
            with contextlib.suppress(docker.errors.APIError):  # a start's containers come and go (Podman: 500)
                if running and gates and READY in gates[0].logs(stdout=False, stderr=True):
                    break
            time.sleep(0.2)
        assert process.poll() is None and running, process.stderr.read().decode() if process.stderr else ""
        yield process, running[0].labels[RUN_LABEL]
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(30)
        for container in containers_of(client, agent):  # what the test found left, so the next is not misled
            with contextlib.suppress(docker.errors.APIError):
                container.remove(force=True)


def reaper_of(run_id: str) -> int:
    """The pid of the one reaper that watches run ``run_id``."""
    reapers = [int(pid) for pid in subprocess.run(["pgrep", "-f", f"claude_bottle.runtime.reaper {run_id}"],
                                                  capture_output=True, text=True).stdout.split()]
    assert len(reapers) == 1, "one reaper watches the run"
    return reapers[0]


def exited_within(container: docker.models.containers.Container, seconds: float) -> str:
    """``container``'s status once it is no longer running, or after ``seconds``."""
    deadline = time.monotonic() + seconds
    while container.status == "running" and time.monotonic() < deadline:
        time.sleep(0.2)
        container.reload()
    return str(container.status)


def gone_within(client: docker.DockerClient, agent: str, seconds: float) -> list[str]:
    deadline = time.monotonic() + seconds
    while (left := [c.name for c in containers_of(client, agent)]) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


@pytest.mark.parametrize("command", ["run", "start"])
def test_the_cli_killed_outright_leaves_no_container_of_its_run(
        client: docker.DockerClient, upstream: Upstream, token: str, workspace: Path,
        built_images: tuple[str, str], command: str) -> None:
    """And its reaper remembers the link out of the workspace its bottle made, as the run's end would have."""
    agent = f"killed-{command}"
    with mid_run(client, upstream, agent, workspace, command) as (process, run_id):
        gate = client.containers.get(f"claude-bottle-{run_id}-gate")
        bottle = client.containers.get(f"claude-bottle-{run_id}-bottle")
        assert bottle.exec_run(["ln", "-s", "/etc", "/workspace/docs"]).exit_code == 0
        os.kill(process.pid, signal.SIGKILL)
        killed = time.monotonic()
        assert gone_within(client, agent, GONE_SECONDS) == [], "the run's containers outlived the CLI"
        assert time.monotonic() - killed < GONE_SECONDS
        with pytest.raises(docker.errors.NotFound):
            gate.reload()
        remembered = workspace_state_dir(workspace) / trust.LINKS_OUT
        deadline = time.monotonic() + GONE_SECONDS
        while not remembered.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert json.loads(remembered.read_text())["links"] == {"docs": "/etc"}, "the reaper walked the workspace"
    assert records.find(run_id).run == run_id, "its audit is kept on the host"


def test_the_gate_stops_when_the_stream_it_was_started_on_closes(
        client: docker.DockerClient, upstream: Upstream, token: str, workspace: Path,
        built_images: tuple[str, str]) -> None:
    """Without the reaper (a whole process group or cgroup killed, a host that loses power), the gate still
    stops by itself: the credential does not outlive the CLI; and then the bottle. What is left is listed, and
    removed by the next start on the workspace."""
    with mid_run(client, upstream, "killed-all", workspace) as (process, run_id):
        gate = client.containers.get(f"claude-bottle-{run_id}-gate")
        os.kill(reaper_of(run_id), signal.SIGKILL)
        os.kill(process.pid, signal.SIGKILL)
        assert exited_within(gate, GONE_SECONDS) == "exited", "the gate outlived the stream it was started on"
        # The bottle, its gate gone, ends too (its entrypoint's watch): what is left is stopped, as a crashed
        # host leaves it. `ls` shows it; the next start here removes it.
        bottle = client.containers.get(f"claude-bottle-{run_id}-bottle")
        assert exited_within(bottle, BOTTLE_GONE_SECONDS) == "exited", "the bottle outlived its gate"
        listed = subprocess.run([sys.executable, "-P", "-m", "claude_bottle", "ls", "--json"], capture_output=True,
                                text=True, timeout=60, check=True)
        assert {entry["run"]: entry["status"] for entry in json.loads(listed.stdout)}[run_id] == "exited"
        with mid_run(client, upstream, "killed-all", workspace) as (second, _):
            assert [c.name for c in containers_of(client, "killed-all") if c.labels[RUN_LABEL] == run_id] == []
        assert second.stderr is not None
        assert f"removing run {run_id}, left stopped on this workspace" in second.stderr.read().decode()
    assert records.find(run_id).run == run_id, "its audit is kept on the host"


@pytest.mark.parametrize(("command", "how"), [("run", "kill"), ("run", "stop"), ("start", "kill")])
def test_the_gate_gone_mid_run_ends_the_command_with_its_error(
        client: docker.DockerClient, upstream: Upstream, token: str, workspace: Path,
        built_images: tuple[str, str], command: str, how: str) -> None:
    agent = f"gate-{how}-{command}"
    with mid_run(client, upstream, agent, workspace, command) as (process, run_id):
        gate = client.containers.get(f"claude-bottle-{run_id}-gate")
        getattr(gate, how)()
        ended = time.monotonic()
        _, stderr = process.communicate(timeout=GONE_SECONDS + 30)
        assert time.monotonic() - ended < GONE_SECONDS, "the command hung on"
        assert process.returncode == EXIT_GATE
        assert "the gate stopped while the run went on" in stderr.decode()
        assert gone_within(client, agent, 1) == [], "the bottle is removed, and the rest of the run"
    assert records.find(run_id).run == run_id, "its audit is kept on the host"
