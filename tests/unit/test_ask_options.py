"""Ask mode from the agent file and the command line to the gate's arguments."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from claude_bottle.agent.schema import AgentConfig, parse_agent
from claude_bottle.commands import start
from claude_bottle.credentials import Credential
from claude_bottle.errors import ConfigError
from claude_bottle.launch import Launch, run_spec
from claude_bottle.runtime.gate import gate_options
from tests.helpers import make_token


def agent(**keys: Any) -> AgentConfig:
    return parse_agent("a", {"version": 1, **keys}, "a.toml")


def gate_args(launch: Launch) -> list[str]:
    return gate_options(run_spec(launch, "bottle", "gate", "1000:1000")).args()


def test_the_agent_keys_ask_and_ask_timeout() -> None:
    assert (AgentConfig().ask, AgentConfig().ask_timeout) == (False, 60.0)
    parsed = agent(ask=True, ask_timeout=30)
    assert (parsed.ask, parsed.ask_timeout) == (True, 30.0)


@pytest.mark.parametrize(("keys", "words"), [
    ({"ask": "yes"}, "ask: must be true or false"),
    ({"ask_timeout": 0}, "ask_timeout: must be a number of seconds from 1 to 86400"),
    ({"ask_timeout": True}, "ask_timeout: must be a number"),
    ({"ask_timeout": "60"}, "ask_timeout: must be a number"),
])
def test_bad_ask_keys_are_refused_naming_the_key(keys: dict[str, Any], words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        agent(**keys)


def test_a_run_in_ask_mode_gives_its_gate_ask_and_the_agents_timeout(tmp_path: Path) -> None:
    credential = Credential.parse(make_token(), "t")
    args = gate_args(Launch(agent(ask_timeout=12.5), tmp_path, credential, ask=True))
    assert "--ask" in args and args[args.index("--ask-timeout") + 1] == "12.5"
    assert "--ask" not in gate_args(Launch(AgentConfig(), tmp_path, credential))


@pytest.fixture
def prepared(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Any:
    """``start.prepare`` for an agent with ``ask``, the token found without a keyring."""
    import claude_bottle.agent.load
    import claude_bottle.tokens

    monkeypatch.setattr(claude_bottle.tokens, "find", lambda: (Credential.parse(make_token(), "t"), "test"))

    def prepare(agent_ask: bool, **options: bool) -> Launch:
        monkeypatch.setattr(claude_bottle.agent.load, "load_agent", lambda name, path: AgentConfig(ask=agent_ask))
        return start.prepare(None, str(tmp_path), None, (), **options)

    return prepare


def test_ask_mode_is_on_with_the_option_or_the_agents_key_and_never_with_learn(prepared: Any) -> None:
    assert prepared(False, ask=True).ask and prepared(True).ask
    assert not prepared(False).ask
    learning = prepared(True, learn=True)
    assert learning.learn and not learning.ask
    with pytest.raises(ConfigError, match="--learn and --ask: choose one"):
        prepared(False, learn=True, ask=True)
