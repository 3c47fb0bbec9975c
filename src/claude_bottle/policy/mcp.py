"""Tool rules for remote MCP servers: which tools an agent's bottle may call on each server, and the reading
of the JSON-RPC messages that carry those calls. Pure: no I/O; the gate (gate/mcp.py) applies it.

A server is named in the agent (``[mcp.servers.NAME]``) and known to the gate by its host and port: every
request to that origin is read as MCP. ``tools`` are globs (``*`` any run of characters, ``?`` one) of the
tools allowed, all of them when empty; ``deny_tools`` refuse, and deny wins. Only ``tools/call`` is judged by
name; ``tools/list`` answers are filtered to what may be called (``allowed_tools``). Every other method
(initialize, resources, prompts, notifications, the client's answers to the server's requests) passes.

``parse_messages`` reads a POST body as the streamable HTTP and SSE transports carry it: one JSON-RPC message
or a non-empty batch of them. Anything else is not well-formed JSON-RPC and is refused by the gate.
"""

from __future__ import annotations

import fnmatch
import re
import unicodedata
from dataclasses import dataclass
from typing import Any

from claude_bottle.policy.decide import Decision
from claude_bottle.policy.hosts import HostPattern, InvalidHost, Target, normalize_host, parse_port, split_host_port
from claude_bottle.policy.strict_json import loads_strict

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
# What MCP allows in a tool name (letters, digits, '_', '-', '.', '/'), with the glob's '*' and '?'.
_TOOL_GLOB = re.compile(r"[A-Za-z0-9_.\-/*?]{1,128}")
MAX_BATCH = 100  # messages in one POST: more is not a client's batch
POLICY_ERROR = -32001  # the JSON-RPC error code of a call the gate refused (server-defined range)


def fold_tool_name(name: str) -> str:
    """``name`` as a lenient server might match it: compatibility forms folded (fullwidth letters), invisible
    format characters (zero-width spaces) dropped, letter case folded."""
    return "".join(c for c in unicodedata.normalize("NFKC", name) if unicodedata.category(c) != "Cf").casefold()


class InvalidMcpServer(ValueError):
    """A server's rules that cannot be used; the message says how to fix them."""


class MalformedJsonRpc(ValueError):
    """A body that is not well-formed JSON-RPC 2.0; the message says what is wrong, never the data."""


def check_tool_globs(globs: tuple[str, ...] | list[str], key: str) -> tuple[str, ...]:
    """``globs`` as a server's ``tools`` or ``deny_tools`` (``key``) hold them, each once."""
    for glob in globs:
        if not _TOOL_GLOB.fullmatch(glob):
            raise InvalidMcpServer(f"{key}: {glob!r} is not a tool name or glob (letters, digits, _ - . / and the "
                                   "wildcards * and ?)")
    return tuple(dict.fromkeys(globs))


@dataclass(frozen=True)
class McpServerRules:
    """One remote server as the gate judges it: its name, its origin, the tools allowed (empty: all) and the
    tools denied."""

    name: str
    host: str  # normalised
    port: int
    tools: tuple[str, ...] = ()
    deny_tools: tuple[str, ...] = ()

    def serves(self, target: Target) -> bool:
        return (target.host, target.port) == (self.host, self.port)

    def decide_tool(self, tool: str) -> Decision:
        """May the bottle call ``tool``? The reason names the server and the rule, for the audit and Claude."""
        folded = fold_tool_name(tool)
        for glob in self.deny_tools:
            # A lenient server may run DELETE_ISSUE or a fullwidth spelling as delete_issue: deny any of
            # them. A tools list stays exact, so a respelling it does not name is refused by it.
            if fnmatch.fnmatchcase(tool, glob) or fnmatch.fnmatchcase(folded, fold_tool_name(glob)):
                return Decision(False, f"MCP tool {tool} of server {self.name} is refused by deny_tools {glob!r}",
                                rule=f"[mcp.servers.{self.name}] deny_tools {glob}")
        if not self.tools:
            return Decision(True, f"MCP tool {tool} of server {self.name} allowed (no tools list)")
        for glob in self.tools:
            if fnmatch.fnmatchcase(tool, glob):
                return Decision(True, f"MCP tool {tool} of server {self.name} allowed by tools {glob!r}",
                                rule=f"[mcp.servers.{self.name}] tools {glob}")
        return Decision(False, f"MCP tool {tool} of server {self.name} is not in its tools list",
                        rule=f"[mcp.servers.{self.name}] tools")

    @property
    def allow_entry(self) -> HostPattern:
        """The server's origin as an allowlist entry: every MCP server the gate reads is allowed."""
        return HostPattern(self.host, False, self.port)

    def flag(self) -> str:
        """The ``--mcp-server`` text, read back by ``parse_mcp_flag``."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        words = [self.name, f"{host}:{self.port}"]
        if self.tools:
            words.append("tools=" + ",".join(self.tools))
        if self.deny_tools:
            words.append("deny_tools=" + ",".join(self.deny_tools))
        return " ".join(words)


def check_server_name(name: str) -> str:
    if not _NAME.fullmatch(name):
        raise InvalidMcpServer(f"{name!r} is not a server name for the gate (letters, digits, _ . -, at most 64)")
    return name


def parse_mcp_flag(text: str) -> McpServerRules:
    """``--mcp-server 'NAME HOST:PORT [tools=GLOB,...] [deny_tools=GLOB,...]'``."""
    words = text.split()
    example = "'tracker mcp.example.com:443 tools=search_*,get_issue deny_tools=delete_*'"
    if len(words) < 2:
        raise InvalidMcpServer(f"--mcp-server {text!r}: write NAME HOST:PORT [tools=...] [deny_tools=...], as in "
                               f"{example}")
    name, origin, *options = words
    try:
        check_server_name(name)
        host, port = split_host_port(origin)
        host, _ = normalize_host(host)
        number = parse_port(port, "the server's") if port else 443
    except (InvalidHost, InvalidMcpServer) as exc:
        raise InvalidMcpServer(f"--mcp-server {text!r}: {exc}") from None
    lists: dict[str, tuple[str, ...]] = {"tools": (), "deny_tools": ()}
    for option in options:
        key, _, value = option.partition("=")
        if key not in lists or not value:
            raise InvalidMcpServer(f"--mcp-server {text!r}: {option!r} is not tools=GLOB,... or deny_tools=GLOB,...")
        try:
            lists[key] = check_tool_globs(value.split(","), key)
        except InvalidMcpServer as exc:
            raise InvalidMcpServer(f"--mcp-server {text!r}: {exc}") from None
    return McpServerRules(name, host, number, lists["tools"], lists["deny_tools"])


def check_servers(servers: tuple[McpServerRules, ...] | list[McpServerRules]) -> None:
    """No two servers share a name or an origin: which rules a request gets must be unambiguous."""
    names: set[str] = set()
    origins: dict[tuple[str, int], str] = {}
    for server in servers:
        if server.name in names:
            raise InvalidMcpServer(f"MCP server {server.name} is given twice; keep one")
        names.add(server.name)
        if (server.host, server.port) in origins:
            raise InvalidMcpServer(f"MCP servers {origins[(server.host, server.port)]} and {server.name} share "
                                   f"{server.host}:{server.port}; the gate reads a whole origin as one server")
        origins[(server.host, server.port)] = server.name


def server_for(servers: tuple[McpServerRules, ...], target: Target) -> McpServerRules | None:
    for server in servers:
        if server.serves(target):
            return server
    return None


@dataclass(frozen=True)
class Message:
    """One JSON-RPC message from the client: a request (``id`` set, ``method``), a notification (no ``id``)
    or the client's answer to a server's request (``method`` empty). ``tool``: the name a ``tools/call``
    names, else ""."""

    method: str
    id: str | int | None
    params: Any
    tool: str = ""

    @property
    def is_request(self) -> bool:
        return bool(self.method) and self.id is not None


def parse_messages(body: bytes) -> tuple[list[Message], bool]:
    """The messages of a POST body and whether it was a batch. Raises MalformedJsonRpc."""
    try:
        data = loads_strict(body)
    except (ValueError, RecursionError):
        # Never the parser's words: they may quote the data (a duplicate key's name).
        raise MalformedJsonRpc("the body is not JSON read strictly (UTF-8, no duplicate keys, no NaN)") from None
    batch = isinstance(data, list)
    items = data if batch else [data]
    if not items:
        raise MalformedJsonRpc("an empty batch")
    if len(items) > MAX_BATCH:
        raise MalformedJsonRpc(f"a batch of more than {MAX_BATCH} messages")
    return [_message(item) for item in items], batch


def _one_reading(members: dict[str, Any], where: str) -> None:
    """Refuse ``members`` if two of its names are one to a server that matches names regardless of case (Go's
    encoding/json does, and folds U+017F to s and U+212A to k: ``{"name": "get_issue", "NAME": "delete_issue"}``
    would run the second there, after the gate judged the first)."""
    if len({name.casefold() for name in members}) != len(members):
        raise MalformedJsonRpc(f"{where} has members whose names differ in letter case only")


def _message(item: Any) -> Message:
    if not isinstance(item, dict) or item.get("jsonrpc") != "2.0":
        raise MalformedJsonRpc('a message is not a JSON-RPC 2.0 object ({"jsonrpc": "2.0", ...})')
    ident = item.get("id")
    if "id" in item and (isinstance(ident, bool) or not isinstance(ident, str | int)):
        raise MalformedJsonRpc("a message's id is neither a string nor an integer")
    if "method" not in item:
        if "id" not in item or ("result" in item) == ("error" in item):
            raise MalformedJsonRpc("a message has no method, and is not a response (an id and one of result or "
                                   "error)")
        if set(item) - {"jsonrpc", "id", "result", "error"}:  # a "Method" a lenient server reads as a request
            raise MalformedJsonRpc("a response carries members JSON-RPC does not define")
        return Message("", ident, None)
    method, params = item["method"], item.get("params")
    if not isinstance(method, str) or not method:
        raise MalformedJsonRpc("a message's method is not a string")
    if "params" in item and not isinstance(params, dict | list):
        raise MalformedJsonRpc(f"{method}: params is neither an object nor an array")
    if set(item) - {"jsonrpc", "id", "method", "params"}:
        raise MalformedJsonRpc(f"{method}: a request carries members JSON-RPC does not define")
    if isinstance(params, dict):
        _one_reading(params, f"{method}: params")
    tool = ""
    if method == "tools/call":
        named = params.get("name") if isinstance(params, dict) else None
        if not isinstance(named, str) or not named:
            raise MalformedJsonRpc("tools/call without a tool name (params.name)")
        tool = named
    return Message(method, ident if "id" in item else None, params, tool)


def refusal_message(server: McpServerRules, decision: Decision, explanation: str) -> dict[str, Any]:
    """The JSON-RPC error object the gate answers a refused call with (``explanation``: what the client is
    told, naming the user's policy)."""
    return {"code": POLICY_ERROR, "message": explanation,
            "data": {"server": server.name, "refused_by": "claude-bottle", "rule": decision.rule}}


def allowed_tools(server: McpServerRules, result: Any) -> tuple[Any, list[str]]:
    """``result`` of a message from the server with its ``tools`` list (a ``tools/list`` answer) cut to the
    tools the bottle may call, and the names removed. Anything not of that shape is returned as it is."""
    if not isinstance(result, dict) or not isinstance(result.get("tools"), list):
        return result, []
    kept, removed = [], []
    for tool in result["tools"]:
        name = tool.get("name") if isinstance(tool, dict) else None
        if isinstance(name, str) and server.decide_tool(name).allow:
            kept.append(tool)
        else:
            removed.append(name if isinstance(name, str) else "?")
    return {**result, "tools": kept}, removed
