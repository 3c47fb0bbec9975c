"""What a Messages request body may ask of the provider. Pure: bytes in, a Decision out.

The API route forwards Messages requests, not instructions for the provider to reach other servers on the
bottle's behalf. Refused, unless the agent opts in to a server-tool family:

- ``mcp_servers``: the provider connects to the listed servers, with the given authorization token.
- ``container`` (unless code execution is opted in): a provider-side container, where code runs with network
  access.
- Server tools whose type is not known to be safe: ``web_fetch_*`` and ``code_execution_*`` reach out or run
  code on the provider's side; any type the gate does not know is treated the same. Client tools (no type,
  or ``custom``) run in the bottle, behind the gate, and pass.
- Image and document sources of type ``url``: the provider fetches the URL.
- ``server_tool_use`` and ``mcp_tool_use`` blocks in the conversation that name no server tool the request
  itself declares and is allowed.

The body is parsed strictly (UTF-8, no duplicate keys, no NaN or Infinity), so the provider cannot read a
field the gate did not see. See docs/api-policy.md for the measurement behind the defaults.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from claude_bottle.policy.decide import Decision
from claude_bottle.policy.strict_json import loads_strict

MAX_BODY_BYTES = 32 * 1024 * 1024  # Anthropic's own limit for a Messages request
MESSAGES_PATHS = frozenset({"/v1/messages", "/v1/messages/count_tokens"})

# Server tools the provider runs, by family (the type without its version date).
SERVER_TOOL_FAMILIES: dict[str, str] = {
    "web_search": "the provider runs web searches",
    "web_fetch": "the provider fetches URLs the conversation names",
    "code_execution": "the provider runs code in a container with network access",
    "bash": "an Anthropic-defined shell tool",
    "text_editor": "an Anthropic-defined editor tool",
    "computer": "an Anthropic-defined computer-use tool",
    "memory": "an Anthropic-defined memory tool",
    "tool_search_tool_regex": "the provider searches the request's tools",
    "tool_search_tool_bm25": "the provider searches the request's tools",
}
# The exact types allowed without opting in: what Claude Code 2.1.126 sends (WebSearch).
DEFAULT_SERVER_TOOLS = frozenset({"web_search_20250305"})
_DATED = re.compile(r"(?P<family>[a-z][a-z0-9_]*?)_(?P<date>\d{8})")
_SAFE_SOURCES = frozenset({"base64", "text", "content", "file"})


class InvalidServerTool(ValueError):
    pass


def parse_server_tool(name: str) -> str:
    """A server-tool family the user opts in to, e.g. ``web_fetch``; raises InvalidServerTool."""
    dated = _DATED.fullmatch(name)
    if dated:
        raise InvalidServerTool(f"{name!r}: name the family without its version date, e.g. {dated['family']!r}")
    if name not in SERVER_TOOL_FAMILIES:
        raise InvalidServerTool(f"{name!r} is not a server tool (known: {', '.join(SERVER_TOOL_FAMILIES)})")
    return name


def family(tool_type: str) -> str | None:
    dated = _DATED.fullmatch(tool_type)
    return dated["family"] if dated else None


def _refuse(reason: str, status: int = 403) -> Decision:
    return Decision(False, reason, status)


def parse_body(body: bytes) -> dict[str, Any]:
    """The request body as the provider will read it; ValueError for anything ambiguous or not an object."""
    value = loads_strict(body)
    if not isinstance(value, dict):
        raise ValueError("the body is not a JSON object")
    return value


@dataclass(frozen=True)
class MessagesPolicy:
    """Decides on a Messages request body. ``server_tools`` are the families the agent opted in to; with
    none, only ``DEFAULT_SERVER_TOOLS`` pass. ``paths`` are the POST paths whose bodies are read and judged
    (an empty set turns the policy off, which only a benchmark does)."""

    server_tools: frozenset[str] = frozenset()
    paths: frozenset[str] = MESSAGES_PATHS

    def decide(self, body: bytes) -> Decision:
        try:
            request = parse_body(body)
        except (ValueError, RecursionError) as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
            return _refuse(f"request body is not a plain JSON object: {exc}", 400)
        if "mcp_servers" in request:
            return _refuse("mcp_servers is refused: the provider would connect to those servers with the "
                           "bottle's data; configure remote MCP servers in the agent's [mcp] table instead")
        if "container" in request and "code_execution" not in self.server_tools:
            return _refuse("container is refused: it names a provider-side container, where code runs with network "
                           "access; allow it with [api] server_tools = [\"code_execution\"]")
        declared: set[str] = set()
        tools = request.get("tools", [])
        if not isinstance(tools, list):
            return _refuse("tools is not a list", 400)
        for index, tool in enumerate(tools):
            decision = self._tool(tool, index)
            if decision is not None:
                return decision
            if isinstance(tool, dict) and "type" in tool and tool["type"] != "custom":
                declared.add(str(tool.get("name", "")))
        problem = _blocks_problem(_conversation(request), declared)
        if problem is not None:
            return problem
        return self._allowed

    @functools.cached_property
    def _allowed(self) -> Decision:  # the same for every body it allows: made once
        opted = f" (server tools opted in: {', '.join(sorted(self.server_tools))})" if self.server_tools else ""
        return Decision(True, f"no provider-side fetch or code execution asked{opted}")

    def _tool(self, tool: Any, index: int) -> Decision | None:
        if not isinstance(tool, dict):
            return _refuse(f"tools[{index}] is not an object", 400)
        if "type" not in tool or tool["type"] == "custom":
            return None  # a client tool: Claude Code runs it in the bottle
        kind = tool["type"]
        if not isinstance(kind, str):
            return _refuse(f"tools[{index}].type is not a string", 400)
        if kind in DEFAULT_SERVER_TOOLS or family(kind) in self.server_tools:
            return None
        known = family(kind)
        why = SERVER_TOOL_FAMILIES.get(known or "", "a server tool the gate does not know")
        hint = (f"; allow it with [api] server_tools = [\"{known}\"]" if known in SERVER_TOOL_FAMILIES
                else "")
        return _refuse(f"server tool {kind} is refused: {why}{hint}")


def _conversation(request: dict[str, Any]) -> Iterable[Any]:
    """Every content block of the system prompt and the messages."""
    system = request.get("system")
    if isinstance(system, list):
        yield from system
    messages = request.get("messages", [])
    for message in messages if isinstance(messages, list) else []:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list):
            yield from content


def _blocks_problem(blocks: Iterable[Any], declared: set[str]) -> Decision | None:
    """Walk content blocks and the blocks nested in them (tool results, documents, search results)."""
    pending = list(blocks)
    while pending:
        block = pending.pop()
        if not isinstance(block, dict):
            continue
        kind = block.get("type")
        source = block.get("source")
        if isinstance(source, dict):
            source_type = source.get("type")
            if source_type not in _SAFE_SOURCES:
                return _refuse(f"a {kind} block with a {source_type!r} source is refused: the provider would "
                               "fetch it; send the content itself (base64 or text)")
            if isinstance(source.get("content"), list):
                pending.extend(source["content"])
        if kind in ("server_tool_use", "mcp_tool_use") and block.get("name") not in declared:
            return _refuse(f"a {kind} block for {block.get('name')!r} names no allowed server tool of this "
                           "request")
        if kind in ("tool_result", "search_result") and isinstance(block.get("content"), list):
            pending.extend(block["content"])
    return None
