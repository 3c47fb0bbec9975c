"""``start`` (in this terminal), ``run`` (headless) and ``claude`` (the drop-in): Claude Code in a bottle, with
Claude Code's own arguments."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

from claude_bottle.commands.common import progress
from claude_bottle.errors import ConfigError

if TYPE_CHECKING:
    from claude_bottle.launch import Launch, Progress

# The drop-in takes no options of its own (its arguments are Claude Code's): these stand in for them.
AGENT_VARIABLE = "CLAUDE_BOTTLE_AGENT"
UPSTREAM_VARIABLE = "CLAUDE_BOTTLE_UPSTREAM"
UPSTREAM_NETWORK_VARIABLE = "CLAUDE_BOTTLE_UPSTREAM_NETWORK"  # comma-separated, like --upstream-network


def prepare(agent_name: str | None, workspace: str | None, upstream: str | None,
            upstream_network: tuple[str, ...], runtime: str | None = None, learn: bool = False,
            upstream_proxy: str | None = None, ask: bool = False) -> Launch:
    """Everything a run needs before anything starts: the agent (with --runtime), the workspace, the token,
    the agent's credential routes (their commands and its ``ask_command`` refused where a bottle writes them)
    and the gate's upstream proxy (--upstream-proxy, else the agent's, else the host's proxy variables); a bad
    --upstream or proxy fails here. Ask mode is on with ``ask`` (--ask) or the agent's ``ask``; --learn with
    --ask is refused, and --learn turns the agent's ``ask`` off for the run."""
    from claude_bottle import tokens
    from claude_bottle.agent.load import load_agent
    from claude_bottle.agent.upstream_proxy import choose_upstream_proxy
    from claude_bottle.commands.common import with_runtime
    from claude_bottle.gate.settings import parse_upstream
    from claude_bottle.host_inputs import check_host_commands
    from claude_bottle.launch import Launch, workspace_of

    path = workspace_of(workspace)
    agent = with_runtime(load_agent(agent_name, path), runtime)
    check_host_commands(agent, path)  # before a credential's command runs
    parsed_upstream = parse_upstream(upstream) if upstream is not None else None
    credential, _ = tokens.find()
    if learn and ask:
        raise ConfigError("--learn and --ask: choose one (learn mode lets unlisted destinations through, ask mode "
                          "holds them for your answer)")
    if learn and agent.ask:
        progress(f"learn mode: agent {agent.name}'s ask = true is off for this run")
    ask = (ask or agent.ask) and not learn
    if learn:
        progress("learn mode: destinations outside the allowlist are let through and recorded as would_deny; "
                 "`claude-bottle policy suggest` turns the run into an allowlist")
    proxy = choose_upstream_proxy(upstream_proxy, agent.upstream_proxy, os.environ)
    return Launch(agent, path, credential, parsed_upstream, upstream_network, learn=learn, ask=ask,
                  routes=tokens.routes_for(agent.credentials), upstream_proxy=proxy)


def input_is_terminal() -> bool:
    return sys.stdin.isatty()


def steps() -> Progress:
    """Where a run's steps go: standard error on a terminal; nowhere else (scripts, CI and SDKs read standard
    error as Claude Code's). Warnings and notices are ``progress``, always shown."""
    return progress if sys.stderr.isatty() else lambda message: None


def start(agent: str | None, workspace: str | None, upstream: str | None, upstream_network: tuple[str, ...],
          runtime: str | None, learn: bool, keep: bool, claude_args: tuple[str, ...] = (),
          upstream_proxy: str | None = None, ask: bool = False) -> int:
    """Claude Code in this terminal (``claude CLAUDE_ARGS``); its exit code."""
    from claude_bottle.launch import claude_command, run_in_terminal

    launch = prepare(agent, workspace, upstream, upstream_network, runtime, learn, upstream_proxy, ask)
    status = run_in_terminal(launch, claude_command(launch.agent, *claude_args), steps(), keep, notice=progress)
    # Claude Code's own "claude --resume ID" hint names a command that would run outside the bottle.
    steps()(f"to go on with a conversation of this workspace in a bottle: claude-bottle start {agent or ''}"
            f"{' ' if agent else ''}-- --continue (the latest) or -- --resume ID")
    return status


def run(agent: str | None, prompt: str | None, workspace: str | None, upstream: str | None,
        upstream_network: tuple[str, ...], runtime: str | None, learn: bool, claude_args: tuple[str, ...] = (),
        upstream_proxy: str | None = None, ask: bool = False) -> int:
    """``claude -p [PROMPT] CLAUDE_ARGS`` headless: standard input (the prompt, without PROMPT) in, Claude
    Code's output out; its exit code."""
    from claude_bottle.launch import claude_command, run_attached

    launch = prepare(agent, workspace, upstream, upstream_network, runtime, learn, upstream_proxy, ask)
    prompt_args = ("-p",) if prompt is None else ("-p", prompt)
    return run_attached(launch, claude_command(launch.agent, *prompt_args, *claude_args), steps(), notice=progress)


def claude(args: tuple[str, ...]) -> int:
    """``claude ARGS`` as a bottle: the current directory the workspace, the agent $CLAUDE_BOTTLE_AGENT (else
    the project's approved file, else the defaults); through a terminal when standard input and output are
    one, else the standard streams byte for byte. Nothing of the caller's environment goes in."""
    from claude_bottle.launch import claude_command, run_attached, run_in_terminal

    networks = tuple(n.strip() for n in os.environ.get(UPSTREAM_NETWORK_VARIABLE, "").split(",") if n.strip())
    launch = prepare(os.environ.get(AGENT_VARIABLE) or None, None, os.environ.get(UPSTREAM_VARIABLE) or None,
                     networks)
    command = claude_command(launch.agent, *args)
    if sys.stdin.isatty() and sys.stdout.isatty():
        return run_in_terminal(launch, command, steps(), notice=progress)
    return run_attached(launch, command, steps(), notice=progress)
