"""The gate's reading of a remote MCP server's traffic: JSON-RPC judged call by call, tool lists filtered.

Every request to a server's origin (``policy/mcp.py``: ``--mcp-server``) takes these filters, after the
method and path rules and before DLP, inside a terminated tunnel or on plain HTTP:

- ``GET`` (the server's event stream, either transport) and ``DELETE`` (a streamable HTTP session's end)
  pass; their answers are filtered as below. Any other method but ``POST`` is refused (405).
- A ``POST`` body is read whole (at most ``MAX_BODY`` bytes), unencoded, and must be one well-formed
  JSON-RPC 2.0 message or a batch (else 400). Each ``tools/call`` is judged by the server's tool rules, and
  an allowed one's params by DLP, decoded (a secret hidden in JSON escapes is found too); every message's
  method and tool name by DLP too (such a name is audited as ``[redacted]``). If any call is refused, none
  is sent: the gate answers the request itself, a JSON-RPC error (code ``POLICY_ERROR``) for each refused
  call naming the user's policy and one for each other request of the batch saying it was not sent; the
  server never sees any of it. A refused notification (no id, nothing to answer) is a 403.
- Answers: the gate asks for identity encoding; a JSON body, or each event of an SSE stream, that carries a
  ``tools`` list (a ``tools/list`` result, whichever request it answers and on whichever stream) is cut to
  the tools the bottle may call. Other answers pass unchanged.

The request's decision lists its messages (``RpcCall``): the audit writes a line for each after the request's
own (gate/audit.py), with the server, method, tool, decision, reason and rule.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from typing import Any

from claude_bottle.gate.audit import REDACTED
from claude_bottle.gate.dlp import DlpMatch, DlpMatcher
from claude_bottle.gate.failures import Refused, UpstreamSide, explanation
from claude_bottle.gate.forward import Inbound, Outbound, RequestFilter, ResponseFilter, read_whole
from claude_bottle.gate.http1 import Headers, header_values
from claude_bottle.policy.decide import Decision, RpcCall
from claude_bottle.policy.mcp import (
    MalformedJsonRpc,
    McpServerRules,
    Message,
    allowed_tools,
    parse_messages,
    refusal_message,
)

MAX_BODY = 4 << 20  # a POST's JSON-RPC, read whole to be judged; also one answer or SSE event to be filtered
_PASSING = frozenset({b"GET", b"DELETE"})
_EVENT_END = re.compile(rb"\r\n\r\n|\n\n|\r\r")
_JSON = b"application/json"


def mcp_request(server: McpServerRules, matcher: DlpMatcher) -> RequestFilter:
    """Judge a request to ``server``'s origin (see the module's note); the decision lists its calls."""

    async def judge(request: Outbound) -> Decision:
        if request.method in _PASSING:
            return Decision(True, f"MCP server {server.name}: {request.method.decode()} passes (its stream or "
                                  "the session's end)")
        if request.method != b"POST":
            raise Refused(405, f"MCP server {server.name}: {request.method.decode('ascii', 'replace')} is not an "
                               "MCP request (POST, GET or DELETE)")
        if {v.strip().lower() for v in header_values(request.headers, b"content-encoding")} - {b"", b"identity"}:
            raise Refused(415, f"MCP server {server.name}: an encoded request body cannot be judged")
        request.body = body = await read_whole(request, MAX_BODY)
        try:
            messages, batch = parse_messages(body)
        except MalformedJsonRpc as exc:
            raise Refused(400, f"MCP server {server.name}: not well-formed JSON-RPC: {exc}") from None
        judged = [_judge(server, matcher, message) for message in messages]
        verdicts = [verdict for verdict, _ in judged]
        calls = tuple(call for _, call in judged)
        refused = [v for v in verdicts if not v.allow]
        if not refused:
            return Decision(True, f"MCP server {server.name}: {_summary(messages)}", calls=calls)
        first = refused[0]
        reason = first.reason if len(refused) == 1 else f"{first.reason} (and {len(refused) - 1} more)"
        replies = [_error(server, m, v) for m, v in zip(messages, verdicts, strict=True) if m.id is not None]
        if not replies:
            raise Refused(403, reason, rule=first.rule or None, calls=calls)
        body_out = json.dumps(replies if batch else replies[0]).encode()
        raise Refused(200, reason, rule=first.rule or None, reply=(_JSON, body_out), calls=calls)

    return judge


def _judge(server: McpServerRules, matcher: DlpMatcher, message: Message) -> tuple[Decision, RpcCall]:
    """``message``'s verdict, and its audit entry. A method or tool name that DLP matches is refused and
    audited as ``[redacted]``: the names are the client's words, and the audit holds no secret."""
    method, tool = message.method or "(response)", message.tool
    in_method, in_tool = _secret_in(matcher, method), _secret_in(matcher, tool)
    for what, match in (("method", in_method), ("tool name", in_tool)):
        if match is not None:
            verdict = Decision(False, f"MCP server {server.name}: {match.reason} (a message's {what})",
                               rule=match.decision.rule)
            return verdict, _call(server, REDACTED if in_method else method, REDACTED if in_tool else tool, verdict)
    verdict = _tool_verdict(server, matcher, message)
    return verdict, _call(server, method, tool, verdict)


def _tool_verdict(server: McpServerRules, matcher: DlpMatcher, message: Message) -> Decision:
    if not message.tool:
        return Decision(True, f"{message.method or 'a response'} passes")
    decision = server.decide_tool(message.tool)
    if not decision.allow:
        return decision
    # The arguments as the server will read them: JSON escapes decoded (a lone surrogate kept as its bytes).
    if (match := _secret_in(matcher, json.dumps(message.params, ensure_ascii=False))) is not None:
        return Decision(False, f"MCP tool {message.tool} of server {server.name}: {match.reason} (its arguments)",
                        rule=match.decision.rule)
    return decision


def _secret_in(matcher: DlpMatcher, text: str) -> DlpMatch | None:
    try:
        matcher.scanner().finish(text.encode("utf-8", "surrogatepass"))
    except DlpMatch as match:
        return match
    return None


def _call(server: McpServerRules, method: str, tool: str, verdict: Decision) -> RpcCall:
    return RpcCall(server.name, method, tool, "allow" if verdict.allow else "deny", verdict.reason, verdict.rule)


def _error(server: McpServerRules, message: Message, verdict: Decision) -> dict[str, Any]:
    if verdict.allow:
        error = {"code": -32000, "message": "not sent: another call in the same batch was refused by the user's "
                                            "claude-bottle policy"}
    else:
        error = refusal_message(server, verdict, explanation(Refused.by(verdict)))
    return {"jsonrpc": "2.0", "id": message.id, "error": error}


def _summary(messages: list[Message]) -> str:
    named = [f"{m.method} {m.tool}" if m.tool else (m.method or "a response") for m in messages[:5]]
    more = f" and {len(messages) - 5} more" if len(messages) > 5 else ""
    return ", ".join(named) + more


def mcp_response(server: McpServerRules) -> ResponseFilter:
    """Cut the ``tools`` lists in ``server``'s answers to the tools the bottle may call."""

    def cut(response: Inbound) -> None:
        if {v.strip().lower() for v in header_values(response.headers, b"content-encoding")} - {b"", b"identity"}:
            raise UpstreamSide(502, f"MCP server {server.name} sent an encoded answer although the gate asked for "
                                    "identity")
        kind = b";".join(header_values(response.headers, b"content-type")).split(b";")[0].strip().lower()
        if kind == _JSON:
            if isinstance(response.body, bytes):
                response.body = _cut_json(server, response.body)
                response.headers = _length(response.headers, len(response.body))
            else:
                response.body = _cut_streamed_json(server, response.body)
                response.headers = _length(response.headers, None)
        elif kind == b"text/event-stream":
            body = response.body
            response.body = _cut_events(server, _stream(body) if isinstance(body, bytes) else body)
            response.headers = _length(response.headers, None)

    return cut


def _length(headers: Headers, length: int | None) -> Headers:
    """``headers`` for a body the gate rewrote: its new length, or none (the gate then chunks it)."""
    kept = [(n, v) for n, v in headers if n.lower() != b"content-length"]
    return kept if length is None else [*kept, (b"content-length", str(length).encode())]


async def _stream(body: bytes) -> AsyncIterator[bytes]:
    yield body


def _cut_json(server: McpServerRules, body: bytes) -> bytes:
    """A JSON answer (one message or a batch) with its tools lists cut; unchanged when it holds none."""
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        return body  # not JSON-RPC: the client cannot read it either
    items = data if isinstance(data, list) else [data]
    changed = False
    for item in items:
        if isinstance(item, dict) and "result" in item:
            item["result"], removed = allowed_tools(server, item["result"])
            changed = changed or bool(removed)
    return json.dumps(data).encode() if changed else body


async def _cut_streamed_json(server: McpServerRules, body: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    chunks, size = [], 0
    async for chunk in body:
        size += len(chunk)
        if size > MAX_BODY:
            raise UpstreamSide(502, f"MCP server {server.name} sent an answer larger than {MAX_BODY} bytes")
        chunks.append(chunk)
    yield _cut_json(server, b"".join(chunks))


async def _cut_events(server: McpServerRules, body: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """An SSE stream, event by event as each completes, each event's data cut as ``_cut_json`` does."""
    held = b""
    async for chunk in body:
        held += chunk
        out = []
        while (end := _EVENT_END.search(held)) is not None:
            out.append(_cut_event(server, held[: end.start()]) + held[end.start() : end.end()])
            held = held[end.end() :]
        if len(held) > MAX_BODY:
            raise UpstreamSide(502, f"MCP server {server.name} sent an event larger than {MAX_BODY} bytes")
        if out:
            yield b"".join(out)
    if held:
        yield _cut_event(server, held)


def _cut_event(server: McpServerRules, event: bytes) -> bytes:
    lines = event.replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n")
    data = [line[5:].removeprefix(b" ") for line in lines if line.startswith(b"data:")]
    if not data:
        return event
    joined = b"\n".join(data)
    cut = _cut_json(server, joined)
    if cut is joined:
        return event
    others = [line for line in lines if not line.startswith(b"data:")]
    return b"\n".join([*others, b"data: " + cut])
