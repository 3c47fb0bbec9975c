"""``forget`` on the fake engine: which Claude state volumes go, and what stops it."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from claude_bottle.cli import cli
from claude_bottle.errors import ConfigError, DockerError
from claude_bottle.runtime import engines
from claude_bottle.runtime.names import RunNames, state_volume
from tests.fake_engine import FakeEngine


@pytest.fixture
def engine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeEngine:
    """Two agents' state on the workspace ``app``, and one agent's on ``other``."""
    engine = FakeEngine()
    monkeypatch.setattr(engines, "open_engine", lambda: engine)
    for agent, place in (("dev", "app"), ("ops", "app"), ("dev", "other")):
        (tmp_path / place).mkdir(exist_ok=True)
        engine.create_volume(state_volume(agent, tmp_path / place),
                             RunNames("", agent, str(tmp_path / place)).volume_labels)
    return engine


def forget(tmp_path: Path, *args: str, terminal_input: str | None = None) -> Result:
    return CliRunner().invoke(cli, ["forget", *args, "--workspace", str(tmp_path / "app")], input=terminal_input)


def test_an_agents_state_on_the_workspace_goes_and_nothing_else(engine: FakeEngine, tmp_path: Path) -> None:
    result = forget(tmp_path, "dev", "--yes")
    assert result.exit_code == 0, result.output
    assert f"{state_volume('dev', tmp_path / 'app')}: agent dev's Claude state for {tmp_path / 'app'}" in result.output
    assert "removed 1 volume: the next run starts afresh" in result.output
    assert set(engine.volumes) == {state_volume("ops", tmp_path / "app"), state_volume("dev", tmp_path / "other")}
    again = forget(tmp_path, "dev", "--yes")
    assert again.exit_code == 0 and f"no Claude state of agent dev's for {tmp_path / 'app'}" in again.output


def test_without_an_agent_every_agents_state_on_the_workspace_goes(engine: FakeEngine, tmp_path: Path) -> None:
    result = forget(tmp_path, "--yes")
    assert result.exit_code == 0 and "removed 2 volumes" in result.output, result.output
    assert set(engine.volumes) == {state_volume("dev", tmp_path / "other")}


def test_it_is_refused_while_a_bottle_of_the_agent_runs_there(engine: FakeEngine, tmp_path: Path) -> None:
    run = RunNames.new("dev", tmp_path / "app")
    engine.add_container(run.gate, run.labels)
    result = forget(tmp_path, "--yes")
    assert isinstance(result.exception, DockerError)
    assert f"{run.id} running on {tmp_path / 'app'} use this state: stop it first (`claude-bottle stop dev`)" \
        in str(result.exception)
    assert len(engine.volumes) == 3
    assert forget(tmp_path, "ops", "--yes").exit_code == 0, "another agent's state is not in use"


def test_without_yes_it_asks_and_without_a_terminal_it_removes_nothing(engine: FakeEngine, tmp_path: Path) -> None:
    result = forget(tmp_path, "dev")  # CliRunner's standard input is not a terminal
    assert isinstance(result.exception, ConfigError) and "--yes" in str(result.exception)
    assert len(engine.volumes) == 3


def test_on_a_terminal_it_asks_first(engine: FakeEngine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import io
    import sys

    from claude_bottle.commands.forget import forget as forget_command

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr(sys, "stdin", Terminal())
    asked: list[str] = []
    monkeypatch.setattr("click.confirm", lambda text, default: asked.append(text) or False)
    with pytest.raises(ConfigError, match=r"^nothing removed$"):
        forget_command("dev", str(tmp_path / "app"), False)
    assert asked == ["Remove it for good?"] and len(engine.volumes) == 3
    monkeypatch.setattr("click.confirm", lambda text, default: True)
    forget_command("dev", str(tmp_path / "app"), False)
    assert len(engine.volumes) == 2
