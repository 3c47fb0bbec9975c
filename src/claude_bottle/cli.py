"""The command line: parse, dispatch to ``commands/``, and turn a BottleError into its one message.

Each command here holds only its options and help; its logic is a function in ``claude_bottle.commands``,
imported when the command runs, so that ``--help`` and the gate (no Docker SDK in its image) load little.
``main`` is the only place a BottleError becomes a message and an exit code.
"""

from __future__ import annotations

import itertools
import sys
import traceback
from typing import Any

import click

from claude_bottle import __version__
from claude_bottle.commands.gate import GateCommand
from claude_bottle.errors import EXIT_FAILURE, BottleError

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


@click.group(context_settings=CONTEXT)
@click.version_option(__version__, prog_name="claude-bottle")
@click.option("--debug", is_flag=True, help="Show tracebacks for errors.")
@click.pass_context
def cli(ctx: click.Context, debug: bool) -> None:
    """Run Claude Code where it can neither read your credential nor reach what you did not allow."""
    ctx.obj = {"debug": debug}


@cli.command(cls=GateCommand, context_settings=CONTEXT)
def gate(**options: Any) -> None:
    """Run the gate: hold the credential, forward API calls, filter egress.

    The token is read once from --token-file and kept in memory only. Clients never see it: their own
    credentials are stripped and the real one is added toward the upstream. The gate makes a CA of its own
    at start, limited to the allowed hosts; it prints the CA's certificate (and --ca-cert-out writes it).
    """
    from claude_bottle.commands.gate import run_gate

    run_gate(options)


@cli.command("stub-upstream", context_settings=CONTEXT)
@click.option("--listen", default="127.0.0.1:0", show_default=True, metavar="HOST:PORT")
@click.option("--text", default=None, help="The answer text.")
@click.option("--log", is_flag=True, help="Print each request (with its headers) as a JSON line.")
@click.option("--tls", "tls_file", default=None, metavar="PATH", type=click.Path(dir_okay=False),
              help="Serve HTTPS with the certificate chain and private key in this PEM file.")
def stub_upstream(listen: str, text: str | None, log: bool, tls_file: str | None) -> None:
    """Serve a stand-in for the Anthropic Messages API (for tests, benchmarks and verify).

    It answers /v1/messages with a fixed text, streaming or not, and spends no tokens.
    """
    from claude_bottle.commands.gate import run_stub_upstream

    run_stub_upstream(listen, text, log, tls_file)


class _AfterDoubleDash(click.Command):
    """Everything after the first ``--`` is the command to run, whatever it looks like; click would take its
    first word as the optional AGENT."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if "--" in args:
            ctx.meta["command"] = args[args.index("--") + 1:]
            args = args[:args.index("--")]
        return super().parse_args(ctx, args)


class _ClaudeArgs(_AfterDoubleDash):
    """A command that runs Claude Code: what follows ``--`` is Claude Code's own arguments."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except click.NoSuchOption as exc:
            raise click.UsageError(f"no such option {exc.option_name}: Claude Code's own options go after --, as "
                                   f"in claude-bottle {ctx.info_name} [AGENT] [OPTIONS] -- {exc.option_name} ...",
                                   ctx) from None

    def collect_usage_pieces(self, ctx: click.Context) -> list[str]:
        return [*super().collect_usage_pieces(ctx), "[-- CLAUDE_ARGS...]"]


# ---- the bottle -------------------------------------------------------------------------------------------

_agent_argument = click.argument("agent", required=False)
_workspace_option = click.option("--workspace", metavar="DIR", help="Mount DIR at /workspace (default: here).")
_upstream_option = click.option("--upstream", metavar="URL", default=None,
                                help="Advanced: point the gate at another Anthropic-compatible API.")
_runtime_option = click.option(
    "--runtime", metavar="NAME", default=None,
    help="The bottle's OCI runtime, e.g. runsc (gVisor), instead of the agent's (default: the engine's).")
_learn_option = click.option(
    "--learn", is_flag=True,
    help="Learn mode: let destinations outside the allowlist through and record them as would_deny (the address "
         "guard, credential hosts and DLP still apply); then `claude-bottle policy suggest`.")
_ask_option = click.option(
    "--ask", is_flag=True,
    help="Ask mode: hold a request to a destination outside the allowlist until you answer (`claude-bottle "
         "approve` in another terminal, a notification, or the agent's ask_command); unanswered within the agent's "
         "ask_timeout (default 60 s), it is refused. Also the agent key ask = true.")
_upstream_proxy_option = click.option(
    "--upstream-proxy", metavar="URL", default=None,
    help="The HTTP proxy the gate connects out through, http://[USER:PASSWORD@]HOST[:PORT], or 'none' (default: "
         "the agent's upstream_proxy, else $HTTPS_PROXY / $HTTP_PROXY, with $NO_PROXY).")
_upstream_network_option = click.option(
    "--upstream-network", multiple=True, metavar="NETWORK", hidden=True,
    help="Join the gate to this Docker network, to reach an upstream running there.")


@cli.command(cls=_ClaudeArgs, context_settings=CONTEXT)
@_agent_argument
@_workspace_option
@_upstream_option
@_upstream_proxy_option
@_upstream_network_option
@_runtime_option
@_learn_option
@_ask_option
@click.option("--keep", is_flag=True, help="Keep the stopped containers and networks for inspection.")
@click.pass_context
def start(ctx: click.Context, agent: str | None, workspace: str | None, upstream: str | None,
          upstream_proxy: str | None, upstream_network: tuple[str, ...], runtime: str | None, learn: bool,
          ask: bool, keep: bool) -> None:
    """Start Claude Code interactively in a bottle, in this terminal: claude-bottle start [AGENT] [OPTIONS]
    [-- CLAUDE_ARGS...], e.g. `-- --continue` or `-- --resume ID` (sessions are kept per agent and workspace).

    AGENT names a config in the user's agents folder; without it the project's .claude-bottle.toml is used,
    or the defaults. On exit or Ctrl-C everything of the run is removed (unless --keep); killed outright,
    its gate stops and its run is removed within seconds. A gate that stops during the run ends it (exit 4).
    """
    from claude_bottle.commands import start as command

    claude_args = tuple(ctx.meta.get("command", ()))
    sys.exit(command.start(agent, workspace, upstream, upstream_network, runtime, learn, keep, claude_args,
                           upstream_proxy, ask))


@cli.command(cls=_ClaudeArgs, context_settings=CONTEXT)
@_agent_argument
@click.option("-p", "--prompt", help="The prompt for claude -p (default: read from standard input).")
@_workspace_option
@_upstream_option
@_upstream_proxy_option
@_upstream_network_option
@_runtime_option
@_learn_option
@_ask_option
@click.pass_context
def run(ctx: click.Context, agent: str | None, prompt: str | None, workspace: str | None, upstream: str | None,
        upstream_proxy: str | None, upstream_network: tuple[str, ...], runtime: str | None, learn: bool,
        ask: bool) -> None:
    """Run Claude Code headless (claude -p) in a bottle: claude-bottle run [AGENT] [-p PROMPT] [OPTIONS]
    [-- CLAUDE_ARGS...], e.g. `-- --output-format stream-json --verbose` or `-- --resume ID`.

    Standard input goes to Claude Code (the prompt, without -p), its output and errors come back as they are,
    and the command exits with its code (4 when the gate stops during the run). The steps of the start are
    shown on standard error when it is a terminal.
    """
    from claude_bottle.commands import start as command

    if prompt is None and command.input_is_terminal():
        raise click.UsageError("give the prompt: -p PROMPT, or on standard input (echo PROMPT | claude-bottle "
                               "run)", ctx)
    claude_args = tuple(ctx.meta.get("command", ()))
    sys.exit(command.run(agent, prompt, workspace, upstream, upstream_network, runtime, learn, claude_args,
                         upstream_proxy, ask))


class _Verbatim(click.Command):
    """Every argument is Claude Code's, ``--``, ``--help`` and all."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        ctx.meta["command"] = list(args)
        return super().parse_args(ctx, [])

    def collect_usage_pieces(self, ctx: click.Context) -> list[str]:
        return ["[CLAUDE_ARGS]..."]


@cli.command("claude", cls=_Verbatim, context_settings=CONTEXT, add_help_option=False)
@click.pass_context
def claude(ctx: click.Context) -> None:
    """`claude CLAUDE_ARGS` in a bottle: a drop-in for the claude command (also `claude-bottle-claude`).

    For programs that run Claude Code (the Agent SDKs, scripts, CI): the current directory is the workspace,
    the agent is $CLAUDE_BOTTLE_AGENT (else the project's approved file, else the defaults). Standard input,
    output and error are Claude Code's, through a terminal when on one; signals are passed on; the exit code
    is Claude Code's (else 2, 3 or 4: claude-bottle's own errors). None of the caller's environment goes in.
    """
    from claude_bottle.commands import start as command

    sys.exit(command.claude(tuple(ctx.meta["command"])))


@cli.command(context_settings=CONTEXT)
@_agent_argument
@_workspace_option
def build(agent: str | None, workspace: str | None) -> None:
    """Build the bottle and gate images (only what changed), showing progress."""
    from claude_bottle.commands import build as command

    command.build(agent, workspace)


@cli.command("trust", context_settings=CONTEXT)
@click.argument("directory", required=False, metavar="[DIR]")
@click.option("--yes", is_flag=True, help="Approve what is shown without asking (review it first).")
def trust_(directory: str | None, yes: bool) -> None:
    """Review and approve a workspace (default: here) on the host.

    Shows its .claude-bottle.toml with the keys it sets, and the files that can run code on your machine which
    bottles changed. Once you confirm (a prompt on a terminal, else --yes), `start` and `run` use exactly this
    project file, and the changes count as reviewed.
    """
    from claude_bottle.commands import trust as command

    command.review(directory, yes)


@cli.command(context_settings=CONTEXT)
@click.argument("name", required=False)
@click.option("--stdin", "from_stdin", is_flag=True, help="Read the token from standard input.")
def login(name: str | None, from_stdin: bool) -> None:
    """Store your token (from `claude setup-token`, or an API key) in the OS keyring or a 0600 file.

    With NAME, store the value of the credential route [credentials.NAME] instead (docs/credentials.md); with
    `proxy`, the upstream proxy's password, for a proxy URL with a user and no password (docs/upstream-proxy.md)."""
    from claude_bottle.commands import login as command

    command.login(name, from_stdin)


@cli.command(context_settings=CONTEXT)
@click.argument("name", required=False)
def logout(name: str | None) -> None:
    """Forget the stored token (with NAME: the stored value of credential NAME; `proxy`: the proxy's password)."""
    from claude_bottle.commands import login as command

    command.logout(name)


@cli.command("ls", context_settings=CONTEXT)
@click.option("--json", "as_json", is_flag=True, help="One JSON object per run.")
def list_runs(as_json: bool) -> None:
    """List running bottles."""
    from claude_bottle.commands import ls as command

    command.list_runs(as_json)


@cli.command(context_settings=CONTEXT)
@_agent_argument
@click.option("--all", "stop_all", is_flag=True,
              help="Stop every bottle, and remove the internal networks kept for later runs.")
def stop(agent: str | None, stop_all: bool) -> None:
    """Stop bottles and remove their containers (their Claude state volume stays); on Docker their internal
    networks are kept for later runs, until --all."""
    from claude_bottle.commands import stop as command

    command.stop(agent, stop_all)


@cli.command(context_settings=CONTEXT)
@_agent_argument
@click.option("--workspace", metavar="DIR", help="The workspace whose Claude state to remove (default: here).")
@click.option("--yes", is_flag=True, help="Remove it without asking.")
def forget(agent: str | None, workspace: str | None, yes: bool) -> None:
    """Remove an agent's Claude state for a workspace (without AGENT: every agent's), so its next run there
    starts afresh: ~/.claude in its bottles, with their conversations, history and Claude Code's memory, and
    anything a run left there for later runs. Refused while a bottle of it runs there."""
    from claude_bottle.commands import forget as command

    command.forget(agent, workspace, yes)


@cli.command(context_settings=CONTEXT)
@_agent_argument
@click.option("--workspace", metavar="DIR", help="The workspace whose bottle or last run to show (default: here).")
@click.option("--run", "run_id", metavar="ID", help="This run, running or recorded (see --runs).")
@click.option("--runs", "list_recorded", is_flag=True, help="List the recorded runs, oldest first.")
@click.option("--egress", is_flag=True, help="Only the proxy's decisions (not the API route's).")
@click.option("--follow", "-f", is_flag=True,
              help="Keep printing new decisions (a running bottle only), with the command that allows each "
                   "destination the allowlist refused.")
@click.option("--json", "as_json", is_flag=True, help="The raw JSON audit lines.")
def logs(agent: str | None, workspace: str | None, run_id: str | None, list_recorded: bool, egress: bool,
         follow: bool, as_json: bool) -> None:
    """Show the gate's decisions: what was forwarded, what was refused and why.

    Without options: the running bottle of this workspace, else its last run (every run's audit is kept on
    the host when it ends). AGENT: that agent's running bottle, else its last run. --runs lists what is kept.
    A table (time, decision, method, host, path, rule, reason), coloured on a terminal; would_deny marks what
    learn mode let through.
    """
    from claude_bottle.commands import logs as command

    command.logs(agent, workspace, run_id, list_recorded, egress, follow, as_json)


def _agent_and_entry(words: tuple[str, ...], ctx: click.Context) -> tuple[str | None, str]:
    """``[AGENT] HOST[:PORT]`` split into the optional agent and the entry."""
    if len(words) not in (1, 2):
        raise click.UsageError(f"give HOST[:PORT], optionally after the AGENT: claude-bottle {ctx.info_name} "
                               "[AGENT] HOST", ctx)
    return (words[0] if len(words) == 2 else None), words[-1]


@cli.command(context_settings=CONTEXT)
@click.argument("words", nargs=-1, metavar="[AGENT] HOST[:PORT]")
@click.option("--workspace", metavar="DIR", help="Prefer the bottle of this workspace (default: here).")
@click.option("--save", is_flag=True, help="Also add it to the agent's file (shows the change first).")
@click.option("--yes", is_flag=True, help="With --save: write without asking.")
@click.pass_context
def allow(ctx: click.Context, words: tuple[str, ...], workspace: str | None, save: bool, yes: bool) -> None:
    """Allow a destination in a running bottle, at once, without restarting it.

    HOST[:PORT] as in an agent's allow list (*.example.com, host:8443). The change reaches the gate through
    the container engine (a channel the bottle cannot reach) and the bottle's /etc/claude-bottle/policy.toml.
    """
    from claude_bottle.commands import allow as command

    agent, entry = _agent_and_entry(words, ctx)
    command.allow(agent, entry, workspace, save, yes)


@cli.command(context_settings=CONTEXT)
@click.argument("words", nargs=-1, metavar="[AGENT] HOST[:PORT]")
@click.option("--workspace", metavar="DIR", help="Prefer the bottle of this workspace (default: here).")
@click.option("--save", is_flag=True, help="Also remove it from the agent's file (shows the change first).")
@click.option("--yes", is_flag=True, help="With --save: write without asking.")
@click.pass_context
def deny(ctx: click.Context, words: tuple[str, ...], workspace: str | None, save: bool, yes: bool) -> None:
    """Refuse a destination in a running bottle from now on (even in learn mode, even under a wider pattern);
    tunnels already open stay."""
    from claude_bottle.commands import allow as command

    agent, entry = _agent_and_entry(words, ctx)
    command.deny(agent, entry, workspace, save, yes)


@cli.command(context_settings=CONTEXT)
@_agent_argument
@click.option("--workspace", metavar="DIR", help="Prefer the bottle of this workspace (default: here).")
@click.option("--run", "run_id", metavar="ID",
              help="Only this run's questions (as its notices name it; see `ls`). Default: every run of the agent "
                   "on the workspace, those that start meanwhile included.")
@click.option("--yes", is_flag=True, help="Write the agent's file for an allow-always without asking.")
def approve(agent: str | None, workspace: str | None, run_id: str | None, yes: bool) -> None:
    """Answer running bottles' held requests (ask mode), live: a allow once, A allow always (also in the
    agent's file, the change shown first), d deny once, D deny always, j/k select, q quit. Each request is one
    run's, and answered in that run.

    Without a terminal, a line mode: each request printed as `asked ID RUN HOST:PORT ...`, answers read as
    `ANSWER ID` lines, or `ANSWER ID RUN` where runs share an ID (a, A, d, D or allow-once, allow-always,
    deny-once, deny-always).
    """
    from claude_bottle.commands import approve as command

    command.approve(agent, workspace, yes, run_id)


@cli.group(context_settings=CONTEXT)
def policy() -> None:
    """Allowlists from what runs did."""


@policy.command("suggest", context_settings=CONTEXT)
@_agent_argument
@click.option("--workspace", metavar="DIR", help="The workspace whose bottle or last run to read (default: here).")
@click.option("--run", "run_id", metavar="ID", help="This run, running or recorded (see `logs --runs`).")
@click.option("--write", "write_to", metavar="AGENT", help="Add what the agent does not allow yet to its file.")
@click.option("--yes", is_flag=True, help="With --write: write without asking.")
def policy_suggest(agent: str | None, workspace: str | None, run_id: str | None, write_to: str | None,
                   yes: bool) -> None:
    """Print an allowlist (agent-file TOML) from a run's audit: its hosts, with method and path rules where
    the gate read the requests. Run with --learn first to let everything the task needs through."""
    from claude_bottle.commands import policy as command

    command.suggest_allowlist(agent, workspace, run_id, write_to, yes)


@cli.command("exec", cls=_AfterDoubleDash, context_settings=CONTEXT)
@_agent_argument
@click.option("--workspace", metavar="DIR", help="Prefer the bottle of this workspace (default: here).")
@click.pass_context
def exec_(ctx: click.Context, agent: str | None, workspace: str | None) -> None:
    """Run a command inside a running bottle, as its user: claude-bottle exec [AGENT] -- CMD...

    Without AGENT: the bottle of this workspace, or the only one running.
    """
    from claude_bottle.commands.exec import exec_in

    command = ctx.meta.get("command")
    if command is None:
        raise click.UsageError("put the command after --: claude-bottle exec [AGENT] -- CMD...", ctx)
    if not command:
        raise click.UsageError("no command after --: claude-bottle exec [AGENT] -- CMD...", ctx)
    sys.exit(exec_in(agent, workspace, command))


@cli.command(context_settings=CONTEXT)
@_agent_argument
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON.")
@_runtime_option
@_upstream_proxy_option
def verify(agent: str | None, as_json: bool, runtime: str | None, upstream_proxy: str | None) -> None:
    """Prove the isolation: attack a bottle of AGENT from inside and report what got through.

    The bottle is the agent's own, with a throwaway credential, a stub Messages API as its upstream (no
    Anthropic account needed, no tokens spent) and a scratch workspace. Exits 1 if any attack succeeded.
    """
    from claude_bottle.commands import verify as command

    sys.exit(command.verify(agent, as_json, runtime, upstream_proxy))


@cli.command(context_settings=CONTEXT)
def doctor() -> None:
    """Check the container engine (Docker or Podman), its OCI runtimes, the token and the images."""
    from claude_bottle.commands import doctor as command

    sys.exit(command.doctor())


def main(args: list[str] | None = None) -> None:
    """Entry point: run the command; a BottleError becomes one line on stderr and its exit code."""
    args = sys.argv[1:] if args is None else args
    debug = "--debug" in itertools.takewhile(lambda arg: arg.startswith("-"), args)  # claude-bottle's, not Claude's
    try:
        cli.main(args, prog_name="claude-bottle", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except BottleError as exc:
        if debug:
            traceback.print_exc()
        from claude_bottle.display import printable_lines

        # A message may quote what a bottle wrote (a project file's key, a name in the workspace).
        click.echo(f"claude-bottle: error: {printable_lines(str(exc))}", err=True)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception:
        traceback.print_exc()
        click.echo("claude-bottle: internal error (above); please report it", err=True)
        sys.exit(EXIT_FAILURE)


def claude_main() -> None:
    """Entry point of ``claude-bottle-claude``: ``claude-bottle claude ARGS``, for programs that take a path
    to a claude executable."""
    main(["claude", *sys.argv[1:]])
