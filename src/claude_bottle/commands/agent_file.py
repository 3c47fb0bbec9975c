"""Changes to an agent's file, shown as a diff and written once confirmed (``allow --save``, ``deny --save``,
``policy suggest --write``)."""

from __future__ import annotations

import os
import pathlib
import sys
from typing import TYPE_CHECKING

import click

from claude_bottle.errors import ConfigError

if TYPE_CHECKING:
    from claude_bottle.policy.hosts import Allowlist


def allowlist(name: str) -> Allowlist:
    """What the agent file ``name`` lets the bottle reach (its allowlist and raw-TCP targets); empty when there
    is no such file yet."""
    from pathlib import Path

    from claude_bottle.agent.load import load_agent
    from claude_bottle.paths import agents_dir
    from claude_bottle.policy.hosts import Allowlist

    if not (agents_dir() / f"{name}.toml").exists():
        return Allowlist()
    agent = load_agent(name, Path.cwd())
    return Allowlist(agent.egress_allowlist.patterns + agent.allow_tcp.patterns)


def path_of(name: str) -> pathlib.Path:
    """The file of agent ``name``, which need not exist; ConfigError for a name that is not an agent's."""
    from claude_bottle.agent.load import AGENT_NAME
    from claude_bottle.paths import agents_dir

    if not AGENT_NAME.fullmatch(name):
        raise ConfigError(f"agent name {name!r}: use lower-case letters, digits, '-' and '_' (up to 40)")
    return agents_dir() / f"{name}.toml"


def add(name: str, additions: str, yes: bool) -> None:
    """Append ``additions`` (TOML tables) to the agent file ``name`` (created if missing). A run started without
    an agent's name is the default agent's, which reads no agent file: nothing is written for it (ConfigError)."""
    from claude_bottle.agent.schema import DEFAULT_AGENT

    path = path_of(name)
    if name == DEFAULT_AGENT and not path.exists():
        raise ConfigError("not saved: this run was started without an agent's name, so it reads no agent file "
                          "(the workspace's .claude-bottle.toml, else the defaults); add the entry to the allow "
                          "list there (then `claude-bottle trust`), or to an agent of your own "
                          "(~/.config/claude-bottle/agents/NAME.toml, `claude-bottle start NAME`)")
    before = path.read_text() if path.exists() else ""
    rewrite(name, before, (before or "version = 1\n") + additions, yes)


def rewrite(name: str, before: str, after: str, yes: bool) -> None:
    """Replace the agent file ``name`` (whose text is ``before``) with ``after``, once it parses as an agent,
    after showing the diff and asking (or ``yes``); else nothing is written."""
    import tomllib

    from claude_bottle import suggest
    from claude_bottle.agent.schema import parse_agent

    path = path_of(name)
    try:
        parse_agent(name, tomllib.loads(after), str(path))
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: would not parse after the change ({exc}); nothing written") from None
    click.echo(suggest.diff(before, after, str(path)), nl=False)
    if not yes:
        if not sys.stdin.isatty():
            raise ConfigError("review the change above, then run again with --yes (no terminal to ask on)")
        if not click.confirm(f"Write {path}?", default=False):
            raise ConfigError("not written")
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    partial.write_text(after)
    os.replace(partial, path)
    click.echo(f"wrote {path}")
