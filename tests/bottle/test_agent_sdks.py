"""The Claude Agent SDKs (Python from PyPI, TypeScript from npm) pointed at the drop-in `claude-bottle-claude`, as
their users would point them, with the real Claude Code in a real bottle against the stub Messages API: answers
arrive as the SDK's message objects, the control protocol (a hook, a permission callback) goes both ways through
the bottle, an SDK that closes early leaves no container, and nothing of the SDK caller's environment reaches
the bottle."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import docker
import pytest

from claude_bottle.commands.start import AGENT_VARIABLE, UPSTREAM_NETWORK_VARIABLE, UPSTREAM_VARIABLE
from tests.bottle.conftest import Upstream, claude_version, leftovers
from tests.prerequisites import missing, require

try:
    import claude_agent_sdk
except ImportError:  # the Python SDK's tests say so through python_sdk
    claude_agent_sdk = None

pytestmark = pytest.mark.docker
ROOT = Path(__file__).resolve().parents[2]
DROP_IN = Path(sys.executable).with_name("claude-bottle-claude")  # the console script the package installs
TS_QUERY = Path(__file__).with_name("agent_sdk_query.mjs")
AGENT = "agent-sdks"
NAMED = "AGENT_NAMED"  # a variable the agent's config names: the positive control of what does go in
GONE_SECONDS = 10
QUERY_SECONDS = 240
# Every process in the bottle, Claude Code and its tools alike, and the environment each started with.
ALL_ENVIRONS = ("run: for p in /proc/[0-9]*; do echo \"== $(tr '\\0' ' ' < $p/cmdline)\"; "
                "tr '\\0' '\\n' < $p/environ; done > /workspace/environ.txt")


@pytest.fixture(scope="module")
def drop_in_env(upstream: Upstream, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """What an SDK user adds to the drop-in's environment here, shared by the module's tests: a token and
    config and state homes of the module's own, the agent, and the stub as its upstream."""
    home = tmp_path_factory.mktemp("agent-sdks")
    agents = home / "config" / "claude-bottle" / "agents"
    agents.mkdir(parents=True)
    (agents / f"{AGENT}.toml").write_text(
        f'version = 1\n\n[env]\n{NAMED} = "named-by-the-agent"\n\n[claude]\nversion = "{claude_version()}"\n')
    return {"CLAUDE_BOTTLE_OAUTH_TOKEN": "sk-ant-oat01-" + secrets.token_urlsafe(60),
            "XDG_CONFIG_HOME": str(home / "config"), "XDG_STATE_HOME": str(home / "state"),
            AGENT_VARIABLE: AGENT, UPSTREAM_VARIABLE: upstream.url, UPSTREAM_NETWORK_VARIABLE: upstream.network}


@pytest.fixture
def python_sdk() -> None:
    """The Python SDK, or the test skipped visibly (failed under CI)."""
    require(claude_agent_sdk is not None, "the Python Agent SDK (claude-agent-sdk) is not installed",
            "the test extras install it: pip install -e '.[test]'")


def sdk_options(drop_in_env: dict[str, str], workspace: Path, **more: Any) -> Any:
    """The Python SDK's options as its documentation has them, its CLI the drop-in."""
    return claude_agent_sdk.ClaudeAgentOptions(cli_path=str(DROP_IN), cwd=str(workspace), env=drop_in_env,
                                               **more)


async def collect(prompt: str, options: Any) -> list[Any]:
    return [message async for message in claude_agent_sdk.query(prompt=prompt, options=options)]


def texts(messages: list[Any]) -> list[str]:
    """The text blocks of the assistant's messages."""
    return [block.text for message in messages if isinstance(message, claude_agent_sdk.AssistantMessage)
            for block in message.content if isinstance(block, claude_agent_sdk.TextBlock)]


def result_of(messages: list[Any]) -> Any:
    results = [m for m in messages if isinstance(m, claude_agent_sdk.ResultMessage)]
    assert len(results) == 1, messages
    return results[0]


@pytest.mark.usefixtures("python_sdk")
def test_python_sdk_query_answers_as_message_objects(
        client: docker.DockerClient, upstream: Upstream, drop_in_env: dict[str, str], workspace: Path) -> None:
    before = len(upstream.requests())
    messages = asyncio.run(asyncio.wait_for(collect("Say hello", sdk_options(drop_in_env, workspace)),
                                            QUERY_SECONDS))
    assert isinstance(messages[0], claude_agent_sdk.SystemMessage) and messages[0].subtype == "init"
    assert "Hello from the stub upstream." in texts(messages)
    assert not result_of(messages).is_error
    assert len(upstream.requests()) > before, "the answer came from the stub, through the gate"
    assert leftovers(client, AGENT) == []


@pytest.mark.usefixtures("python_sdk")
def test_python_sdk_hook_round_trip_through_the_bottle(
        client: docker.DockerClient, drop_in_env: dict[str, str], workspace: Path) -> None:
    """Claude Code in the bottle asks the SDK's PreToolUse hook (a control request out on standard output) and
    obeys its answer (in on standard input): the tool does not run, and the hook's reason is the tool result in
    the next request the stub gets, which the stub reports back. (Claude Code 2.1.190 sends a UserPromptSubmit
    hook's additionalContext as a system message, which the stub does not read.)"""
    marker = f"denied-by-the-hook-{secrets.token_hex(6)}"
    asked: list[dict[str, Any]] = []

    async def deny(hook_input: Any, tool_use_id: str | None, context: Any) -> dict[str, Any]:
        asked.append(hook_input["tool_input"])
        return {"hookSpecificOutput": {"hookEventName": "PreToolUse", "permissionDecision": "deny",
                                       "permissionDecisionReason": marker}}

    hooks = {"PreToolUse": [claude_agent_sdk.HookMatcher(matcher="Bash", hooks=[deny])]}
    messages = asyncio.run(asyncio.wait_for(
        collect("run: touch /workspace/touched", sdk_options(drop_in_env, workspace, hooks=hooks)), QUERY_SECONDS))
    assert [tool_input["command"] for tool_input in asked] == ["touch /workspace/touched"]
    assert f"Tool said: {marker}" in texts(messages)
    assert not (workspace / "touched").exists(), "the hook's answer held in the bottle"
    assert not result_of(messages).is_error
    assert leftovers(client, AGENT) == []


@pytest.mark.usefixtures("python_sdk")
def test_python_sdk_permission_callback_decides_in_the_bottle(
        client: docker.DockerClient, drop_in_env: dict[str, str], workspace: Path) -> None:
    """An SDK with a permission callback chooses how Claude Code asks (``--permission-prompt-tool stdio``): the
    bottle keeps that choice, so Claude Code asks the callback on the host and obeys its refusal."""
    marker = f"refused-by-the-callback-{secrets.token_hex(6)}"
    asked: list[tuple[str, Any]] = []

    async def decide(tool: str, tool_input: dict[str, Any], context: Any) -> Any:
        asked.append((tool, tool_input.get("command")))
        return claude_agent_sdk.PermissionResultDeny(message=marker)

    async def converse() -> list[Any]:
        async with claude_agent_sdk.ClaudeSDKClient(sdk_options(drop_in_env, workspace, can_use_tool=decide)) as sdk:
            await sdk.query("run: touch /workspace/touched")
            return [message async for message in sdk.receive_response()]

    messages = asyncio.run(asyncio.wait_for(converse(), QUERY_SECONDS))
    assert asked == [("Bash", "touch /workspace/touched")]
    assert not (workspace / "touched").exists(), "the callback's refusal held in the bottle"
    assert any(marker in text for text in texts(messages)), "the refusal went back to the model as the tool's result"
    assert leftovers(client, AGENT) == []


def calls_a_tool(message: Any) -> bool:
    return isinstance(message, claude_agent_sdk.AssistantMessage) and any(
        isinstance(block, claude_agent_sdk.ToolUseBlock) for block in message.content)


def assert_gone_soon(client: docker.DockerClient) -> None:
    deadline = time.monotonic() + GONE_SECONDS
    while leftovers(client, AGENT) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert leftovers(client, AGENT) == [], "the run outlived the SDK's end of it"


@pytest.mark.usefixtures("python_sdk")
def test_python_sdk_client_left_mid_run_leaves_no_container(
        client: docker.DockerClient, drop_in_env: dict[str, str], workspace: Path) -> None:
    """Leaving ``ClaudeSDKClient`` closes Claude Code's standard input, then after 5 s sends SIGTERM (then
    SIGKILL): nothing of the run is left 10 s after it returns."""
    async def disconnect_mid_tool() -> None:
        async with claude_agent_sdk.ClaudeSDKClient(sdk_options(drop_in_env, workspace)) as sdk:
            await sdk.query("run: sleep 600")
            async for message in sdk.receive_messages():
                if calls_a_tool(message):
                    break

    asyncio.run(asyncio.wait_for(disconnect_mid_tool(), QUERY_SECONDS))
    assert_gone_soon(client)


# A program that breaks out of query()'s messages mid-run and ends. Breaking out alone does not end Claude Code:
# the Python SDK (0.2.189) closes it only as the program exits, as it would a claude on the host.
BREAK_OUT = """
import asyncio, sys
import claude_agent_sdk as sdk

async def main():
    options = sdk.ClaudeAgentOptions(cli_path=sys.argv[1], cwd=".")
    async for message in sdk.query(prompt="run: sleep 600", options=options):
        if isinstance(message, sdk.AssistantMessage) and any(isinstance(b, sdk.ToolUseBlock) for b in message.content):
            break

asyncio.run(main())
"""


@pytest.mark.usefixtures("python_sdk")
def test_python_sdk_program_breaking_out_mid_run_leaves_no_container(
        client: docker.DockerClient, drop_in_env: dict[str, str], workspace: Path) -> None:
    result = subprocess.run([sys.executable, "-c", BREAK_OUT, str(DROP_IN)], cwd=workspace, capture_output=True,
                            text=True, timeout=QUERY_SECONDS, env={**os.environ, **drop_in_env})
    assert result.returncode == 0, result.stderr
    assert_gone_soon(client)


@pytest.mark.usefixtures("python_sdk")
def test_python_sdk_callers_environment_never_reaches_the_bottle(
        client: docker.DockerClient, upstream: Upstream, drop_in_env: dict[str, str], workspace: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The SDK hands Claude Code its whole environment. Evidence that none of it went in: the environment every
    process in the bottle started with (Claude Code's own among them) holds the variable the agent names and no
    canary; the stub, reached through the gate, saw no canary either. A caller's ANTHROPIC_BASE_URL carried in
    would have sent Claude Code to a host that does not exist, and its API key would have been sent."""
    canary = f"canary-{secrets.token_hex(8)}"
    monkeypatch.setenv("CALLER_SECRET", canary)
    monkeypatch.setenv("ANTHROPIC_API_KEY", f"sk-ant-api03-{canary}")
    monkeypatch.setenv("ANTHROPIC_BASE_URL", f"http://{canary}.invalid")
    messages = asyncio.run(asyncio.wait_for(collect(ALL_ENVIRONS, sdk_options(drop_in_env, workspace)),
                                            QUERY_SECONDS))
    assert not result_of(messages).is_error
    inside = (workspace / "environ.txt").read_text()
    assert "\n== claude " in inside, "Claude Code's own environment is among them"
    assert f"{NAMED}=named-by-the-agent" in inside and "HOME=/home/agent" in inside, "read in the bottle"
    assert canary not in inside
    assert canary not in json.dumps([str(m) for m in messages])
    assert canary not in upstream.stub.logs().decode()
    assert leftovers(client, AGENT) == []


@pytest.fixture(scope="module")
def typescript_sdk() -> Path:
    """The TypeScript SDK's package folder, installed from npm by scripts/test (or named by
    CLAUDE_BOTTLE_TEST_AGENT_SDK), and node to run it."""
    path = Path(os.environ.get("CLAUDE_BOTTLE_TEST_AGENT_SDK")
                or ROOT / ".cache/claude-agent-sdk/node_modules/@anthropic-ai/claude-agent-sdk").absolute()
    require(shutil.which("node"), "no node to run the TypeScript SDK", "scripts/test installs npm and node")
    if not (path / "package.json").exists():
        missing(f"the TypeScript Agent SDK is not installed at {path}", "scripts/test installs it with npm")
    return path


def test_typescript_sdk_query_through_its_executable_path(
        client: docker.DockerClient, drop_in_env: dict[str, str], workspace: Path, typescript_sdk: Path) -> None:
    canary = f"canary-{secrets.token_hex(8)}"
    result = subprocess.run(
        ["node", str(TS_QUERY), str(typescript_sdk), str(DROP_IN), ALL_ENVIRONS], capture_output=True, text=True,
        timeout=QUERY_SECONDS, cwd=workspace,
        env={**os.environ, **drop_in_env, "CALLER_SECRET": canary, "ANTHROPIC_BASE_URL": f"http://{canary}.invalid"})
    assert result.returncode == 0, result.stderr
    messages = [json.loads(line) for line in result.stdout.splitlines()]
    assert messages[0]["type"] == "system" and messages[0]["subtype"] == "init"
    assert messages[-1]["type"] == "result" and messages[-1]["subtype"] == "success"
    assert messages[-1]["result"].startswith("Tool said: ")
    inside = (workspace / "environ.txt").read_text()
    assert f"{NAMED}=named-by-the-agent" in inside and canary not in inside
    assert leftovers(client, AGENT) == []


def test_typescript_sdk_cwd_through_a_link_a_bottle_made_is_refused(
        client: docker.DockerClient, drop_in_env: dict[str, str], workspace: Path, typescript_sdk: Path,
        tmp_path: Path) -> None:
    """The TypeScript SDK starts the drop-in in its cwd and leaves $PWD as it was: a cwd through a link that a
    bottle left in its workspace (``docs`` -> a host folder) would make that folder the next bottle's
    workspace, mounted read-write. The first query plants the link; the second, its cwd that link, is refused."""
    secret = tmp_path / "secret"
    secret.mkdir()
    secret.chmod(0o777)  # a folder the agent's user could use as a workspace: only the refusal stops it
    (secret / "canary").write_text("host-secret\n")

    def query(prompt: str, cwd: Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["node", str(TS_QUERY), str(typescript_sdk), str(DROP_IN), prompt], capture_output=True,
                              text=True, timeout=QUERY_SECONDS, cwd=cwd, env={**os.environ, **drop_in_env})

    planted = query(f"run: ln -s {secret} /workspace/docs", workspace)
    assert planted.returncode == 0, planted.stderr
    assert (workspace / "docs").resolve() == secret
    followed = query("run: cat /workspace/canary", workspace / "docs")
    assert "host-secret" not in followed.stdout
    assert followed.returncode != 0 and f"{secret} is where {workspace / 'docs'} leads" in followed.stderr
    assert leftovers(client, AGENT) == []
