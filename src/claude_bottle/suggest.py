"""An allowlist learned from a run's audit: ``claude-bottle policy suggest`` and ``--write``.

Pure: audit lines in, a ``Suggestion`` out, rendered as TOML an agent file takes. What a run reached through
the proxy becomes an entry per destination, grouped by how the gate judged it: let through by learn mode only
(``would_deny``), already allowed, or refused (listed as comments, never suggested). Where the gate read the
requests (terminated TLS, plain HTTP), the entry carries the methods and paths seen as ``allow`` rules, so a
strict run passes those and nothing else; more than ``MAX_PATHS`` paths for one method on a host become one
rule per first path segment (``GET /simple/**``). A tunnel the gate did not read gets a host entry only.

A remote MCP server's calls (the ``mcp`` lines, one per JSON-RPC message) are counted per server and tool
and shown as the ``tools`` list to set in its ``[mcp.servers.NAME]`` table, as a comment (``--write`` does
not add them: the table's url lives in the agent file already); a call refused by a rule is listed as
refused, one that was not sent for another's refusal is neither.

A destination a run in ask mode was let reach by an answer (the request's line carries ``answer``
allow-once or allow-always) is suggested in a group of its own, with the number of requests approved.

It reads the lines' fields (``listener``, ``decision``, ``status``, ``would_deny``, ``answer``, ``tunnel``,
``method``, ``path``, ``server``, ``tool``, ``rule``), never the words of a reason: a refused destination's
reason is only shown, as a comment. A line from an earlier gate is first given today's fields
(``records.current``).
"""

from __future__ import annotations

import difflib
import itertools
import json
import re
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

from claude_bottle.display import printable
from claude_bottle.policy.decide import allow_entry
from claude_bottle.policy.hosts import Allowlist, InvalidHost, Target, parse_authority
from claude_bottle.records import current

MAX_PATHS = 8  # distinct paths per method and host before they are grouped by their first segment
_PLAIN_SEGMENT = re.compile(r"[A-Za-z0-9\-._~!$&'()+,;=:@]+")


@dataclass
class Destination:
    """One host entry: how the run's requests to it were judged, and the requests the gate read."""

    entry: str  # the allowlist entry: host, with the port unless 443 or 80
    target: Target  # the first target seen for it
    would_deny: int = 0  # requests let through by learn mode only
    approved: int = 0  # requests let through by an answer in ask mode (allow-once, allow-always)
    allowed: int = 0  # requests the allowlist allowed
    requests: set[tuple[str, str]] = field(default_factory=set)  # (method, path) the gate read
    raw_tcp: bool = False  # its tunnels carried other bytes than TLS: allowed by allow_tcp, and needing it

    def rules(self) -> list[str]:
        """``allow`` rules for the requests read: exact paths, or one per first segment past MAX_PATHS."""
        by_method: dict[str, set[str]] = {}
        for method, path in self.requests:
            by_method.setdefault(method, set()).add(rule_path(path))
        rules: list[str] = []
        for method in sorted(by_method):
            paths = by_method[method]
            if len(paths) > MAX_PATHS:
                paths = {"/" + p.split("/")[1] + "/**" if p.count("/") > 1 else p for p in paths}
            rules.extend(f"{method} {path}" for path in sorted(paths))
        return rules


@dataclass
class Suggestion:
    destinations: dict[str, Destination] = field(default_factory=dict)  # by entry
    refused: dict[str, str] = field(default_factory=dict)  # target -> the first reason it was refused
    # MCP servers (the audit's ``mcp`` lines): server -> tool -> calls allowed, and the tools a rule refused
    mcp_tools: dict[str, dict[str, int]] = field(default_factory=dict)
    mcp_refused: dict[str, set[str]] = field(default_factory=dict)

    @property
    def learned(self) -> list[Destination]:
        return [d for d in self.destinations.values() if d.would_deny]

    @property
    def approved(self) -> list[Destination]:
        return [d for d in self.destinations.values() if d.approved and not d.would_deny]

    @property
    def known(self) -> list[Destination]:
        return [d for d in self.destinations.values() if not d.would_deny and not d.approved]


def rule_path(path: str) -> str:
    """A request path as a rule's path: decoded as the gate matches it; a segment a rule cannot spell (or a
    dot segment) becomes ``*``."""
    segments = [unquote(s) for s in path.split("?", 1)[0].split("/")[1:]]
    kept = [s if (_PLAIN_SEGMENT.fullmatch(s) and s not in (".", "..")) or (s == "" and i == len(segments) - 1)
            else "*"
            for i, s in enumerate(segments)]
    return "/" + "/".join(kept)


def suggest(lines: Iterable[dict[str, Any]]) -> Suggestion:
    """What the proxy's audit ``lines`` (parsed JSON) say the run needed."""
    found = Suggestion()
    for line in map(current, lines):
        if line.get("listener") == "mcp":
            _mcp_call(found, line)
            continue
        if line.get("listener") != "proxy" or line.get("target", "-") == "-":
            continue
        try:
            target = parse_authority(str(line["target"]))
        except (InvalidHost, KeyError):
            continue
        entry = allow_entry(target)
        if line.get("decision") == "deny":
            if entry not in found.destinations and line.get("status") == 403:
                found.refused.setdefault(str(line["target"]), str(line.get("reason", "")))
            continue
        destination = found.destinations.setdefault(entry, Destination(entry, target))
        found.refused.pop(str(line["target"]), None)
        if line.get("would_deny"):
            destination.would_deny += 1
        elif str(line.get("answer", "")).startswith("allow"):
            destination.approved += 1
        else:
            destination.allowed += 1
        destination.raw_tcp |= line.get("tunnel") == "raw_tcp"
        method, path = str(line.get("method", "")), line.get("path")
        if method != "CONNECT" and isinstance(path, str) and path.startswith("/"):
            destination.requests.add((method, path))
    return found


def _mcp_call(found: Suggestion, line: dict[str, Any]) -> None:
    """A ``tools/call`` line, counted per server and tool: allowed, or refused by a rule (a call not sent for
    another's refusal names no rule, and counts as neither)."""
    if line.get("method") != "tools/call":
        return
    server, tool = str(line.get("server", "")), str(line.get("tool", ""))
    if line.get("decision") == "allow":
        tools = found.mcp_tools.setdefault(server, {})
        tools[tool] = tools.get(tool, 0) + 1
    elif line.get("rule"):
        found.mcp_refused.setdefault(server, set()).add(tool)


def mcp_toml(found: Suggestion) -> str:
    """The MCP tools the run called, per server, as the ``tools`` key to set in its ``[mcp.servers.NAME]``
    table (a comment: the table's url is the agent's, and a project file keeps its own), and those refused."""
    if not found.mcp_tools and not found.mcp_refused:
        return ""
    parts = ["\n# ---- MCP tools the run called (set them as the server's tools to allow only those) ----\n"]
    for server in sorted(found.mcp_tools.keys() | found.mcp_refused.keys()):
        tools = found.mcp_tools.get(server, {})
        parts.append(f"# [mcp.servers.{printable(server)}]: {sum(tools.values())} call(s) allowed\n")
        if tools:
            parts.append(f"#   tools = {printable(_strings(sorted(tools)))}\n")
        if refused := found.mcp_refused.get(server):
            parts.append(f"#   refused, not suggested: {printable(', '.join(sorted(refused)))}\n")
    return "".join(parts)


def _strings(values: Iterable[str]) -> str:
    return "[" + ", ".join(json.dumps(v) for v in values) + "]"


def entry_toml(destination: Destination, comment: str) -> str:
    """One ``[[egress]]`` table: the host, and ``allow`` rules where the gate read its requests."""
    rules = destination.rules()
    text = f"# {comment}\n[[egress]]\nhost = {json.dumps(destination.entry)}\n"
    if rules:
        text += f"allow = {_strings(rules)}\n"
    return text


def host_table(entry: str, comment: str) -> str:
    """An ``[[egress]]`` table allowing ``entry`` (any method and path), to append to an agent file."""
    return f"\n# {comment}\n[[egress]]\nhost = {json.dumps(entry)}\n"


def explain(destination: Destination) -> str:
    seen = (f"{destination.would_deny} request(s) learn mode let through (a strict gate refuses them)"
            if destination.would_deny else
            f"{destination.approved} request(s) approved in ask mode" if destination.approved else
            f"{destination.allowed} request(s), already allowed")
    read = (f"; only the {len(destination.requests)} method and path(s) seen may pass" if destination.requests
            else "; tunnelled without the gate reading the requests: any method and path")
    return seen + read


def render(found: Suggestion, source: str) -> str:
    """The suggestion as agent-file TOML (without ``version``), grouped and explained in comments."""
    parts = [f"# Suggested by `claude-bottle policy suggest` from {source}. Review it before use: each entry\n"
             "# lets the bottle reach that host; the allow rules let only the requests seen there.\n"]
    if not found.destinations:
        parts.append("# No destination was reached through the proxy: the Anthropic API needs no entry.\n")
    raw = sorted(d.entry for d in found.destinations.values() if d.raw_tcp)
    if raw:
        parts.append("\n# Tunnels that carried other bytes than TLS (SSH and the like): allowed as raw TCP\n"
                     f"allow_tcp = {_strings(raw)}\n")
    for title, group in (("Let through by learn mode only", found.learned), ("Approved in ask mode", found.approved),
                         ("Already allowed", found.known)):
        tables = sorted((d for d in group if not d.raw_tcp), key=lambda d: d.entry)
        if tables:
            parts.append(f"\n# ---- {title} ----\n")
            parts.extend(entry_toml(d, explain(d)) for d in tables)
    parts.append(mcp_toml(found))
    if found.refused:
        parts.append("\n# ---- Refused, not suggested (allow them yourself if they are needed) ----\n")
        # a reason may quote what the bottle sent: no line break or control character leaves the comment
        parts.extend(f"#   {printable(target)}: {printable(reason)}\n"
                     for target, reason in sorted(found.refused.items()))
    return "".join(parts)


def additions(found: Suggestion, current: Allowlist, source: str) -> str:
    """The ``[[egress]]`` tables of ``found`` for destinations ``current`` does not already allow, to append
    to an agent file ("" when there are none). A destination that needs raw TCP is not among them: that is
    ``allow_tcp``, a top-level key, which the user adds."""
    new = [d for d in sorted(found.destinations.values(), key=lambda d: d.entry)
           if current.match(d.target) is None and not d.raw_tcp]
    if not new:
        return ""
    return f"\n# Added by `claude-bottle policy suggest --write` from {source}\n" + "".join(
        entry_toml(d, explain(d)) for d in new)


def diff(before: str, after: str, name: str) -> str:
    return "".join(difflib.unified_diff(before.splitlines(keepends=True), after.splitlines(keepends=True),
                                        f"{name} (now)", f"{name} (after)"))


def without_entry(text: str, entry: str) -> str:
    """An agent file's ``text`` without the allowlist entry ``entry``: out of the top-level ``allow`` list,
    and without the ``[[egress]]`` tables whose host it is (their rules with them). Everything else stays as
    written; the result is checked to mean exactly that (ValueError otherwise: the file is written in a way
    this does not edit, and the user edits it by hand)."""
    chunks: list[list[str]] = [[]]  # the top level, then one chunk per table, from its header line
    for line in text.splitlines(keepends=True):
        if _HEADER.match(line) and not line.lstrip().startswith("#"):
            chunks.append([])
        chunks[-1].append(line)
    for before_table, table in itertools.pairwise(chunks):  # comments right above a header belong to its table
        while before_table and before_table[-1].lstrip().startswith("#"):
            table.insert(0, before_table.pop())
    top, *tables = chunks
    kept = [t for t in tables if not _egress_for(t, entry)]
    result = _without_allow(("".join(top)), entry) + "".join(line for t in kept for line in t)
    before, after = tomllib.loads(text), tomllib.loads(result)
    expected = dict(before)
    if "allow" in before:
        expected["allow"] = [a for a in before["allow"] if a != entry]
    if "egress" in before:
        expected["egress"] = [e for e in before["egress"] if e.get("host") != entry]
        if not expected["egress"]:
            del expected["egress"]
    if after != expected:
        raise ValueError("the file is not written in a way that can be edited safely")
    return result


_HEADER = re.compile(r"[ \t]*\[\[?[ \t]*[A-Za-z0-9_.\"' -]+[ \t]*\]\]?[ \t]*(#.*)?$", re.DOTALL)
_EGRESS = re.compile(r"[ \t]*\[\[[ \t]*egress[ \t]*\]\]")
_ALLOW = re.compile(r"^[ \t]*allow[ \t]*=[ \t]*\[", re.MULTILINE)


def _without_allow(top: str, entry: str) -> str:
    """The top level of an agent file without ``entry`` in its ``allow = [...]`` list."""
    found = _ALLOW.search(top)
    if found is None:
        return top
    end, quoted = found.end(), False
    while end < len(top) and (quoted or top[end] != "]"):
        quoted = quoted != (top[end] == '"' and top[end - 1] != "\\")
        end += 1
    items = top[found.end():end]
    value = re.escape(json.dumps(entry))
    alone = re.compile(rf"^[ \t]*{value}[ \t]*,?[ \t]*(#[^\n]*)?\n", re.MULTILINE)  # a line of its own
    inline = re.compile(rf",[ \t]*{value}(?=\s*$)|{value}[ \t]*,?[ \t]*")
    items = alone.sub("", items, count=1) if alone.search(items) else inline.sub("", items, count=1)
    return top[:found.end()] + items + top[end:]


def _egress_for(table: list[str], entry: str) -> bool:
    """Whether the lines of one table (with the comments above it) are the ``[[egress]]`` entry for host
    ``entry``."""
    header = next(line for line in table if not line.lstrip().startswith("#"))
    if not _EGRESS.match(header):
        return False
    try:
        data = tomllib.loads("".join(table).replace(header, "[egress_table]\n", 1))
    except tomllib.TOMLDecodeError:
        return False
    return isinstance(data.get("egress_table"), dict) and data["egress_table"].get("host") == entry
