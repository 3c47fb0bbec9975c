"""`doctor` and `build` on the fake engine: what the engine says of itself and which images it has, one line
each; the images built on the engine the command opened."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from claude_bottle import tokens
from claude_bottle.agent.schema import AgentConfig
from claude_bottle.cli import cli
from claude_bottle.commands.doctor import dlp_engine_line
from claude_bottle.credentials import Credential
from claude_bottle.errors import ConfigError, DockerError
from claude_bottle.launch import build_inputs
from claude_bottle.runtime import engines, images
from claude_bottle.runtime.engine import EngineInfo
from tests.fake_engine import FakeEngine
from tests.helpers import make_token


@pytest.fixture
def no_host_cas(monkeypatch: pytest.MonkeyPatch) -> None:
    """The images' inputs as `doctor` and `build` make them, whatever this host's trust store holds."""
    monkeypatch.setenv("CLAUDE_BOTTLE_HOST_CA_CERTS", "0")
    monkeypatch.delenv("CLAUDE_BOTTLE_EXTRA_CA_CERTS", raising=False)
    monkeypatch.delenv("DOCKER_HOST", raising=False)


def doctor_on(engine: FakeEngine | None, monkeypatch: pytest.MonkeyPatch) -> tuple[int, list[str]]:
    def opened() -> FakeEngine:
        if engine is None:
            raise DockerError("cannot reach the container engine (fake)")
        return engine

    monkeypatch.setattr(engines, "open_engine", opened)
    monkeypatch.setattr(tokens, "find", lambda: (Credential.parse(make_token(), "test"), "the keyring"))
    result = CliRunner().invoke(cli, ["doctor"])
    return result.exit_code, result.output.splitlines()


def test_doctor_says_what_the_engine_is_and_which_images_it_has(monkeypatch: pytest.MonkeyPatch,
                                                                 no_host_cas: None) -> None:
    engine = FakeEngine(about=EngineInfo("Docker", (27, 1, 0), ("runc", "runsc"), "runc", rootless=False))
    inputs = build_inputs(AgentConfig())
    bottle, gate = images.bottle_spec(inputs).tag, images.gate_spec(inputs).tag
    engine.tags.add(bottle)
    code, lines = doctor_on(engine, monkeypatch)
    assert code == 1
    assert lines == [
        "ok  engine: Docker 27.1.0 (the default socket)",
        "ok  OCI runtimes: runc, runsc (default runc); gVisor available (runtime = 'runsc')",
        "ok  engine resolves no external names on internal networks",
        "ok  token found in the keyring",
        "ok  upstream proxy: none (the gate connects out directly)",
        f"ok  {dlp_engine_line()}",
        f"ok  bottle image {bottle} built",
        f"NO  gate image {gate} not built: run claude-bottle build",
    ]
    engine.tags.add(gate)
    assert doctor_on(engine, monkeypatch)[0] == 0


def test_doctor_warns_of_limits_an_engine_cannot_enforce_and_of_an_old_docker(monkeypatch: pytest.MonkeyPatch,
                                                                               no_host_cas: None) -> None:
    podman = FakeEngine(about=EngineInfo("Podman", (4, 3, 1), ("crun",), "crun", rootless=True, unenforced=("CPU",)))
    code, lines = doctor_on(podman, monkeypatch)
    assert code == 1 and lines[0] == "ok  engine: Podman 4.3.1, rootless (the default socket)"
    assert lines[2].startswith("NO  this engine does not enforce the bottle's CPU limits")
    assert not any("external names" in line for line in lines), "Podman's internal networks have no resolver"
    old = FakeEngine(about=EngineInfo("Docker", (20, 10, 24), ("runc",), "runc", rootless=False))
    assert "engine older than 25.0.5 (CVE-2024-29018)" in doctor_on(old, monkeypatch)[1][2]


def test_doctor_without_an_engine_says_so_and_checks_the_token_still(monkeypatch: pytest.MonkeyPatch) -> None:
    code, lines = doctor_on(None, monkeypatch)
    assert code == 1
    assert lines == ["NO  cannot reach the container engine (fake)", "ok  token found in the keyring",
                     "ok  upstream proxy: none (the gate connects out directly)", f"ok  {dlp_engine_line()}"]


def test_build_builds_both_images_on_the_engine_and_prints_their_tags(monkeypatch: pytest.MonkeyPatch,
                                                                      no_host_cas: None, tmp_path: Path) -> None:
    engine = FakeEngine()
    monkeypatch.setattr(engines, "open_engine", lambda: engine)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    (tmp_path / "project").mkdir()
    result = CliRunner().invoke(cli, ["build", "--workspace", str(tmp_path / "project")])
    assert result.exit_code == 0, result.output
    built = [tag for event, tag in engine.events if event == "build"]
    assert len(built) == 2
    assert f"bottle image: {built[0]}\ngate image:   {built[1]}" in result.output


def test_build_refuses_an_extra_ca_where_a_bottle_writes_as_a_run_would(
        monkeypatch: pytest.MonkeyPatch, no_host_cas: None, tmp_path: Path) -> None:
    engine = FakeEngine()
    monkeypatch.setattr(engines, "open_engine", lambda: engine)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    (tmp_path / "project" / "certs").mkdir(parents=True)
    (tmp_path / "project" / "certs" / "corp.crt").write_text("-----BEGIN CERTIFICATE-----\n")
    monkeypatch.setenv("CLAUDE_BOTTLE_EXTRA_CA_CERTS", str(tmp_path / "project" / "certs" / "corp.crt"))
    result = CliRunner().invoke(cli, ["build", "--workspace", str(tmp_path / "project")])
    assert isinstance(result.exception, ConfigError) and "corp.crt lies in the workspace" in str(result.exception)
    assert engine.events == []


def test_build_goes_through_the_proxy_a_run_would_use(monkeypatch: pytest.MonkeyPatch, no_host_cas: None,
                                                     tmp_path: Path) -> None:
    engine = FakeEngine()
    monkeypatch.setattr(engines, "open_engine", lambda: engine)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("HTTPS_PROXY", "http://me:secret@proxy.corp:3128")
    (tmp_path / "project").mkdir()
    result = CliRunner().invoke(cli, ["build", "--workspace", str(tmp_path / "project")])
    assert result.exit_code == 0, result.output
    assert [args["https_proxy"] for args in engine.buildargs.values()] == ["http://me:secret@proxy.corp:3128"] * 2
    assert "secret" not in result.output


def test_verify_builds_through_its_upstream_proxy_option(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from claude_bottle.verify import suite

    class Stop(Exception):
        pass

    given = []

    def verified(agent: AgentConfig, progress: object, proxy: object = None) -> list[object]:
        given.append(proxy)
        raise Stop

    monkeypatch.setattr(suite, "verify", verified)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("HTTPS_PROXY", "http://env-proxy:3128")
    monkeypatch.chdir(tmp_path)
    for options in (["--upstream-proxy", "http://u:p@proxy.corp:3128"], [], ["--upstream-proxy", "none"]):
        assert isinstance(CliRunner().invoke(cli, ["verify", *options]).exception, Stop)
    assert [(p.url, p.password) if p else None for p in given] == [
        ("http://u@proxy.corp:3128", "p"), ("http://env-proxy:3128", ""), None]
