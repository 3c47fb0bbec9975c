"""Pure pieces of a run: who the bottle runs as, and the seeded Claude Code state."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from claude_bottle.config import AgentConfig
from claude_bottle.credentials import Credential, CredentialKind
from claude_bottle.launch import BOTTLE_SETTINGS, claude_command
from claude_bottle.runtime.bottle import RunSpec, bottle_user, gate_command, seeded_claude_json


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


def test_the_gate_command_carries_the_agents_egress_policy() -> None:
    spec = RunSpec(agent="a", workspace=Path("/w"), bottle_image="b", gate_image="g",
                   credential=Credential.parse("sk-ant-api03-" + "k" * 60, "t"), upstream="http://stub:8000",
                   allow=("registry.npmjs.org",), allow_tcp=("git.example.com:22",), allow_private=("10.0.0.0/8",))
    command = gate_command(spec)
    pairs = list(zip(command[::2], command[1::2], strict=True))
    assert ("--allow", "registry.npmjs.org") in pairs
    assert ("--allow-tcp", "git.example.com:22") in pairs
    assert ("--allow-private", "10.0.0.0/8") in pairs
    assert ("--upstream", "http://stub:8000") in pairs and ("--token-file", "-") in pairs
    assert spec.credential.secret not in " ".join(command)
