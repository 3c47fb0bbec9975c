"""Pure pieces of a run: who the bottle runs as, and the seeded Claude Code state."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from claude_bottle.config import AgentConfig, parse_agent
from claude_bottle.credentials import Credential, CredentialKind
from claude_bottle.launch import BOTTLE_SETTINGS, Launch, claude_command, run_spec
from claude_bottle.runtime.bottle import bottle_user, gate_command, seeded_claude_json
from tests.helpers import make_token


@pytest.mark.parametrize(("uid", "gid", "user"), [(0, 0, "1000:1000"), (1000, 1000, "1000:1000"),
                                                  (1234, 99, "1234:99")])
def test_bottle_runs_as_the_invoking_user_but_never_root(uid: int, gid: int, user: str) -> None:
    assert bottle_user(uid, gid) == user


def test_seeded_state_skips_onboarding_trusts_the_workspace_and_carries_mcp_servers() -> None:
    servers = {"files": {"type": "stdio", "command": "npx", "args": ["server"]}}
    state = json.loads(seeded_claude_json(CredentialKind.OAUTH, "sk-ant-oat01-x", servers))
    assert state["hasCompletedOnboarding"] is True
    assert state["bypassPermissionsModeAccepted"] is True
    assert state["projects"]["/workspace"]["hasTrustDialogAccepted"] is True
    assert state["mcpServers"] == servers
    assert "customApiKeyResponses" not in state


def test_api_key_placeholder_is_preapproved_so_no_dialog_asks() -> None:
    placeholder = Credential.parse("sk-ant-api03-" + "k" * 60, "t").placeholder()
    state = json.loads(seeded_claude_json(CredentialKind.API_KEY, placeholder, {}))
    assert state["customApiKeyResponses"] == {"approved": [placeholder[-20:]], "rejected": []}


def test_claude_command_skips_the_bypass_warning_and_adds_model_and_args() -> None:
    command = claude_command(AgentConfig(model="m", claude_args=("--verbose",)), "-p", "hi")
    assert command[:4] == ["claude", "--dangerously-skip-permissions", "--settings", BOTTLE_SETTINGS]
    assert json.loads(BOTTLE_SETTINGS) == {"skipDangerousModePermissionPrompt": True}
    assert command[4:] == ["--model", "m", "--verbose", "-p", "hi"]


def test_raw_tcp_targets_reach_the_gate_command(tmp_path: Path) -> None:
    agent = parse_agent("a", tomllib.loads('version = 1\nallow = ["x.example"]\nallow_tcp = ["git.example.com:22"]\n'
                                           'allow_private = ["10.0.0.0/8"]\n'), "a.toml")
    spec = run_spec(Launch(agent, tmp_path, Credential.parse(make_token(), "t")), "bottle", "gate")
    command = gate_command(spec)
    pairs = list(zip(command[::2], command[1::2], strict=True))
    assert ("--allow-tcp", "git.example.com:22") in pairs
    assert ("--allow", "x.example") in pairs and ("--allow-private", "10.0.0.0/8") in pairs
    assert spec.credential.secret not in " ".join(command)


def test_the_agents_server_tools_and_mcp_hosts_reach_the_gate_command(tmp_path: Path) -> None:
    agent = parse_agent("a", tomllib.loads(
        'version = 1\nallow = ["x.example"]\n[api]\nserver_tools = ["web_fetch", "code_execution"]\n'
        '[mcp.servers.docs]\nurl = "https://mcp.example.com:8443/mcp"\n'), "a.toml")
    spec = run_spec(Launch(agent, tmp_path, Credential.parse(make_token(), "t")), "bottle", "gate")
    command = gate_command(spec)
    assert " ".join(command).endswith("--allow x.example --allow mcp.example.com:8443 "
                                      "--allow-server-tool web_fetch --allow-server-tool code_execution")
    assert spec.mcp_servers == {"docs": {"type": "http", "url": "https://mcp.example.com:8443/mcp"}}
    assert "--allow-server-tool" not in gate_command(run_spec(Launch(AgentConfig(), tmp_path, spec.credential),
                                                              "bottle", "gate"))
