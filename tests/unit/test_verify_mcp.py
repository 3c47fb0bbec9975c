"""The judging of verify's MCP round (``verify.mcp_attacks``), the MCP stand-in's answers
(``verify.mcp_server``), and the server verify adds to the agent under test."""

from __future__ import annotations

import json
from typing import Any

from claude_bottle.agent.credential_config import CredentialConfig
from claude_bottle.agent.schema import AgentConfig, McpServer
from claude_bottle.gate.routes import Scheme
from claude_bottle.verify import mcp_server
from claude_bottle.verify.mcp_attacks import ROUND, Answer, Exchange, Sent, judged, messages, parse_answers, script
from claude_bottle.verify.standins import MCP_DENY_TOOLS, MCP_TOOLS, TLS_PORT, TRACKER, mcp_server_of

SENT = Sent("tracker", 8443, "10.0.0.9", "inspected:8443", "claude-bottle-sentinel-x-abc", "real-value-0123456789",
            mark="m1")
POLICY = {"code": -32001, "message": "Blocked by the user's claude-bottle policy, not by the network: ..."}


def attack(name: str) -> Any:
    return next(a for a in ROUND if a.name == name)


def logged(index: int, body: str = "", authorization: str = f"Bearer {SENT.value}") -> dict[str, Any]:
    marker = ROUND[index].marker(SENT.mark)
    return {"method": "POST", "target": "/mcp", "headers": [["authorization", authorization]],
            "body": body or json.dumps({"id": marker})}


def exchange(entries: list[dict[str, Any]], control: bool = True) -> Exchange:
    return Exchange({}, entries, SENT, control)


def section(index: int, text: str) -> str:
    return f"\n@@verify-mcp {index}\n{text}"


def test_answers_are_read_from_each_section_of_the_output() -> None:
    output = (section(0, 'HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\r\n{"jsonrpc": "2.0", "id": 1, '
                         '"result": {}}')
              + section(1, "HTTP/1.1 403 nope\nx-deny-reason: DLP rule held-secret\n\nBlocked")
              + section(2, "curl: (56) CONNECT tunnel failed, response 403\n")
              + section(3, "curl: (28) Operation timed out after 20001 milliseconds\n"))
    answers = parse_answers(output)
    assert answers[0] == Answer(200, "", '{"jsonrpc": "2.0", "id": 1, "result": {}}')
    assert answers[1] == Answer(403, "DLP rule held-secret", "Blocked")
    assert answers[2].status == 403 and answers[2].refused_by_policy()
    assert answers[3].status is None and "timed out" in answers[3].reason and not answers[3].refused_by_policy()


def test_a_refusal_is_the_gates_own() -> None:
    assert Answer(200, "", json.dumps({"jsonrpc": "2.0", "id": 1, "error": POLICY})).refused_by_policy()
    assert not Answer(400, "", '{"error": {"code": -32700, "message": "parse error"}}').refused_by_policy(), \
        "the server's own 400 carries no X-Deny-Reason"
    assert not Answer(200, "", '{"jsonrpc": "2.0", "id": 1, "error": {"code": -32602, "message": "unknown tool"}}'
                      ).refused_by_policy()
    assert not Answer(502, "upstream failed", "").refused_by_policy()


def test_messages_come_from_json_batches_and_sse_events() -> None:
    assert messages('[{"id": 1}, {"id": 2}]') == [{"id": 1}, {"id": 2}]
    assert messages('event: message\ndata: {"id": 3}\n\nevent: message\r\ndata: {"id": 4}\r\n\r\n') == \
        [{"id": 3}, {"id": 4}]
    assert messages("not json") == []


def test_a_refused_call_that_reached_the_server_is_a_leak_whatever_the_gate_answered() -> None:
    denied = attack("call a denied tool (delete_issue)")
    refused = Answer(200, "deny_tools", json.dumps({"jsonrpc": "2.0", "id": 1, "error": POLICY}))
    assert denied.judged(denied.judge(exchange([]), refused)).blocked
    reached = denied.judged(denied.judge(exchange([logged(denied.index)]), refused))
    assert not reached.blocked and reached.actual.startswith("the server got it")
    other = denied.judged(denied.judge(exchange([logged(denied.index + 1)]), refused))
    assert other.blocked, "another request's marker is not this one's (no marker holds another)"


def test_without_the_control_a_refusal_proves_nothing() -> None:
    denied = attack("call a denied tool (delete_issue)")
    verdict = denied.judge(exchange([], control=False), Answer(403, "refused", ""))
    assert verdict[1] is False and verdict[0].startswith("inconclusive")


def test_the_control_must_arrive_with_the_routes_value_and_never_the_sentinel() -> None:
    control = ROUND[0]
    ok = Answer(200, "", "{}")
    assert control.judge(exchange([logged(0)]), ok)[1]
    assert control.judge(exchange([]), ok) == ("did not arrive (HTTP 200)", False)
    assert control.judge(exchange([logged(0, authorization="Bearer other")]), ok)[1] is False
    assert control.judge(exchange([logged(0, authorization=f"Bearer {SENT.sentinel}")]), ok)[0].startswith(
        "the server got the sentinel")


def test_the_routes_value_coming_back_is_a_leak() -> None:
    denied = attack("call a denied tool (delete_issue)")
    assert denied.judge(exchange([]), Answer(403, "x", f"echo {SENT.value}")) == (
        "the route's value came back to the bottle", False)


def test_a_tool_list_must_lack_the_denied_tool_and_hold_the_allowed_one() -> None:
    listed = attack("tools/list answered as an SSE event")
    entries = [logged(listed.index)]

    def answer(*names: str) -> Answer:
        result = {"jsonrpc": "2.0", "id": 1, "result": {"tools": [{"name": n} for n in names]}}
        return Answer(200, "", f"event: message\ndata: {json.dumps(result)}\n\n")

    assert listed.judge(exchange(entries), answer("search_issues", "get_issue")) == (
        "offered search_issues, get_issue", True)
    assert listed.judge(exchange(entries), answer("get_issue", "delete_issue")) == ("offered delete_issue", False)
    assert listed.judge(exchange(entries), answer())[0].startswith("inconclusive")


def test_the_sentinel_stripped_before_the_server_is_blocked_and_delivered_is_a_leak() -> None:
    header = attack("the route's sentinel under another header name (X-Tracker-Token)")
    ok = Answer(200, "", "{}")
    assert header.judge(exchange([logged(header.index)]), ok) == ("stripped before the server (HTTP 200)", True)
    carried = logged(header.index)
    carried["headers"].append(["x-tracker-token", SENT.sentinel])
    assert header.judge(exchange([carried]), ok)[1] is False


def test_the_round_is_judged_in_order_the_control_first() -> None:
    output = "".join(section(r.index, "curl: (7) Failed to connect") for r in ROUND)
    outcomes = judged(SENT, output, [])
    assert [o.attack for o in outcomes] == [r.name for r in ROUND]
    assert not any(o.blocked for o in outcomes), "nothing arrived, not even the control: every refusal is suspect"


def test_the_script_sends_each_request_once_with_its_marker_and_the_sentinel_only() -> None:
    text = script(ROUND, SENT)
    assert text.count("| curl ") == len(ROUND)
    assert SENT.value not in text, "the bottle never gets the route's value"
    markers = [r.marker(SENT.mark) for r in ROUND]
    assert len(set(markers)) == len(ROUND)
    assert not any(a != b and a in b for a in markers for b in markers)
    assert "https://TRACKER.:8443/mcp" in text and "https://10.0.0.9:8443/mcp" in text
    assert "http://tracker:8443/mcp" in text and "https://inspected:8443/" in text


def test_the_stand_in_answers_like_a_lenient_mcp_server() -> None:
    status, reply = mcp_server.answers(b'{"jsonrpc": "2.0", "id": 1, "method": "tools/list"}')
    assert status == 200 and [t["name"] for t in reply["result"]["tools"]] == ["search_issues", "get_issue",
                                                                              "delete_issue"]
    status, reply = mcp_server.answers(json.dumps([
        {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "\uff24ELETE_issue\u200b"}},
        {"jsonrpc": "2.0", "method": "notifications/initialized"}]).encode())
    assert status == 200 and reply == [{"jsonrpc": "2.0", "id": 2, "result": {
        "content": [{"type": "text", "text": "delete_issue ran"}], "isError": False}}]
    assert mcp_server.answers(b'{"jsonrpc": "2.0", "method": "notifications/initialized"}') == (202, None)
    assert mcp_server.answers(b"{not json")[0] == 400
    assert mcp_server.answers(b'{"jsonrpc": "2.0", "id": 3, "method": "initialize"}')[1]["result"][
        "capabilities"] == {"tools": {"listChanged": False}}


def test_verify_adds_its_mcp_server_under_a_name_the_agent_does_not_use() -> None:
    server, route = mcp_server_of(AgentConfig())
    assert server.name == route.name == server.credential == "verify-tracker"
    assert server.url == f"https://{TRACKER}:{TLS_PORT}/mcp" and route.hosts == ((TRACKER, TLS_PORT),)
    assert server.rules is not None and (server.rules.tools, server.rules.deny_tools) == (MCP_TOOLS, MCP_DENY_TOOLS)
    taken = AgentConfig(mcp_servers=(McpServer("verify-tracker", ("x",)),),
                        credentials=(CredentialConfig("verify-tracker-1", (("h", 443),), Scheme.BEARER),))
    assert mcp_server_of(taken)[0].name == "verify-tracker-2"
