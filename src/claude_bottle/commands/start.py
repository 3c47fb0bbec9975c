"""``start`` (interactive) and ``run`` (headless): launch Claude Code in a bottle."""

from __future__ import annotations

from typing import TYPE_CHECKING

from claude_bottle.commands.common import progress, with_runtime

if TYPE_CHECKING:
    from claude_bottle.launch import Launch


def prepare(agent_name: str | None, workspace: str | None, upstream: str | None,
            upstream_network: tuple[str, ...], runtime: str | None = None, learn: bool = False) -> Launch:
    """Everything a run needs before anything starts: the agent (with --runtime), the workspace, the token
    and the agent's credential routes; a bad --upstream fails here."""
    from claude_bottle import tokens
    from claude_bottle.agent.load import load_agent
    from claude_bottle.gate.settings import parse_upstream
    from claude_bottle.launch import Launch, workspace_of

    path = workspace_of(workspace)
    agent = with_runtime(load_agent(agent_name, path), runtime)
    parsed_upstream = parse_upstream(upstream) if upstream is not None else None
    credential, _ = tokens.find()
    if learn:
        progress("learn mode: destinations outside the allowlist are let through and recorded as would_deny; "
                 "`claude-bottle policy suggest` turns the run into an allowlist")
    return Launch(agent, path, credential, parsed_upstream, upstream_network, learn=learn,
                  routes=tokens.routes_for(agent.credentials))


def start(agent: str | None, workspace: str | None, upstream: str | None, upstream_network: tuple[str, ...],
          runtime: str | None, learn: bool, keep: bool) -> int:
    """Run Claude Code interactively in this terminal; its exit code."""
    from claude_bottle.launch import run_interactive

    return run_interactive(prepare(agent, workspace, upstream, upstream_network, runtime, learn), progress, keep)


def run(agent: str | None, prompt: str, workspace: str | None, upstream: str | None,
        upstream_network: tuple[str, ...], runtime: str | None, learn: bool) -> int:
    """Run ``claude -p prompt`` headless, its output on stdout; its exit code."""
    from claude_bottle.launch import run_headless

    return run_headless(prepare(agent, workspace, upstream, upstream_network, runtime, learn), prompt, progress)
