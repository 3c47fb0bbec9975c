"""``claude-bottle logs`` as a table: time, decision, method, host, path, rule, reason, and under a request
to an MCP server one line per JSON-RPC message in it (its own audit line); colours on a terminal.

Plain formatting: the columns are few and the widths fixed, so no table library is needed. Colours are ANSI
escapes, only when the output is a terminal (and ``NO_COLOR`` is unset). Audit fields come from the gate,
which writes what a bottle sent (hosts, paths): control characters are shown escaped, never emitted.
"""

from __future__ import annotations

from typing import Any

from claude_bottle.display import printable
from claude_bottle.records import current

COLUMNS = (("TIME", 12), ("DECISION", 10), ("METHOD", 7), ("HOST", 32), ("PATH", 28), ("RULE", 20))
_COLOURS = {"allow": "32", "would_deny": "33", "deny": "31", "error": "35", "ask": "36"}


def decision(entry: dict[str, Any]) -> str:
    """``allow``, ``deny``, ``error``, ``would_deny`` for what learn mode let through, or ``ask`` for a question
    ask mode asked (its answer's line is an ``allow`` or ``deny`` whose method names the answer)."""
    return "would_deny" if entry.get("would_deny") else str(entry.get("decision", ""))


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def header() -> str:
    return " ".join(f"{name:{width}}" for name, width in COLUMNS) + " REASON"


def row(entry: dict[str, Any], colour: bool) -> str:
    """One audit line as a row; the reason last, whole. A JSON-RPC message's line (listener ``mcp``) is
    indented under its request's row, which the gate wrote just before it."""
    verdict = decision(entry)
    if entry.get("listener") == "mcp":
        text = call(entry)
    else:
        time = str(entry.get("time", ""))[11:23]
        cells = [time, verdict, str(entry.get("method", "")), str(entry.get("target", "")),
                 str(entry.get("path", "")), str(entry.get("rule", ""))]
        text = " ".join(f"{_cut(printable(cell), width):{width}}"
                        for cell, (_, width) in zip(cells, COLUMNS, strict=True))
        text += " " + printable(str(entry.get("reason", "")))
    code = _COLOURS.get(verdict)
    return f"\x1b[{code}m{text}\x1b[0m" if colour and code else text


def call(entry: dict[str, Any]) -> str:
    """A JSON-RPC message's line: server, method, the tool it calls, its decision and, if refused, why."""
    tool = f" {printable(str(entry['tool']))}" if entry.get("tool") else ""
    why = f": {printable(str(entry.get('reason', '')))}" if entry.get("decision") != "allow" else ""
    return (f"  mcp {printable(str(entry.get('server', '')))}: {printable(str(entry.get('method', '')))}{tool} "
            f"{printable(str(entry.get('decision', '')))}{why}")


def offer(entry: dict[str, Any], agent: str) -> str | None:
    """For a destination refused because the allowlist lacks it, the command that allows it while the bottle
    runs (None for any other line)."""
    entry = current(entry)
    if entry.get("listener") != "proxy" or entry.get("decision") != "deny" or not entry.get("unlisted"):
        return None
    target = str(entry.get("target", ""))
    host, _, port = target.rpartition(":")
    where = host if port in ("443", "80") else target
    return f"  -> to allow it now: claude-bottle allow {agent} {printable(where)} (add --save to keep it)"
