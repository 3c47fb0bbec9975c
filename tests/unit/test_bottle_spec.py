"""Pure pieces of a run: who the bottle runs as, and the seeded Claude Code state."""

from __future__ import annotations

import json
import os
import stat
import tomllib
from pathlib import Path

import pytest

from claude_bottle.agent.schema import AgentConfig, parse_agent
from claude_bottle.credentials import Credential, CredentialKind
from claude_bottle.errors import ConfigError
from claude_bottle.launch import Launch, claude_command, run_spec
from claude_bottle.paths import workspace_key
from claude_bottle.runtime.files import CLAUDE_SETTINGS, seeded_claude_json, seeded_settings
from claude_bottle.runtime.gate import GATE_ALIAS, gate_options, upstream_ca_mounts
from claude_bottle.runtime.names import state_volume
from claude_bottle.runtime.spec import RunSpec
from claude_bottle.runtime.users import user_for
from tests.helpers import make_token


def owned(uid: int, gid: int, mode: int) -> os.stat_result:
    """The stat of a folder owned by uid:gid with these permission bits."""
    return os.stat_result((stat.S_IFDIR | mode, 0, 0, 2, uid, gid, 4096, 0, 0, 0))


WORKSPACE = Path("/srv/project")


def gate_command(spec: RunSpec, listen: str = GATE_ALIAS) -> list[str]:
    """The run's gate's arguments, but ``--exit-with-stdin`` (every run's: its own test below)."""
    return [arg for arg in gate_options(spec, listen).args() if arg != "--exit-with-stdin"]


def test_a_runs_gate_lives_as_long_as_the_host_holds_its_standard_input(tmp_path: Path) -> None:
    spec = run_spec(Launch(AgentConfig(), tmp_path, Credential.parse(make_token(), "t")), "bottle", "gate", "1000:1000")
    assert "--exit-with-stdin" in gate_options(spec).args()


@pytest.mark.parametrize(("uid", "gid", "info", "user"), [
    (1234, 99, owned(1234, 99, 0o755), "1234:99"),  # the invoking user, whoever owns what
    (1000, 1000, owned(1000, 1000, 0o700), "1000:1000"),
    (1234, 99, owned(0, 99, 0o775), "1234:99"),  # writable through the group
    (0, 0, owned(1234, 99, 0o755), "1234:99"),  # root: the workspace's owner
    (0, 0, owned(0, 0, 0o777), "1000:1000"),  # root on a folder root owns: uid 1000, which can write it
    (0, 0, owned(0, 1000, 0o770), "1000:1000"),
])
def test_bottle_runs_as_a_user_who_can_write_the_workspace_never_root(
    uid: int, gid: int, info: os.stat_result, user: str
) -> None:
    assert user_for(uid, gid, info, WORKSPACE) == user


@pytest.mark.parametrize(("uid", "gid", "info", "fix"), [
    (0, 0, owned(0, 0, 0o755), "chown -R 1000:1000 /srv/project"),  # root's own folder: uid 1000 cannot write
    (0, 0, owned(0, 0, 0o776), "chown -R 1000:1000 /srv/project"),  # writable, but not searchable, by others
    (0, 0, owned(1234, 99, 0o555), "chown -R 1000:1000 /srv/project"),  # its owner cannot write it either
    (1234, 99, owned(4321, 98, 0o755), "chown -R 1234:99 /srv/project"),
])
def test_a_workspace_the_bottle_could_not_write_is_refused_before_start(
    uid: int, gid: int, info: os.stat_result, fix: str
) -> None:
    with pytest.raises(ConfigError, match="the workspace /srv/project is not writable by the bottle's user") as caught:
        user_for(uid, gid, info, WORKSPACE)
    assert fix in str(caught.value)


def test_state_volume_is_per_agent_and_workspace() -> None:
    a, b = Path("/srv/a"), Path("/srv/b")
    assert state_volume("dev", a) == f"claude-bottle-dev-{workspace_key(a)}-state"
    assert len({state_volume("dev", a), state_volume("dev", b), state_volume("ops", a)}) == 3


def test_seeded_settings_are_the_products_and_readable_by_any_bottle_user(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    path = seeded_settings()
    assert path.is_relative_to(tmp_path / "claude-bottle")
    assert json.loads(path.read_text()) == CLAUDE_SETTINGS == {"skipDangerousModePermissionPrompt": True}
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    path.write_text('{"hooks": {}}')  # changed on the host: put back at the next start
    assert json.loads(seeded_settings().read_text()) == CLAUDE_SETTINGS


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


def test_claude_command_adds_model_and_args_and_no_settings_flag() -> None:
    command = claude_command(AgentConfig(model="m", claude_args=("--verbose",)), "-p", "hi")
    assert command == ["claude", "--dangerously-skip-permissions", "--model", "m", "--verbose", "-p", "hi"]


@pytest.mark.parametrize(("agent_args", "extra"), [
    ((), ("--permission-prompt-tool", "stdio")),  # an Agent SDK with a permission callback
    ((), ("--permission-mode=plan",)),
    (("--permission-mode", "default"), ()),
    ((), ("--dangerously-skip-permissions",)),  # said once, not twice
])
def test_a_permission_mode_chosen_by_the_caller_or_the_agent_is_not_overridden(
        agent_args: tuple[str, ...], extra: tuple[str, ...]) -> None:
    command = claude_command(AgentConfig(claude_args=agent_args), *extra)
    assert command == ["claude", *agent_args, *extra]


def test_raw_tcp_targets_reach_the_gate_command(tmp_path: Path) -> None:
    agent = parse_agent("a", tomllib.loads('version = 1\nallow = ["x.example"]\nallow_tcp = ["git.example.com:22"]\n'
                                           'allow_private = ["10.0.0.0/8"]\n'), "a.toml")
    spec = run_spec(Launch(agent, tmp_path, Credential.parse(make_token(), "t")), "bottle", "gate", "1000:1000")
    command = gate_command(spec)
    pairs = list(zip(command[::2], command[1::2], strict=True))
    assert ("--allow-tcp", "git.example.com:22") in pairs
    assert ("--allow", "x.example") in pairs and ("--allow-private", "10.0.0.0/8") in pairs
    assert spec.credential.secret not in " ".join(command)


def test_the_agents_server_tools_and_mcp_hosts_reach_the_gate_command(tmp_path: Path) -> None:
    agent = parse_agent("a", tomllib.loads(
        'version = 1\nallow = ["x.example"]\n[api]\nserver_tools = ["web_fetch", "code_execution"]\n'
        '[mcp.servers.docs]\nurl = "https://mcp.example.com:8443/mcp"\n'), "a.toml")
    spec = run_spec(Launch(agent, tmp_path, Credential.parse(make_token(), "t")), "bottle", "gate", "1000:1000")
    command = gate_command(spec)
    pairs = list(zip(command[::2], command[1::2], strict=True))
    assert [v for k, v in pairs if k == "--allow"] == ["x.example", "mcp.example.com:8443"]
    assert [v for k, v in pairs if k == "--allow-server-tool"] == ["web_fetch", "code_execution"]
    assert spec.mcp_servers == {"docs": {"type": "http", "url": "https://mcp.example.com:8443/mcp"}}
    assert "--allow-server-tool" not in gate_command(run_spec(Launch(AgentConfig(), tmp_path, spec.credential),
                                                              "bottle", "gate", "1000:1000"))


def test_the_agents_egress_rules_and_dlp_reach_the_gate_command(tmp_path: Path) -> None:
    from claude_bottle.gate.settings import parse_dlp, parse_egress_rules

    agent = parse_agent("a", tomllib.loads(
        'version = 1\npresets = ["npm-read"]\n[[egress]]\nhost = "api.example.com"\nallow = ["GET /v1/**"]\n'
        'deny = ["GET /v1/admin"]\n[[egress]]\nhost = "pinned.example.com"\ninspect = false\n'
        '[[egress]]\nhost = "open.example.com"\n[dlp]\ndisable = ["jwt"]\n[dlp.rules]\nitk = "itk_[a-z0-9]{32}"\n'),
        "a.toml")
    spec = run_spec(Launch(agent, tmp_path, Credential.parse(make_token(), "t")), "bottle", "gate", "1000:1000")
    command = gate_command(spec)
    pairs = list(zip(command[::2], command[1::2], strict=True))
    assert [v for k, v in pairs if k == "--allow"] == ["registry.npmjs.org", "api.example.com", "pinned.example.com",
                                                       "open.example.com"]
    rules = [v for k, v in pairs if k == "--egress-rule"]
    assert rules == ["registry.npmjs.org allow GET /**", "registry.npmjs.org allow HEAD /**",
                     "registry.npmjs.org allow POST /-/npm/v1/security/advisories/bulk",
                     "registry.npmjs.org allow POST /-/npm/v1/security/audits/quick",
                     "api.example.com deny GET /v1/admin", "api.example.com allow GET /v1/**"]
    # what the gate parses from those flags is what the agent holds
    opaque = [v for k, v in pairs if k == "--no-inspect"]
    assert opaque == ["pinned.example.com"]
    assert parse_egress_rules(rules, opaque) == type(agent.egress)(
        tuple(e for e in agent.egress.hosts if e.allow or e.deny or not e.inspect))
    assert parse_dlp([v for k, v in pairs if k == "--dlp-rule"], [v for k, v in pairs if k == "--dlp-off"]) == agent.dlp


def test_stand_in_cas_reach_the_gate_as_read_only_mounts(tmp_path: Path) -> None:
    ca = tmp_path / "stand-in-ca.pem"
    spec = run_spec(Launch(AgentConfig(), tmp_path, Credential.parse(make_token(), "t"), upstream_ca_files=(ca,)),
                    "bottle", "gate", "1000:1000")
    mounts = upstream_ca_mounts(spec)
    assert mounts == {str(ca): {"bind": "/opt/gate/upstream-ca/0.pem", "mode": "ro"}}
    command = gate_command(spec)
    assert ("--extra-ca", "/opt/gate/upstream-ca/0.pem") in list(zip(command[::2], command[1::2], strict=True))
    assert "--extra-ca" not in gate_command(run_spec(Launch(AgentConfig(), tmp_path, spec.credential),
                                                     "bottle", "gate", "1000:1000"))


def test_every_gate_gets_a_control_socket_in_its_own_file_system_and_learn_mode_only_when_asked(
        tmp_path: Path) -> None:
    from claude_bottle.runtime.gate import CONTROL_SOCKET

    launch = Launch(AgentConfig(), tmp_path, Credential.parse(make_token(), "t"))
    command = gate_command(run_spec(launch, "bottle", "gate", "1000:1000"))
    assert command[command.index("--control-socket") + 1] == CONTROL_SOCKET == "/tmp/claude-bottle-control.sock"
    assert "--learn" not in command
    learning = run_spec(Launch(AgentConfig(), tmp_path, launch.credential, learn=True), "bottle", "gate", "1000:1000")
    assert "--learn" in gate_command(learning)


def test_the_bottles_policy_file_is_written_on_the_host_readable_by_any_user(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from claude_bottle.policy.view import policy_toml
    from claude_bottle.runtime.files import POLICY_FILE, policy_dir, spec_policy, write_policy

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    agent = parse_agent("a", tomllib.loads('version = 1\nallow = ["x.example"]\n'), "a.toml")
    spec = run_spec(Launch(agent, tmp_path, Credential.parse(make_token(), "t"), learn=True), "b", "g", "1000:1000")
    write_policy("a-1234", spec_policy(spec))
    path = policy_dir("a-1234") / POLICY_FILE
    assert stat.S_IMODE(path.stat().st_mode) == 0o644 and stat.S_IMODE(path.parent.stat().st_mode) == 0o755
    assert tomllib.loads(path.read_text()) == {"learn": True, "ask": False, "allow": ["x.example"], "allow_tcp": [],
                                               "deny": [], "rules": []}
    assert spec.credential.secret not in path.read_text()
    asking = run_spec(Launch(agent, tmp_path, Credential.parse(make_token(), "t"), ask=True), "b", "g", "1000:1000")
    assert tomllib.loads(policy_toml(spec_policy(asking)))["ask"] is True, "the bottle is not told that unlisted waits"


def test_on_podman_the_gate_listens_at_the_address_it_is_given(tmp_path: Path) -> None:
    """Podman's internal network has no resolver (so no name for the gate); Docker's gate listens on its alias
    there. (Rootless Podman's bottle keeping the user's uid is the engine's: tests/unit/test_podman_engine.py.)"""
    spec = run_spec(Launch(AgentConfig(), tmp_path, Credential.parse(make_token(), "t")), "bottle", "gate",
                    "1000:1000")
    assert gate_command(spec, "10.89.0.2")[:4] == ["--api-listen", "10.89.0.2:8080", "--proxy-listen",
                                                   "10.89.0.2:3128"]
    assert gate_command(spec)[:4] == ["--api-listen", "gate:8080", "--proxy-listen", "gate:3128"]
