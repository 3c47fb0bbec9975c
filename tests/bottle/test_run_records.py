"""What outlives a run, attacked from inside real bottles with the real Claude Code: the Claude state (per
agent and workspace; its settings the product's, read-only) and the audit kept on the host."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import docker
import pytest

from claude_bottle import records
from claude_bottle.agent.load import load_agent
from claude_bottle.credentials import Credential
from claude_bottle.gate.settings import parse_upstream
from claude_bottle.launch import Launch, started
from claude_bottle.paths import state_dir
from claude_bottle.runtime.names import state_volume
from claude_bottle.runtime.run import Run
from claude_bottle.runtime.spec import PROXY_PORT
from claude_bottle.stub import DEFAULT_TEXT
from claude_bottle.verify.standins import in_bottle as inside
from tests.bottle.conftest import Upstream, leftovers, write_agent

pytestmark = pytest.mark.docker
CLI = [sys.executable, "-P", "-m", "claude_bottle"]

HOOK = {"hooks": [{"type": "command", "command": "touch /workspace/hook-ran"}]}
HOOKS = json.dumps({"hooks": {"SessionStart": [HOOK], "UserPromptSubmit": [HOOK],
                              "PreToolUse": [{"matcher": "*", **HOOK}]}})
# every file Claude Code reads user-level settings (and so hooks) from in ~/.claude
SETTINGS_FILES = ("settings.json", "settings.local.json", "cowork_settings.json")


def cli(*args: str, cwd: Path, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout, cwd=cwd,
                          stdin=subprocess.DEVNULL)


def run_p(agent: str, prompt: str, upstream: Upstream, cwd: Path) -> subprocess.CompletedProcess[str]:
    return cli("run", agent, "-p", prompt, "--upstream", upstream.url, "--upstream-network", upstream.network,
               cwd=cwd)


def project(tmp_path: Path, name: str) -> Path:
    path = tmp_path / name
    path.mkdir()
    path.chmod(0o777)  # root runs these tests on folders it owns: the bottle's user (uid 1000) writes here
    return path


@pytest.fixture
def bottle_in(upstream: Upstream, token: str) -> Iterator[Callable[..., Run]]:
    """Start sleeping bottles of an agent on a workspace, as the agent would find them; removed at the end."""
    with contextlib.ExitStack() as stack:
        def start(agent: str, workspace: Path, keep: bool = False) -> Run:
            launch = Launch(load_agent(agent, workspace), workspace, Credential.parse(token, "test"),
                            parse_upstream(upstream.url), (upstream.network,))
            run = stack.enter_context(started(launch, lambda line: None, keep=keep))
            run.create_bottle(["sleep", "600"], tty=False)
            run.engine.start(run.names.bottle)
            return run
        yield start


def test_hooks_planted_in_claude_settings_do_not_run_in_the_next_run(
    client: docker.DockerClient, upstream: Upstream, token: str, tmp_path: Path, built_images: tuple[str, str],
    bottle_in: Callable[..., Run],
) -> None:
    write_agent("planter", "")
    workspace = project(tmp_path, "project")
    run = bottle_in("planter", workspace)
    attempts = ("chmod 666 ~/.claude/settings.json", "rm -f ~/.claude/settings.json",
                "echo '{}' > /tmp/s && mv -f /tmp/s ~/.claude/settings.json")
    changed = [attempt for attempt in attempts if inside(run, attempt)[0] == 0]
    for name in SETTINGS_FILES:
        inside(run, f"cat > ~/.claude/{name}", stdin=HOOKS)
    seen = inside(run, "cat ~/.claude/settings.json")[1]
    run.remove()

    result = run_p("planter", "run: echo tool-ran", upstream, workspace)
    assert result.returncode == 0, result.stderr
    assert "Tool said: tool-ran" in result.stdout, "the tool call must have run, so PreToolUse had its chance"
    assert not (workspace / "hook-ran").exists(), "a hook planted by an earlier run ran"
    assert changed == [], f"the bottle changed its settings: {changed}"
    assert json.loads(seen) == {"skipDangerousModePermissionPrompt": True}, "the bottle wrote its settings"


def test_a_project_sees_its_own_claude_state_only(
    client: docker.DockerClient, upstream: Upstream, token: str, tmp_path: Path, built_images: tuple[str, str],
    bottle_in: Callable[..., Run],
) -> None:
    write_agent("twoprojects", "")
    a, b = project(tmp_path, "a"), project(tmp_path, "b")
    result = run_p("twoprojects", "say hi", upstream, a)
    assert result.returncode == 0 and DEFAULT_TEXT in result.stdout, result.stderr
    transcripts = "find ~/.claude -path '*/projects/*' -name '*.jsonl'"
    assert inside(bottle_in("twoprojects", a), transcripts)[1].strip(), "project a's session is kept for --continue"
    assert inside(bottle_in("twoprojects", b), transcripts)[1].strip() == "", "project b sees project a's session"
    volumes = {v.name: v.attrs["Labels"] for v in client.volumes.list(filters={"label": "claude-bottle.agent=twoprojects"})}
    assert volumes.keys() == {state_volume("twoprojects", a), state_volume("twoprojects", b)}
    assert volumes[state_volume("twoprojects", a)]["claude-bottle.workspace"] == str(a)


def denied_line(target: str) -> Callable[[dict[str, object]], bool]:
    return lambda r: r["target"] == target and r["decision"] == "deny"


def test_the_audit_of_run_p_is_kept_on_the_host_without_the_token(
    client: docker.DockerClient, upstream: Upstream, token: str, tmp_path: Path, built_images: tuple[str, str],
) -> None:
    write_agent("audited", "")
    workspace = project(tmp_path, "project")
    result = run_p("audited", "run: curl -sS -m 5 http://denied.example/", upstream, workspace)
    assert result.returncode == 0, result.stderr
    assert leftovers(client, "audited") == []
    shown = cli("logs", "--json", cwd=workspace)
    assert shown.returncode == 0, shown.stderr
    lines = [json.loads(line) for line in shown.stdout.splitlines()]
    assert any(map(denied_line("denied.example:80"), lines)), "the proxy's refusal"
    assert any(r["listener"] == "api" and r["decision"] == "allow" for r in lines), "the API calls"
    (record,) = records.recorded()
    assert (record.agent, record.workspace) == ("audited", str(workspace)) and record.started < record.ended
    assert cli("logs", "--runs", cwd=tmp_path).stdout.splitlines()[1].split()[:2] == [record.run, "audited"]
    kept = b"".join(f.read_bytes() for f in state_dir().rglob("*") if f.is_file())
    assert token.encode() not in kept, "the host copy holds the token"


def test_the_audit_is_kept_when_another_terminal_stops_a_kept_run(
    client: docker.DockerClient, upstream: Upstream, token: str, tmp_path: Path, built_images: tuple[str, str],
    bottle_in: Callable[..., Run],
) -> None:
    # target:8000 is a plain-HTTP stub: its tunnel stays opaque (the gate's own TLS to it would fail)
    write_agent("stopped", f'allow_private = ["{upstream.subnet}"]\n[[egress]]\nhost = "target:8000"\ninspect = false\n')
    workspace = project(tmp_path, "project")
    run = bottle_in("stopped", workspace, keep=True)
    assert inside(run, "curl -sS -m 5 -o /dev/null http://before-stop.example/")[0] == 0
    # a tunnel still open when the run is stopped: its line is written as the gate stops
    inside(run, f"(exec 3<>/dev/tcp/{run.gate_ip}/{PROXY_PORT}; printf 'CONNECT target:8000 HTTP/1.1\\r\\nHost: target:8000\\r\\n\\r\\n' >&3; "
                "sleep 60) >/dev/null 2>&1 & disown; sleep 1")
    # and a request its upstream has not answered when the bottle goes: the gate, left with no client to
    # answer, cuts it and writes its line before the engine would kill it (a line it could lose)
    inside(run, "(curl -sS -m 60 -o /dev/null http://target:8000/v1/messages -H 'content-type: application/json' "
                "-d '{\"model\": \"m\", \"stub\": {\"delay\": 60}}') >/dev/null 2>&1 & disown; sleep 1")
    stopped = cli("stop", "stopped", cwd=tmp_path)
    assert stopped.returncode == 0 and run.id in stopped.stdout
    shown = cli("logs", "--json", cwd=workspace)
    assert shown.returncode == 0, shown.stderr
    lines = [json.loads(line) for line in shown.stdout.splitlines()]
    assert any(map(denied_line("before-stop.example:80"), lines))
    assert any(r["target"] == "target:8000" and r["status"] == 200 for r in lines), "the tunnel open at the stop"
    assert any(r["target"] == "target:8000" and r.get("path") == "/v1/messages" for r in lines), "the request"
    assert cli("logs", "stopped", "--follow", cwd=tmp_path).returncode == 2, "--follow needs a running bottle"


def test_a_flood_of_audit_lines_stays_within_the_caps(
    client: docker.DockerClient, upstream: Upstream, token: str, tmp_path: Path, built_images: tuple[str, str],
    bottle_in: Callable[..., Run], monkeypatch: pytest.MonkeyPatch,
) -> None:
    cap = 64 * 1024
    monkeypatch.setattr(records, "RUN_BYTES", cap)
    write_agent("flood", "")
    workspace = project(tmp_path, "project")
    run = bottle_in("flood", workspace)
    for name in (run.names.gate, run.names.bottle):
        assert client.api.inspect_container(name)["HostConfig"]["LogConfig"] == {
            "Type": "json-file", "Config": {"max-size": "5m", "max-file": "2"}}, "the engine keeps a bounded log"
    flood = (f"for i in $(seq 1500); do exec 3<>/dev/tcp/{run.gate_ip}/{PROXY_PORT} || exit 1; "
             "printf 'CONNECT flood-%s.example:443 HTTP/1.1\\r\\nHost: flood-%s.example:443\\r\\n\\r\\n' $i $i >&3; read -t 5 -r _ <&3; exec 3>&-; done")
    inside(run, "cat > /tmp/flood.sh", stdin=flood)
    code, output = inside(run, "timeout 300 bash /tmp/flood.sh")
    assert code == 0, output
    run.remove()
    (record,) = records.recorded()
    assert record.lines >= 1500
    files = list(records.run_dir(record.run).glob("audit.jsonl*"))
    assert sum(f.stat().st_size for f in files) <= cap + 1024
    kept = [json.loads(line) for line in records.audit_lines(record)]
    assert kept[-1]["target"] == "flood-1500.example:443", "the newest lines are kept"
    assert len(kept) < record.lines, "the oldest went"
    shown = cli("logs", "--run", record.run, "--json", cwd=tmp_path)
    assert f"its first {kept[0]['seq'] - 1} audit lines are not kept" in shown.stderr, "a flood cannot hide that"

