"""Pure pieces of a run: who the bottle runs as, and the seeded Claude Code state."""

from __future__ import annotations

import json

import pytest

from claude_bottle.config import AgentConfig
from claude_bottle.credentials import Credential, CredentialKind
from claude_bottle.launch import BOTTLE_SETTINGS, claude_command
from claude_bottle.runtime.bottle import bottle_user, seeded_claude_json


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
