"""``logs``: the gate's decisions, of a running bottle or a recorded run; the audit ``policy suggest`` reads."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import sys
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import click

from claude_bottle.errors import ConfigError

if TYPE_CHECKING:
    from claude_bottle.records import RunRecord


def print_runs(found: list[RunRecord], as_json: bool) -> None:
    """Print the recorded runs as a table, or as JSON."""
    if as_json:
        click.echo(json.dumps([dataclasses.asdict(r) for r in found], indent=2))
    elif not found:
        click.echo("no runs recorded yet: a run's audit is kept once it ends")
    else:
        from claude_bottle.display import printable

        click.echo(f"{'RUN':24} {'AGENT':16} {'STARTED':20} {'ENDED':20} {'LINES':>7} WORKSPACE")
        for r in found:  # a workspace's folder may be one a bottle made, and named
            click.echo(f"{r.run:24} {r.agent:16} {r.started:20} {r.ended:20} {r.lines:7} {printable(r.workspace)}")


def read_audit(agent: str | None, workspace: str | None, run_id: str | None, follow: bool
               ) -> tuple[Iterator[dict[str, Any]], str, str]:
    """The audit entries ``logs`` and ``policy suggest`` read: a running bottle's (this workspace's, or
    ``agent``'s, or run ``run_id``), else the last recorded run of those. Also the run's agent and id."""
    from pathlib import Path

    from claude_bottle import records
    from claude_bottle.errors import DockerError
    from claude_bottle.runtime.engines import open_engine
    from claude_bottle.runtime.listing import running_run, runs
    from claude_bottle.runtime.names import RunNames

    # with AGENT and no --workspace, any workspace of that agent's
    place = None if agent and workspace is None else Path(workspace or os.getcwd()).expanduser().resolve()
    live, engine = None, None
    with contextlib.suppress(DockerError):  # no engine: no running bottle, the recorded runs still show
        engine = open_engine()
        live = (run_id if any(r["run"] == run_id for r in runs(engine)) else None) if run_id else \
            running_run(engine, agent, place)
    if live and engine is not None:
        gate = engine.container(RunNames(live).gate)
        if gate is None:
            raise DockerError(f"run {live} has no gate container; remove it with `claude-bottle stop`")
        # Whole lines: the engine hands a long one (a bottle chooses how long) over in pieces.
        lines: Iterator[str] = (line.decode("utf-8", "replace") for line in records.whole_lines(
            engine.logs(gate.name, stdout=False, stderr=True, follow=follow)))
        owner, source = RunNames.from_labels(gate.labels).agent or agent or "", live
    elif follow:
        raise ConfigError("--follow shows a running bottle's decisions as they come, and none is running here; "
                          "without --follow, the last run's are shown")
    else:
        record = records.find(run_id) if run_id else records.latest(agent, place)
        lines, owner, source = records.audit_lines(record), record.agent, record.run
    return with_a_cut_told(audit_entries(lines), source), owner, source


def with_a_cut_told(entries: Iterable[dict[str, Any]], run: str) -> Iterator[dict[str, Any]]:
    """``entries``, after a word on standard error when the first numbered line (``seq``) is not the run's
    first: the engine and the host keep a run's newest audit lines only, and a bottle chooses how many it
    makes, so one may send requests in the thousands to push an earlier one out."""
    told = False
    for entry in entries:
        seq = entry.get("seq")
        if not told and type(seq) is int:
            told = True
            if seq > 1:
                click.echo(f"run {run}: its first {seq - 1} audit lines are not kept: only a run's newest are "
                           f"(docs/gate.md#audit-log), and its bottle made more, perhaps to push earlier ones "
                           f"out; what follows begins at line {seq}", err=True)
        yield entry


def audit_entries(lines: Iterable[str]) -> Iterator[dict[str, Any]]:
    """The audit lines' entries. A line that is not a JSON object is skipped: the engine keeps a long line in
    pieces and drops its oldest entries past its cap, so a log may begin with a line's later piece, which a
    bottle that requested a path of braces has begin like an audit line."""
    for line in lines:
        text = line.strip()
        if not text.startswith("{"):
            continue
        try:
            entry = json.loads(text)
        except (ValueError, RecursionError):
            continue
        if isinstance(entry, dict):
            yield entry


def logs(agent: str | None, workspace: str | None, run_id: str | None, list_recorded: bool, egress: bool,
         follow: bool, as_json: bool) -> None:
    """Print the chosen run's decisions as a table (coloured on a terminal) or JSON lines; with
    ``list_recorded``, the recorded runs instead."""
    from claude_bottle import logview, records

    if list_recorded:
        print_runs(records.recorded(), as_json)
        return
    entries, owner, _ = read_audit(agent, workspace, run_id, follow)
    colour = sys.stdout.isatty() and "NO_COLOR" not in os.environ
    shown = 0
    for entry in entries:
        # ask: the proxy's questions and answers; mcp: the JSON-RPC messages in its requests to MCP servers
        if egress and entry.get("listener") not in ("proxy", "ask", "mcp"):
            continue
        if as_json:
            # ASCII: a bottle's words (an MCP method, a tool's name) hold no control character for the terminal
            click.echo(json.dumps(entry))
            continue
        if not shown:
            click.echo(logview.header())
        shown += 1
        click.echo(logview.row(entry, colour))
        offer = logview.offer(entry, owner) if follow else None
        if offer:
            click.echo(offer)
