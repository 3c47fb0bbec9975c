"""Real bottles on a real engine: `run -p` and `start` with real Claude Code, and attacks from inside.

The stub Messages API runs in a container on the tests' own network, which only the gate joins.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import docker
import pexpect
import pytest

from claude_bottle.agent.load import load_agent
from claude_bottle.credentials import Credential
from claude_bottle.errors import GateError
from claude_bottle.gate.settings import parse_upstream
from claude_bottle.launch import Launch, started
from claude_bottle.runtime.files import IMAGE_BUNDLE, READY_FILE, SYSTEM_BUNDLE
from claude_bottle.runtime.names import EGRESS_NETWORK, state_volume
from claude_bottle.runtime.run import Run
from claude_bottle.runtime.users import bottle_user
from claude_bottle.stub import DEFAULT_TEXT
from claude_bottle.verify.standins import in_bottle as inside
from tests.bottle.conftest import Upstream, gate_audit, in_terminal, leftovers, on_screen, write_agent

pytestmark = pytest.mark.docker
CLI = [sys.executable, "-P", "-m", "claude_bottle"]


def cli(*args: str, upstream: Upstream, cwd: Path, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args, "--upstream", upstream.url, "--upstream-network", upstream.network],
                          capture_output=True, text=True, timeout=timeout, cwd=cwd)


def test_run_p_answers_through_the_gate_with_the_real_token(
    client: docker.DockerClient, upstream: Upstream, token: str, workspace: Path
) -> None:
    write_agent("headless", "")
    before = len(upstream.requests())  # the stub is the session's: earlier tests' requests came with their tokens
    result = cli("run", "headless", "-p", "say hi", upstream=upstream, cwd=workspace)
    assert result.returncode == 0, result.stderr
    assert DEFAULT_TEXT in result.stdout
    seen = [r for r in upstream.requests()[before:] if r["target"].startswith("/v1/messages")]
    assert seen, "the stub saw no /v1/messages call"
    assert all(["authorization", f"Bearer {token}"] in [[n.lower(), v] for n, v in r["headers"]] for r in seen)
    assert leftovers(client, "headless") == []


def test_the_bottles_command_waits_for_the_gate_and_its_ca(
    client: docker.DockerClient, upstream: Upstream, token: str, workspace: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The bottle starts while its gate boots (run -p): its command must not run before the gate listens and
    the gate's CA is in its trust store, however slow the gate. Here the gate seems 2 s slower."""
    ready = Run.wait_for_gate

    def slow(run: Run) -> None:
        time.sleep(2)
        ready(run)

    monkeypatch.setattr(Run, "wait_for_gate", slow)
    write_agent("held", "")
    probe = (f"grep -c 'BEGIN CERTIFICATE' {SYSTEM_BUNDLE}; grep -c 'BEGIN CERTIFICATE' {IMAGE_BUNDLE}; "
             f"test -e {READY_FILE} && echo ready; gate=${{ANTHROPIC_BASE_URL#http://}}; "
             "(exec 3<>/dev/tcp/${gate%:*}/${gate#*:}) && echo listening")
    launch = Launch(load_agent("held", workspace), workspace, Credential.parse(token, "test"),
                    parse_upstream(upstream.url), (upstream.network,))
    with started(launch, lambda line: None) as run:
        run.start_bottle(["bash", "-c", probe])
        bottle = client.containers.get(run.names.bottle)
        assert bottle.wait(timeout=60)["StatusCode"] == 0
        system, image, *rest = bottle.logs(stdout=True, stderr=True).decode().split()
    assert (int(system), rest) == (int(image) + 1, ["ready", "listening"])
    assert leftovers(client, "held") == []


def test_a_bottle_whose_gate_never_comes_runs_nothing(
    client: docker.DockerClient, upstream: Upstream, token: str, workspace: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    def broken(run: Run) -> None:
        raise GateError("the gate stopped at start: (a test's)")

    monkeypatch.setattr(Run, "wait_for_gate", broken)
    write_agent("orphan", "")
    launch = Launch(load_agent("orphan", workspace), workspace, Credential.parse(token, "test"),
                    parse_upstream(upstream.url), (upstream.network,))
    with pytest.raises(GateError), started(launch, lambda line: None) as run:
        try:
            run.start_bottle(["sh", "-c", "echo ran > /workspace/ran"])
        finally:
            time.sleep(1)  # time enough for the command, were it let go
    assert not (workspace / "ran").exists()
    assert leftovers(client, "orphan") == []


@pytest.fixture
def running(client: docker.DockerClient, upstream: Upstream, token: str, workspace: Path,
            built_images: tuple[str, str]) -> Iterator[Run]:
    """A bottle that sleeps, so the tests can act inside it as the agent would."""
    # target:8000 speaks plain HTTP: its tunnels carry no TLS, so raw TCP is allowed there (allow_tcp)
    write_agent("probe", f'allow = ["target:8000"]\nallow_tcp = ["target:8000"]\n'
                         f'allow_private = ["{upstream.subnet}"]\n')
    launch = Launch(load_agent("probe", workspace), workspace, Credential.parse(token, "test"),
                    parse_upstream(upstream.url), (upstream.network,))
    with started(launch, lambda line: None) as run:
        run.create_bottle(["sleep", "600"], tty=False)
        run.engine.start(run.names.bottle)
        yield run
    assert leftovers(client, "probe") == []


def test_token_is_nowhere_in_the_bottle(running: Run, token: str) -> None:
    assert token not in inside(running, "env")[1]
    assert token not in inside(running, "cat /proc/[0-9]*/environ /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' '\\n'")[1]
    # the whole file system, the token given on stdin so it is not on this grep's own command line
    # (exit 2 means some files were unreadable, which is fine: the threat is what the agent can read)
    code, found = inside(running, "grep -rlsF -D skip -f /dev/stdin / --exclude-dir=proc --exclude-dir=sys",
                         stdin=token)
    assert code in (1, 2) and found == "", f"token found in files: {found}"
    assert inside(running, "grep -rlsF -D skip -f /dev/stdin /home/agent", stdin="hasCompletedOnboarding")[1], \
        "the search must be able to find what is there"
    placeholder = inside(running, "printenv CLAUDE_CODE_OAUTH_TOKEN")[1].strip()
    assert placeholder.startswith("sk-ant-oat01-") and placeholder != token


def test_token_is_in_neither_containers_inspect_output(client: docker.DockerClient, running: Run, token: str) -> None:
    for name in (running.names.gate, running.names.bottle):
        assert token not in json.dumps(client.api.inspect_container(name))


def test_gate_processes_are_invisible_from_the_bottle(running: Run) -> None:
    processes = inside(running, "ps -eo args")[1]
    assert "claude_bottle" not in processes and "sleep 600" in processes


def test_direct_connections_out_fail(running: Run, upstream: Upstream) -> None:
    code, output = inside(running, f"curl --noproxy '*' -sS -m 5 http://{upstream.target_ip}:8000/v1/models")
    assert code != 0, output
    code, output = inside(running, "getent hosts stub target example.com")
    assert code != 0 and output.strip() == "", "a name resolved inside the bottle"


def test_proxy_allows_the_allowlisted_host_only(running: Run) -> None:
    code, output = inside(running, "curl -sS -m 10 -o /dev/null -w '%{http_code}' http://target:8000/v1/models")
    assert (code, output) == (0, "200")
    code, output = inside(running, "curl -sS -m 10 --proxytunnel -o /dev/null -w '%{http_code}' "
                                   "http://target:8000/v1/models")  # a CONNECT tunnel, raw TCP allowed
    assert (code, output) == (0, "200")
    code, output = inside(running, "curl -sS -m 10 -o /dev/null -w '%{http_code}' http://stub:8000/v1/models")
    assert output == "403", "the API upstream must not be reachable through the proxy"
    code, output = inside(running, "curl -sS -m 10 -o /dev/null -w '%{http_code}' http://other.example/")
    assert output == "403"


def test_workspace_is_writable_but_git_hooks_and_config_are_not(running: Run, workspace: Path) -> None:
    assert inside(running, "echo made-inside > /workspace/note.txt")[0] == 0
    assert (workspace / "note.txt").read_text() == "made-inside\n"
    assert inside(running, "echo 'curl evil' > /workspace/.git/hooks/pre-commit")[0] != 0
    assert inside(running, "echo '[alias]' >> /workspace/.git/config")[0] != 0
    assert not (workspace / ".git/hooks/pre-commit").exists()


def test_bottle_has_limits_and_points_claude_code_at_the_gate(client: docker.DockerClient, running: Run) -> None:
    host = client.api.inspect_container(running.names.bottle)["HostConfig"]
    assert (host["PidsLimit"], host["Memory"], host["NanoCpus"]) == (1024, 4 * 1024**3, 2 * 10**9)
    env = dict(line.split("=", 1) for line in inside(running, "env")[1].splitlines() if "=" in line)
    assert env["ANTHROPIC_BASE_URL"] == f"http://{running.gate_ip}:8080"
    assert env["HTTPS_PROXY"] == env["HTTP_PROXY"] == f"http://{running.gate_ip}:3128"
    for switch in ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "DISABLE_AUTOUPDATER", "DISABLE_TELEMETRY",
                   "DISABLE_ERROR_REPORTING"):
        assert env[switch] == "1"
    assert json.loads(inside(running, "cat ~/.claude.json")[1])["hasCompletedOnboarding"] is True


def test_bottle_runs_unprivileged(running: Run) -> None:
    # no_new_privs by prctl (setpriv): gVisor's /proc/self/status has no NoNewPrivs line
    status = inside(running, "id -u; grep -E '^CapEff' /proc/self/status; setpriv -d 2>&1 | grep no_new_privs")[1]
    words = status.split()
    assert words[0] == running.spec.user.split(":")[0] != "0"
    assert words[words.index("CapEff:") + 1] == "0000000000000000"
    assert words[words.index("no_new_privs:") + 1] == "1"
    assert inside(running, "test -e /var/run/docker.sock")[0] != 0


@pytest.mark.parametrize("after", [0.5, 2.0, 4.0])
def test_interrupted_run_leaves_nothing_behind(
    client: docker.DockerClient, upstream: Upstream, token: str, workspace: Path, after: float,
    built_images: tuple[str, str],
) -> None:
    agent = f"interrupted-{secrets.token_hex(3)}"  # unique: leftovers of an earlier run cannot interfere
    write_agent(agent, "")
    process = subprocess.Popen([*CLI, "run", agent, "-p", "say hi", "--upstream", upstream.url,
                                "--upstream-network", upstream.network], cwd=workspace,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(after)
    process.send_signal(signal.SIGINT if after < 3 else signal.SIGTERM)
    process.wait(60)
    assert leftovers(client, agent) == []


def test_interactive_start_reaches_the_prompt_and_answers(
    client: docker.DockerClient, upstream: Upstream, token: str, workspace: Path, built_images: tuple[str, str],
) -> None:
    write_agent("interactive", "")
    child = in_terminal([*CLI, "start", "interactive", "--upstream", upstream.url, "--upstream-network",
                         upstream.network], workspace, dict(os.environ))
    try:
        child.sendcontrol("c")
        time.sleep(0.3)
        child.sendcontrol("c")
        child.expect(pexpect.EOF, timeout=60)
    finally:
        if child.isalive():  # let the CLI remove its run, as a closed terminal would
            child.kill(signal.SIGHUP)
            child.expect(pexpect.EOF, timeout=60)
        child.close()
    assert leftovers(client, "interactive") == []


def test_claude_state_persists_per_agent_and_holds_no_token(
    client: docker.DockerClient, upstream: Upstream, token: str, workspace: Path, built_images: tuple[str, str],
) -> None:
    write_agent("stateful", "")
    assert cli("run", "stateful", "-p", "say hi", upstream=upstream, cwd=workspace).returncode == 0
    bottle_image, _ = built_images

    def in_volume(script: str) -> str:
        return client.containers.run(
            bottle_image, ["bash", "-c", script], environment={"TOKEN": token}, remove=True,
            user=bottle_user(os.getuid(), os.getgid(), workspace),
            volumes={state_volume("stateful", workspace): {"bind": "/home/agent/.claude", "mode": "ro"}},
        ).decode()

    assert "/home/agent/.claude/projects/" in in_volume("find /home/agent/.claude -type f"), "no session kept"
    assert in_volume('grep -rlsF -e "$TOKEN" /home/agent/.claude; true').strip() == "", "the token was stored"

    # forgotten on request: the volume goes, and nothing else of the agent's
    forgotten = subprocess.run([*CLI, "forget", "stateful", "--yes"], capture_output=True, text=True, timeout=60,
                               cwd=workspace)
    assert forgotten.returncode == 0 and "removed 1 volume" in forgotten.stdout, forgotten.stderr
    assert client.volumes.list(filters={"name": state_volume("stateful", workspace)}) == []


def test_ls_logs_exec_and_stop(running: Run, upstream: Upstream, workspace: Path) -> None:
    assert inside(running, "curl -sS -m 10 -o /dev/null http://denied.example/")[0] == 0
    listed = json.loads(subprocess.run([*CLI, "ls", "--json"], capture_output=True, text=True, check=True,
                                       timeout=60).stdout)
    (entry,) = [r for r in listed if r["agent"] == "probe"]
    assert entry["run"] == running.id and entry["status"] == "running" and entry["workspace"] == str(workspace)

    logs = subprocess.run([*CLI, "logs", "probe", "--egress", "--json"], capture_output=True, text=True,
                          check=True, timeout=60).stdout.splitlines()
    records = [json.loads(line) for line in logs]
    assert any(r["target"] == "denied.example:80" and r["decision"] == "deny" for r in records)
    assert all(r["listener"] == "proxy" for r in records)

    for agent in (["probe"], []):  # the documented form names no agent: the bottle of this workspace
        whoami = subprocess.run([*CLI, "exec", *agent, "--", "id", "-u"], capture_output=True, text=True,
                                timeout=60, stdin=subprocess.DEVNULL, cwd=workspace)
        assert whoami.returncode == 0 and whoami.stdout.strip() == running.spec.user.split(":")[0], whoami.stderr
    # On a terminal: what the command writes is drawn there, but never writes the clipboard.
    child = pexpect.spawn(CLI[0], [*CLI[1:], "exec", "probe", "--", "printf", r"a\033]52;c;cHduZWQ=\007\033[1mb\n"],
                          cwd=str(workspace), timeout=60)
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0 and b"a\x1b[1mb" in child.before and b"52;" not in child.before, child.before

    stopped = subprocess.run([*CLI, "stop", "probe"], capture_output=True, text=True, timeout=120)
    assert stopped.returncode == 0 and running.id in stopped.stdout
    assert not [r for r in json.loads(subprocess.run([*CLI, "ls", "--json"], capture_output=True, text=True,
                                                     check=True, timeout=60).stdout) if r["agent"] == "probe"]


def test_two_agents_cannot_see_each_other(
    client: docker.DockerClient, upstream: Upstream, token: str, workspace: Path, built_images: tuple[str, str],
) -> None:
    runs = []
    with contextlib.ExitStack() as stack:
        for name in ("left", "right"):
            write_agent(name, "")
            launch = Launch(load_agent(name, workspace), workspace, Credential.parse(token, "t"),
                            parse_upstream(upstream.url), (upstream.network,))
            run = stack.enter_context(started(launch, lambda line: None))
            run.create_bottle(["sleep", "600"], tty=False)
            run.engine.start(run.names.bottle)
            runs.append(run)
        left, right = runs
        assert right.internal is not None
        right_bottle_ip = right.engine.address(right.names.bottle, right.internal.name)
        for address in (right.gate_ip, right_bottle_ip):
            code, _ = inside(left, f"curl --noproxy '*' -sS -m 5 http://{address}:8080/")
            assert code != 0, f"left reached {address} of the other agent"
        code, output = inside(left, f"curl -sS -m 10 -o /dev/null -w '%{{http_code}}' http://{right.gate_ip}:8080/")
        assert output == "403", "nor through its own gate"
    assert leftovers(client, "left") == [] and leftovers(client, "right") == []


def test_gates_share_the_egress_network_but_listen_on_their_own_networks_only(
    client: docker.DockerClient, upstream: Upstream, token: str, workspace: Path, built_images: tuple[str, str],
) -> None:
    """The attack: a bottle has its gate dial another run's gate on the egress network they share, even with
    that address allowlisted and private addresses allowed, as a user reaching a LAN might set. Nothing
    listens there; without the allowance the address guard refuses it first."""
    with contextlib.ExitStack() as stack:
        write_agent("right", "")
        right = stack.enter_context(started(Launch(load_agent("right", workspace), workspace,
                                                   Credential.parse(token, "t"), parse_upstream(upstream.url),
                                                   (upstream.network,)),
                                            lambda line: None))
        right.start_bottle(["sleep", "600"])
        assert right.egress is not None
        address = right.engine.address(right.names.gate, EGRESS_NETWORK)
        subnet = right.egress.subnets[0]
        targets = [f"{address}:{port}" for port in (8080, 3128)]
        write_agent("left", f"allow = {json.dumps(targets)}\nallow_tcp = {json.dumps(targets)}\n"
                            f'allow_private = ["{subnet}"]\n')
        write_agent("guarded", f"allow = {json.dumps(targets)}\nallow_tcp = {json.dumps(targets)}\n")
        left, guarded = (stack.enter_context(started(Launch(load_agent(name, workspace), workspace,
                                                            Credential.parse(token, "t"), parse_upstream(upstream.url),
                                                            (upstream.network,)), lambda line: None))
                         for name in ("left", "guarded"))
        for run in (left, guarded):
            run.start_bottle(["sleep", "600"])
            assert run.egress is not None and run.egress.id == right.egress.id
        for target in targets:
            for how in ("-w '%{http_code}'", "--proxytunnel -w '%{http_connect}'"):  # plain HTTP, then CONNECT
                request = f"curl -s -m 10 -o /dev/null {how} http://{target}/ 2>/dev/null"
                assert inside(left, request)[1] == "502", f"{target} answered through the gate ({how})"
                assert inside(guarded, request)[1] == "403", f"{target}: a private address got through ({how})"
        assert [r["decision"] for r in gate_audit(left)] == ["error"] * 4
        assert all("cannot connect to upstream" in r["reason"] for r in gate_audit(left))
        assert all("is private (RFC 1918); refused" in r["reason"] for r in gate_audit(guarded))
    for name in ("left", "right", "guarded"):
        assert leftovers(client, name) == []


def test_build_reports_the_image_tags(built_images: tuple[str, str], token: str, workspace: Path) -> None:
    result = subprocess.run([*CLI, "build"], capture_output=True, text=True, timeout=600, cwd=workspace)
    assert result.returncode == 0, result.stderr
    assert f"bottle image: {built_images[0]}" in result.stdout and f"gate image:   {built_images[1]}" in result.stdout


def test_doctor_reports_engine_token_and_images(upstream: Upstream, token: str) -> None:
    result = subprocess.run([*CLI, "doctor"], capture_output=True, text=True, timeout=120)
    assert re.search(r"^ok  engine: (Docker|Podman) \d+\.\d+", result.stdout, re.MULTILINE), result.stdout
    assert re.search(r"^ok  OCI runtimes: .*runc", result.stdout, re.MULTILINE), result.stdout
    assert "ok  token found in $CLAUDE_BOTTLE_OAUTH_TOKEN" in result.stdout
    assert result.returncode == (0 if "not built" not in result.stdout else 1)


def test_no_token_says_how_to_get_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, workspace: Path) -> None:
    monkeypatch.delenv("CLAUDE_BOTTLE_OAUTH_TOKEN", raising=False)
    env = {k: v for k, v in os.environ.items() if k not in ("CLAUDE_BOTTLE_OAUTH_TOKEN", "ANTHROPIC_API_KEY")}
    env.update(XDG_CONFIG_HOME=str(tmp_path / "empty"), PYTHON_KEYRING_BACKEND="keyring.backends.null.Keyring")
    result = subprocess.run([*CLI, "run", "-p", "hi"], capture_output=True, text=True, timeout=60, cwd=workspace,
                            env=env)
    assert result.returncode == 2 and "claude setup-token" in result.stderr


def test_docker_error_mid_start_leaves_nothing_behind(
    client: docker.DockerClient, upstream: Upstream, token: str, workspace: Path, built_images: tuple[str, str],
) -> None:
    write_agent("failing", "")
    result = subprocess.run([*CLI, "run", "failing", "-p", "hi", "--upstream", upstream.url,
                             "--upstream-network", "claude-bottle-no-such-network"],
                            capture_output=True, text=True, timeout=120, cwd=workspace)
    assert result.returncode == 3 and "cannot start the gate" in result.stderr
    assert leftovers(client, "failing") == []


def test_invalid_agent_config_starts_nothing(client: docker.DockerClient, token: str, workspace: Path) -> None:
    write_agent("invalid", 'allow = ["*"]\n')
    result = subprocess.run([*CLI, "run", "invalid", "-p", "hi"], capture_output=True, text=True, timeout=60,
                            cwd=workspace)
    assert result.returncode == 2 and "invalid.toml: allow:" in result.stderr
    assert leftovers(client, "invalid") == []


def test_sigterm_during_an_interactive_start_removes_the_run(
    client: docker.DockerClient, upstream: Upstream, token: str, workspace: Path, built_images: tuple[str, str],
) -> None:
    agent = f"terminated-{secrets.token_hex(3)}"
    write_agent(agent, "")
    child = pexpect.spawn(CLI[0], [*CLI[1:], "start", agent, "--upstream", upstream.url,
                                   "--upstream-network", upstream.network],
                          cwd=str(workspace), env=dict(os.environ), timeout=120, dimensions=(40, 140),
                          encoding="utf-8", codec_errors="replace")
    try:
        child.expect(on_screen("bypass permissions on"))
        assert leftovers(client, agent), "the run is up"
        child.kill(signal.SIGTERM)
        child.expect(pexpect.EOF, timeout=60)
    finally:
        child.close(force=not child.isalive())
    assert leftovers(client, agent) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="who a bottle runs as when root starts it: needs root to chown")
def test_root_runs_the_bottle_as_the_workspace_owner_or_refuses_what_uid_1000_cannot_write(
    client: docker.DockerClient, upstream: Upstream, token: str, tmp_path: Path, built_images: tuple[str, str],
) -> None:
    write_agent("owner", "")
    owned = tmp_path / "owned"
    owned.mkdir(mode=0o755)
    os.chown(owned, 1234, 1234)
    result = cli("run", "owner", "-p", "run: id -u > /workspace/uid", upstream=upstream, cwd=owned)
    assert result.returncode == 0, result.stderr
    assert (owned / "uid").read_text() == "1234\n" and (owned / "uid").stat().st_uid == 1234

    private = tmp_path / "private"
    private.mkdir(mode=0o755)  # root's, not writable by uid 1000
    result = cli("run", "owner", "-p", "hi", upstream=upstream, cwd=private)
    assert result.returncode == 2
    assert f"the workspace {private} is not writable by the bottle's user 1000:1000" in result.stderr
    assert f"chown -R 1000:1000 {private}" in result.stderr
    assert leftovers(client, "owner") == []
