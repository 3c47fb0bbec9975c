"""What the host runs or trusts from files named in the user's config is refused where a bottle writes: the
workspace, writable mounts, and workspaces where bottles have run (a bottle there changed it in an earlier
run). The refusal comes before anything of it runs."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from claude_bottle import trust
from claude_bottle.agent.mounts import Mount
from claude_bottle.agent.schema import AgentConfig, parse_agent
from claude_bottle.commands import start
from claude_bottle.credentials import Credential
from claude_bottle.errors import ConfigError
from claude_bottle.host_inputs import check_ca_files, check_host_commands, host_files, where_bottles_write
from tests.helpers import make_token


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A home of the test's own (where host commands run), with claude-bottle's state in it."""
    home = tmp_path / "home"
    (home / "bin").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_STATE_HOME", str(home / ".local" / "state"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / ".config"))
    return home


def ran_before(workspace: Path) -> Path:
    """``workspace``, where a bottle has run (its run's record kept as a run's end keeps it)."""
    workspace.mkdir(parents=True, exist_ok=True)
    watch = trust.Watch(workspace, "t-before")
    watch.begin()
    watch.end(lambda _: None)
    return workspace


def program(path: Path, canary: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\ntouch {canary}\necho {make_token()}\n")
    path.chmod(0o755)
    return path


def agent_with(command: list[str] | None = None, ask_command: list[str] | None = None, **keys: Any) -> AgentConfig:
    data: dict[str, Any] = {"version": 1, **keys}
    if command:
        data["credentials"] = {"corp": {"hosts": ["git.corp.example"], "scheme": "bearer", "command": command}}
    if ask_command:
        data["ask_command"] = ask_command
    return parse_agent("dev", data, "dev.toml")


def test_where_bottles_write_is_the_workspace_a_writable_mount_or_an_earlier_workspace(home: Path) -> None:
    workspace, shared, readable = home / "app", home / "shared", home / "docs"
    for folder in (workspace, shared, readable):
        folder.mkdir()
    mounts = (Mount(shared, "/shared", False, "dev.toml: mounts[0].source"),
              Mount(readable, "/docs", True, "dev.toml: mounts[1].source"))
    earlier = ran_before(home / "old" / "tool")
    (home / "link").symlink_to(earlier / "bin")
    assert where_bottles_write(workspace / "x", workspace, mounts) == f"the workspace ({workspace})"
    assert where_bottles_write(shared / "x", workspace, mounts) == \
        f"the writable mount dev.toml: mounts[0].source ({shared})"
    assert where_bottles_write(earlier / "bin" / "x", workspace, mounts) == \
        f"{earlier}, a workspace where bottles have run"
    assert where_bottles_write(home / "link" / "x", workspace, mounts) != "", "followed to its real path"
    assert where_bottles_write(earlier, workspace) != "", "the workspace itself"
    for outside in (readable / "x", home / "old" / "x", home / "bin" / "x", Path("/usr/bin/env")):
        assert where_bottles_write(outside, workspace, mounts) == "", outside
    assert trust.workspace_holding(earlier / "a" / "b") == earlier and trust.workspace_holding(home) is None


def test_a_credential_command_where_a_bottle_wrote_it_is_refused_before_it_runs(
        home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The helper lies in a workspace where bottles have run: the next start, in another workspace, refuses it
    and never runs it, whether it is named by its path, found on $PATH, or handed to an interpreter."""
    canary = tmp_path / "ran"
    helper = program(ran_before(home / "tools") / "bin" / "token-helper", canary)
    workspace = home / "app"
    workspace.mkdir()
    import claude_bottle.agent.load
    import claude_bottle.tokens

    monkeypatch.setattr(claude_bottle.tokens, "find", lambda: (Credential.parse(make_token(), "t"), "test"))
    monkeypatch.setenv("PATH", f"{home / 'tools' / 'bin'}{os.pathsep}{os.environ['PATH']}")
    for command in ([str(helper)], ["~/tools/bin/token-helper"], ["token-helper"], ["sh", "tools/bin/token-helper"],
                    ["sh", f"--script={helper}"]):
        monkeypatch.setattr(claude_bottle.agent.load, "load_agent", lambda name, path, c=command: agent_with(c))
        with pytest.raises(ConfigError) as caught:
            start.prepare(None, str(workspace), None, ())
        message = str(caught.value)
        assert message.startswith("dev.toml: credentials.corp: "), message
        assert f"{helper} lies in {home / 'tools'}, a workspace where bottles have run" in message, message
        assert "docs/trust.md#what-the-host-runs" in message
        assert not canary.exists(), f"{command} ran"


def test_an_ask_hook_or_a_file_it_names_in_the_workspace_or_a_writable_mount_is_refused(home: Path) -> None:
    workspace, shared = home / "app", home / "shared"
    hook = program(workspace / "hooks" / "decide", home / "ran")
    settings = shared / "hook.json"
    shared.mkdir()
    settings.write_text("{}")
    with pytest.raises(ConfigError, match=rf"dev.toml: ask_command: its program {hook} lies in the workspace"):
        check_host_commands(agent_with(ask_command=[str(hook)]), workspace)
    mounted = agent_with(ask_command=["/usr/bin/env", "python3", "-m", "decider", f"--config={settings}"],
                         mounts=[{"source": str(shared), "target": "/shared", "mode": "rw"}])
    with pytest.raises(ConfigError, match=rf"ask_command: the file it names {settings} lies in the writable mount "
                                          r"dev.toml: mounts\[0\].source"):
        check_host_commands(mounted, workspace)
    read_only = agent_with(ask_command=["/usr/bin/env", "python3", f"--config={settings}"],
                           mounts=[{"source": str(shared), "target": "/shared", "mode": "ro"}])
    check_host_commands(read_only, workspace)


def test_commands_outside_every_workspace_and_words_that_are_not_paths_pass(home: Path) -> None:
    """A word is not read as a path even where a workspace of that name lies in the home folder (``pass show
    app``); nor is a path that does not exist."""
    workspace = ran_before(home / "app")
    helper = program(home / "bin" / "token-helper", home / "ran")
    for command in ([str(helper)], ["pass", "show", "app"], ["gh", "auth", "token"], ["sh", "-c", "cat app/x"],
                    ["op", "read", "op://vault/app/token"]):
        check_host_commands(agent_with(command, ask_command=command), workspace)
    assert [what for what, _ in host_files(("sh", "-c", "cat app/x"))] == ["its program"]


def test_a_relative_path_entry_is_read_from_the_home_folder(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A relative $PATH entry is relative to where host commands run (the home folder), as the command finds it."""
    helper = program(ran_before(home / "app") / "bin" / "helper", home / "ran")
    monkeypatch.setenv("PATH", f"app/bin{os.pathsep}/usr/bin{os.pathsep}/bin")
    assert host_files(("helper",)) == [("its program", helper)]
    with pytest.raises(ConfigError, match=r"its program .*helper lies in .*a workspace where bottles have run"):
        check_host_commands(agent_with(["helper"]), home / "other")


def test_an_extra_ca_certificate_in_an_earlier_workspace_is_refused(home: Path) -> None:
    certificate = ran_before(home / "app") / "certs" / "corp.crt"
    certificate.parent.mkdir()
    certificate.write_text("-----BEGIN CERTIFICATE-----\n")
    with pytest.raises(ConfigError, match=rf"extra CA certificate {certificate} lies in {home / 'app'}, a workspace "
                                          "where bottles have run"):
        check_ca_files([certificate], home / "other")
