"""MCP tool rules and JSON-RPC reading (policy/mcp.py), the agent's [mcp.servers.NAME] keys, and what the
bottle's Claude Code config gets for a remote server."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from claude_bottle import logview, suggest
from claude_bottle.agent.schema import parse_agent
from claude_bottle.credentials import Credential
from claude_bottle.errors import ConfigError
from claude_bottle.gate.routes import CredentialRoute, new_sentinel
from claude_bottle.launch import Launch, run_spec
from claude_bottle.policy.mcp import (
    InvalidMcpServer,
    MalformedJsonRpc,
    McpServerRules,
    allowed_tools,
    check_servers,
    parse_mcp_flag,
    parse_messages,
)
from claude_bottle.runtime.gate import gate_options
from tests.helpers import make_token

RULES = McpServerRules("tracker", "mcp.example.com", 443, ("search_*", "get_issue"), ("search_private*",))


@pytest.mark.parametrize("tool, allowed, rule", [
    ("search_issues", True, "[mcp.servers.tracker] tools search_*"),
    ("get_issue", True, "[mcp.servers.tracker] tools get_issue"),
    ("search_private_repos", False, "[mcp.servers.tracker] deny_tools search_private*"),  # deny wins
    ("get_issues", False, "[mcp.servers.tracker] tools"),
    ("Search_issues", False, "[mcp.servers.tracker] tools"),  # names compare exactly
])
def test_deny_wins_and_a_tools_list_allows_only_what_it_names(tool: str, allowed: bool, rule: str) -> None:
    decision = RULES.decide_tool(tool)
    assert (decision.allow, decision.rule) == (allowed, rule)
    assert "tracker" in decision.reason and tool in decision.reason


def test_without_a_tools_list_every_tool_but_the_denied_is_allowed() -> None:
    rules = McpServerRules("t", "h", 443, (), ("delete_*",))
    assert rules.decide_tool("anything").allow and not rules.decide_tool("delete_repo").allow


@pytest.mark.parametrize("respelled", [
    "DELETE_REPO", "Delete_Repo", "\uff44\uff45\uff4c\uff45\uff54\uff45_repo", "dele\u200bte_repo", "delete\u00ad_repo",
])
def test_a_deny_rule_holds_against_the_spellings_a_lenient_server_would_run(respelled: str) -> None:
    rules = McpServerRules("t", "h", 443, (), ("delete_*",))
    decision = rules.decide_tool(respelled)
    assert not decision.allow and decision.rule == "[mcp.servers.t] deny_tools delete_*"
    assert rules.decide_tool("undelete_repo").allow, "folding does not widen the glob itself"


def test_the_flag_round_trips_and_bad_ones_say_how_to_write_them() -> None:
    assert parse_mcp_flag(RULES.flag()) == RULES
    assert parse_mcp_flag("t [2001:db8::1]:8443").flag() == "t [2001:db8::1]:8443"
    for text, words in [("t", "NAME HOST:PORT"), ("t h tools=", "is not tools="), ("t h tools=a b", "is not tools="),
                        ("t h tools=$x", "not a tool name"), ("bad/name h", "not a server name"),
                        ("t *.example.com", "--mcp-server")]:
        with pytest.raises(InvalidMcpServer, match=words):
            parse_mcp_flag(text)
    with pytest.raises(InvalidMcpServer, match="share"):
        check_servers([RULES, McpServerRules("other", "mcp.example.com", 443)])


@pytest.mark.parametrize("body, problem", [
    (b"not json", "not JSON"), (b"[]", "empty batch"), (b'{"id": 1, "method": "x"}', "JSON-RPC 2.0"),
    (b'{"jsonrpc": "2.0", "id": 1.5, "method": "x"}', "id"), (b'{"jsonrpc": "2.0", "id": true, "method": "x"}', "id"),
    (b'{"jsonrpc": "2.0", "id": 1}', "no method"), (b'{"jsonrpc": "2.0", "id": 1, "result": 1, "error": {}}', "no method"),
    (b'{"jsonrpc": "2.0", "id": 1, "method": 5}', "method"), (b'{"jsonrpc": "2.0", "method": "x", "params": 1}', "params"),
    (b'{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": ""}}', "tool name"),
    (b'{"jsonrpc": "2.0", "id": 1, "method": "x", "extra": 1}', "members"),
    (b"[" + b"[" * 100_000 + b"]" * 100_000 + b"]", "not JSON"),
    # Read strictly: a key the gate judges must be the key every server reads.
    (b'{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "delete_issue", "name": "get_issue"}}',
     "duplicate keys"),
    (b'{"jsonrpc": "2.0", "id": 1, "method": "x", "params": {"n": NaN}}', "NaN"),
    # Read as one by a server that matches names regardless of case (Go's encoding/json: the last one wins,
    # and U+017F is an s, U+212A a k).
    *[(b'{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "get_issue", "%s": "delete_issue"}}'
       % key.encode(), "letter case") for key in ("NAME", "Name", "nAmE")],
    ('{"jsonrpc": "2.0", "id": 1, "method": "x", "params": {"task": 1, "ta\u017fk": 2}}'.encode(), "letter case"),
    ('{"jsonrpc": "2.0", "id": 1, "method": "x", "params": {"kind": 1, "\u212aind": 2}}'.encode(), "letter case"),
    (b'{"jsonrpc": "2.0", "id": 1, "result": {}, "Method": "tools/call", "Params": {"name": "delete_issue"}}',
     "response carries members"),
    ('{"jsonrpc": "2.0", "id": 1, "method": "x"}'.encode("utf-16"), "UTF-8"),
    (b'\xef\xbb\xbf{"jsonrpc": "2.0", "id": 1, "method": "x"}', "UTF-8"),
    (b"[" + b",".join([b'{"jsonrpc": "2.0", "method": "x"}'] * 101) + b"]", "batch"),
])
def test_anything_but_json_rpc_is_malformed(body: bytes, problem: str) -> None:
    with pytest.raises(MalformedJsonRpc, match=problem):
        parse_messages(body)


def test_messages_requests_notifications_and_answers() -> None:
    messages, batch = parse_messages(b'[{"jsonrpc": "2.0", "id": "a", "method": "tools/call", "params": '
                                     b'{"name": "get_issue"}}, {"jsonrpc": "2.0", "method": "notifications/x"}, '
                                     b'{"jsonrpc": "2.0", "id": 3, "result": {}}]')
    assert batch and [(m.method, m.id, m.tool, m.is_request) for m in messages] == [
        ("tools/call", "a", "get_issue", True), ("notifications/x", None, "", False), ("", 3, "", False)]


def test_a_tools_list_is_cut_to_the_allowed_tools_and_anything_else_kept() -> None:
    result = {"tools": [{"name": "search_issues"}, {"name": "delete_issue"}, {"name": 5}, "x"], "nextCursor": "c"}
    cut, removed = allowed_tools(RULES, result)
    assert cut == {"tools": [{"name": "search_issues"}], "nextCursor": "c"} and removed == ["delete_issue", "?", "?"]
    assert allowed_tools(RULES, {"content": []}) == ({"content": []}, [])


AGENT = '''version = 1
[mcp.servers.tracker]
url = "https://mcp.example.com/mcp"
tools = ["search_*", "get_issue"]
deny_tools = ["delete_*"]
credential = "tracker"
[mcp.servers.legacy]
url = "http://legacy.example.com:8080/sse"
transport = "sse"
[mcp.servers.files]
command = ["mcp-files", "/workspace"]
[credentials.tracker]
hosts = ["api.example.com"]
scheme = "bearer"
env = "TRACKER_TOKEN"
'''


def test_an_agents_remote_servers_reach_the_gate_and_the_bottle_holds_only_a_sentinel(tmp_path: Path) -> None:
    agent = parse_agent("a", tomllib.loads(AGENT), "a.toml")
    assert agent.mcp_rules == (McpServerRules("tracker", "mcp.example.com", 443, ("search_*", "get_issue"),
                                              ("delete_*",)),
                               McpServerRules("legacy", "legacy.example.com", 8080))
    assert agent.credentials[0].hosts == (("api.example.com", 443), ("mcp.example.com", 443)), \
        "the credential is bound to the server's host too"
    route = CredentialRoute(agent.credentials[0].spec(new_sentinel("tracker")), "t" * 40)
    spec = run_spec(Launch(agent, tmp_path, Credential.parse(make_token(), "t"), routes=(route,)), "b", "g", "1:1")
    assert spec.mcp_servers == {
        "tracker": {"type": "http", "url": "https://mcp.example.com/mcp",
                    "headers": {"Authorization": f"Bearer {route.spec.sentinel}"}},
        "legacy": {"type": "sse", "url": "http://legacy.example.com:8080/sse"},
        "files": {"type": "stdio", "command": "mcp-files", "args": ["/workspace"]},
    }
    assert "t" * 40 not in str(spec.mcp_servers)
    assert gate_options(spec).mcp_servers == agent.mcp_rules


@pytest.mark.parametrize("extra, words", [
    ('[mcp.servers.x]\ncommand = ["a"]\ntools = ["b"]', "mcp.servers.x.tools: applies to a remote server"),
    ('[mcp.servers.x]\nurl = "https://x.example.com"\ntransport = "ws"', "mcp.servers.x.transport:"),
    ('[mcp.servers.x]\nurl = "https://x.example.com"\ntools = ["a b"]', "mcp.servers.x.tools:"),
    ('[mcp.servers.x]\nurl = "https://x.example.com"\ncredential = "nope"', "names no [credentials.nope]"),
    ('[mcp.servers.x]\nurl = "https://x.example.com/a"\n[mcp.servers.y]\nurl = "https://x.example.com/b"', "share"),
    ('allow_tcp = ["x.example.com:443"]\n[mcp.servers.x]\nurl = "https://x.example.com"', "must read an MCP server"),
    ('[[egress]]\nhost = "x.example.com"\ninspect = false\n[mcp.servers.x]\nurl = "https://x.example.com"',
     "must read an MCP server"),
])
def test_bad_mcp_keys_are_named(extra: str, words: str) -> None:
    with pytest.raises(ConfigError, match=words.replace("[", r"\[").replace(".", r"\.")):
        parse_agent("a", tomllib.loads("version = 1\n" + extra), "a.toml")


def _mcp_lines(tool: str, decision: str, rule: str = "") -> list[dict[str, object]]:
    """A request to an MCP server's lines as the gate writes them: the request's, then one per message."""
    request = {"version": 2, "listener": "proxy", "method": "POST", "target": "mcp.example.com:443",
               "path": "/mcp", "decision": decision, "status": 200, "reason": f"MCP tool {tool} ..."}
    common = {"version": 2, "listener": "mcp", "target": "mcp.example.com:443", "path": "/mcp", "status": 200,
              "server": "tracker"}
    return [request, {**common, "method": "tools/call", "tool": tool, "decision": decision, "reason": "r",
                      **({"rule": rule} if rule else {})},
            {**common, "method": "notifications/initialized", "decision": decision,
             "reason": "r" if decision == "allow" else "not sent: its request was refused: ..."}]


def test_suggest_proposes_the_tools_the_run_called_and_lists_those_refused() -> None:
    lines = [*_mcp_lines("get_issue", "allow"), *_mcp_lines("get_issue", "allow"),
             *_mcp_lines("search_issues", "allow"), *_mcp_lines("delete_issue", "deny", "[mcp.servers.tracker] tools")]
    not_sent = _mcp_lines("search_issues", "deny")[1]  # in a batch another call of which was refused
    found = suggest.suggest([*lines, not_sent])
    assert found.mcp_tools == {"tracker": {"get_issue": 2, "search_issues": 1}}
    assert found.mcp_refused == {"tracker": {"delete_issue"}}, "a call not sent was not refused by a rule"
    assert list(found.destinations) == ["mcp.example.com"], "a message's line is not a destination of its own"
    text = suggest.render(found, "a run")
    assert '#   tools = ["get_issue", "search_issues"]' in text and "refused, not suggested: delete_issue" in text
    tomllib.loads(text)  # still an agent file's TOML: the MCP part is comments


def test_logs_show_each_message_to_an_mcp_server_under_its_request() -> None:
    rows = [logview.row(line, colour=False) for line in _mcp_lines("delete\x1b]issue", "deny")]
    assert rows[0].split()[:3] == ["deny", "POST", "mcp.example.com:443"], rows[0]
    assert rows[1:] == ["  mcp tracker: tools/call delete\\x1b]issue deny: r",
                        "  mcp tracker: notifications/initialized deny: not sent: its request was refused: ..."]
    assert logview.row(_mcp_lines("get_issue", "allow")[1], colour=False) == "  mcp tracker: tools/call get_issue allow"
