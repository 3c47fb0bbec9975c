"""Finding an agent: by name among the user's agent files, else the workspace's approved project file, else
the built-in defaults."""

from __future__ import annotations

import re
from pathlib import Path

from claude_bottle import trust
from claude_bottle.agent.fields import read_toml
from claude_bottle.agent.project import read_project_file
from claude_bottle.agent.schema import AgentConfig, parse_agent
from claude_bottle.errors import ConfigError
from claude_bottle.paths import agents_dir

AGENT_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,39}")  # an agent file's name, without .toml


def known_agents() -> list[str]:
    """The names of the user's agent files, sorted."""
    return sorted(p.stem for p in agents_dir().glob("*.toml"))


def load_agent(name: str | None, workspace: Path) -> AgentConfig:
    """The agent ``name`` (user-level), or with no name the project's file, else the defaults."""
    if name is not None:
        if not AGENT_NAME.fullmatch(name):
            raise ConfigError(f"agent name {name!r}: use lower-case letters, digits, '-' and '_'")
        path = agents_dir() / f"{name}.toml"
        if not path.exists():
            known = ", ".join(known_agents()) or "none yet"
            raise ConfigError(f"no agent {name!r}: create {path} (agents: {known}); see docs/agents.md")
        return parse_agent(name, read_toml(path), str(path))
    project = read_project_file(workspace)
    if project is None:
        return AgentConfig()
    agent = project.agent()
    approved = trust.approved_digest(workspace)
    if approved != project.digest:
        state = "changed since you approved it" if approved else "not approved"
        raise ConfigError(f"{project.path} is {state}: a project file widens what the bottle may reach; review it "
                          f"with `{trust.trust_command(workspace)}`, which asks before it approves")
    return agent
