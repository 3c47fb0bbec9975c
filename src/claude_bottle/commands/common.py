"""What several commands share: progress lines and the --runtime override."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import click

from claude_bottle.errors import ConfigError

if TYPE_CHECKING:
    from claude_bottle.agent.schema import AgentConfig


def progress(message: str) -> None:
    """Report a step of a long command on stderr, leaving stdout to the command's output. Its control characters
    are shown escaped: a step names the workspace, whose folder a bottle may have made (the drop-in started in a
    subfolder an Agent SDK's caller took from the tree), and notices name what bottles left."""
    from claude_bottle.display import printable_lines

    click.echo(printable_lines(message), err=True)


def with_runtime(agent: AgentConfig, runtime: str | None) -> AgentConfig:
    """The agent, with --runtime (checked like the config key) in place of its own runtime."""
    from claude_bottle.agent.schema import check_runtime_name

    if runtime is None:
        return agent
    check_runtime_name(runtime, lambda key, problem: ConfigError(f"--runtime: {problem}"))
    return dataclasses.replace(agent, runtime=runtime)
