"""A stand-in for the Anthropic Messages API: the one thing tests, benchmarks and ``verify`` cannot have.

It speaks enough of the API for real Claude Code (SSE streaming and JSON) and records every request. A
request may steer it with a top-level ``"stub"`` object in its JSON body (Claude Code never sends one):

- ``{"events": N, "interval": S}``: stream N text deltas, S seconds apart, each preceded by an SSE comment
  ``: sent_ns=<time.time_ns()>`` so a client can measure delivery delay.
- ``{"mode": "echo"}``: answer with the request headers as JSON (a reflecting endpoint).
- ``{"mode": "echo-header"}``: put the received credential headers in response headers.
- ``{"mode": "echo-name"}``: name a response header after the received credential headers' values (the scheme
  word cut off) in hex, which a header name may hold.
- ``{"mode": "echo-split"}``: stream the received credential split across chunks, slowly.
- ``{"mode": "echo-reason"}``: put the received credential in the status line's reason phrase.
- ``{"mode": "echo-encoded", "encoding": "url" | "base64" | "base64-nopad"}``: answer with the received
  credential headers' values (the scheme word cut off) encoded so.
- ``{"mode": "gzip"}``: answer with a gzip-encoded body.
- ``{"mode": "vanish"}``: start a stream, then drop the connection.
- ``{"delay": S}``: wait S seconds (at most ``MAX_DELAY``) before answering: a slow upstream.

What an answer says is steered by the conversation itself, so real Claude Code can be made to run a tool:

- The last user message has a line ``run: <shell command>`` and the request offers the ``Bash`` tool: the
  answer is a ``tool_use`` block asking ``Bash`` to run that command (stop reason ``tool_use``; streamed as
  ``input_json_delta`` events when the request streams). ``search: <query>`` calls ``WebSearch`` and
  ``fetch: <url>`` calls ``WebFetch`` the same way. A request that offers ``ToolSearch`` but not the tool
  gets a ``ToolSearch`` call selecting it, then the tool's call once it is loaded. A request without the
  tool (a session title, say) gets the usual text, as a real model could not call a tool it was not offered.
  ``call: TOOL {"a": 1}`` calls any tool by name with that input (an MCP server's: ``mcp__SERVER__TOOL``),
  read as JSON, its escapes undone: a prompt can spell ``\u0067hp_…`` and the call carry ``ghp_…``, as a
  model can write what its prompt only hinted at.
- The last user message carries a ``tool_result``: the answer is ``Tool said: <first line of its output>``.
- Anything else: the stub's text (``DEFAULT_TEXT`` unless it was started with another).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import gzip
import json
import re
import secrets
import ssl
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Self

from claude_bottle.gate.connection import HttpConnection
from claude_bottle.gate.endpoints import serve_http
from claude_bottle.gate.failures import ClientSide
from claude_bottle.gate.http1 import Data, EndOfMessage, Headers, LocalProtocolError, Request, Response
from claude_bottle.gate.refusals import answer_or_reset

DEFAULT_TEXT = "Hello from the stub upstream."
MAX_DELAY = 300.0  # seconds a request may ask the stub to wait before its answer
SSE_HEADERS: Headers = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache"),
                        (b"request-id", b"req_stub"), (b"anthropic-organization-id", b"stub-org")]


@dataclass
class RecordedRequest:
    method: str
    target: str
    headers: Headers
    body: bytes
    peer: str  # the client's host:port, telling connections apart

    def header(self, name: str) -> list[str]:
        return [v.decode() for n, v in self.headers if n.decode().lower() == name.lower()]

    def json(self) -> Any:
        return json.loads(self.body) if self.body else None

    def outline(self) -> dict[str, Any]:
        """The body's top-level fields, tool types and names, and number of messages: what a log shows of it
        (never the conversation)."""
        try:
            payload = self.json()
        except ValueError:
            return {"fields": [], "tool_types": [], "tool_names": [], "messages": 0}
        if not isinstance(payload, dict):
            return {"fields": [], "tool_types": [], "tool_names": [], "messages": 0}
        tools = payload.get("tools")
        tools = tools if isinstance(tools, list) else []
        messages = payload.get("messages")
        return {"fields": sorted(payload), "tool_types": sorted({str(t.get("type", "custom")) for t in tools
                                                                 if isinstance(t, dict)}),
                "tool_names": sorted({str(t.get("name", "")) for t in tools if isinstance(t, dict)}),
                "messages": len(messages) if isinstance(messages, list) else 0}


def sse(event: str, data: dict[str, Any]) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


Block = dict[str, Any]  # one content block of an answer: {"type": "text", ...} or {"type": "tool_use", ...}

# A line of the prompt that makes the answer a call of one of Claude Code's tools: (tool, its input).
TOOL_LINES: dict[str, tuple[str, Callable[[str], dict[str, str]]]] = {
    "run": ("Bash", lambda arg: {"command": arg, "description": "Run the command the prompt names"}),
    "search": ("WebSearch", lambda arg: {"query": arg}),
    "fetch": ("WebFetch", lambda arg: {"url": arg, "prompt": "Summarize the page"}),
}
TOOL_LINE = re.compile(rf"^({'|'.join([*TOOL_LINES, 'call'])}): (.+)$", re.MULTILINE)
TOOL_SEARCH = "ToolSearch"


def _content(message: Any) -> list[Block]:
    """A message's content as blocks; the API also takes a plain string."""
    content = message.get("content") if isinstance(message, dict) else None
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return [b for b in content or [] if isinstance(b, dict)]


def _text_of(block: Block) -> str:
    """The text in a text block, or in a tool_result (a string or a list of text blocks)."""
    inner = block.get("content") if block.get("type") == "tool_result" else block.get("text")
    if isinstance(inner, list):
        return "\n".join(str(b.get("text", "")) for b in inner if isinstance(b, dict))
    return str(inner or "")


def _tool_use(name: str, tool_input: dict[str, Any]) -> Block:
    return {"type": "tool_use", "id": f"toolu_stub{secrets.token_hex(8)}", "name": name, "input": tool_input}


def _call_asked(blocks: list[Block], offered: set[Any]) -> Block | None:
    """The call a ``run:``/``search:``/``fetch:`` line in ``blocks`` asks for, if its tool is offered; else a
    ``ToolSearch`` for it where that is offered (Claude Code from about 2.1.300 defers WebSearch and WebFetch
    behind it: the model loads them first, by name)."""
    calls = [m for b in blocks if b.get("type") == "text" for m in TOOL_LINE.findall(_text_of(b))]
    if not calls:
        return None
    word, argument = calls[-1][0], calls[-1][1].strip()
    if word == "call":  # call: TOOL {"json": "input"}, any tool by name (an MCP server's: mcp__SERVER__TOOL)
        tool, _, text = argument.partition(" ")
        try:
            tool_input = json.loads(text or "{}")
        except ValueError:
            return None
        if tool in offered:
            return _tool_use(tool, tool_input if isinstance(tool_input, dict) else {})
        return _tool_use(TOOL_SEARCH, {"query": f"select:{tool}", "max_results": 1}) if TOOL_SEARCH in offered else None
    tool, make_input = TOOL_LINES[word]
    if tool in offered:
        return _tool_use(tool, make_input(argument))
    if TOOL_SEARCH in offered:
        return _tool_use(TOOL_SEARCH, {"query": f"select:{tool}", "max_results": 1})
    return None


def answer_block(payload: dict[str, Any], text: str) -> Block:
    """What to answer a Messages request with: a tool call, a report of a tool's output, or ``text``."""
    messages = [m for m in payload.get("messages") or [] if isinstance(m, dict)]
    users = [m for m in messages if m.get("role") == "user"]
    blocks = _content(users[-1]) if users else []
    offered = {t.get("name") for t in payload.get("tools") or [] if isinstance(t, dict)}
    results = [b for b in blocks if b.get("type") == "tool_result"]
    if results:
        searches = {b.get("id") for m in messages if m.get("role") == "assistant" for b in _content(m)
                    if b.get("type") == "tool_use" and b.get("name") == TOOL_SEARCH}
        if results[-1].get("tool_use_id") in searches:  # the tool is loaded now: the call the prompt asked for
            asked = _call_asked(_content(users[-2]) if len(users) > 1 else [], offered - {TOOL_SEARCH})
            if asked is not None:
                return asked
        lines = [line.strip() for line in _text_of(results[-1]).splitlines() if line.strip()]
        return {"type": "text", "text": f"Tool said: {lines[0] if lines else '(no output)'}"}
    return _call_asked(blocks, offered) or {"type": "text", "text": text}


def _stop_reason(block: Block) -> str:
    return "tool_use" if block["type"] == "tool_use" else "end_turn"


def message_events(block: Block, model: str, parts: int) -> tuple[list[bytes], list[bytes], list[bytes]]:
    """The SSE frames of an answer of one block: (head, deltas, tail). ``parts`` splits the text (or a tool
    call's input, as JSON) into that many deltas."""
    tool = block["type"] == "tool_use"  # its input goes out as pieces of JSON text; the block starts empty
    start = {**block, "input": {}} if tool else {"type": "text", "text": ""}
    whole = json.dumps(block["input"]) if tool else block["text"]
    kind, key = ("input_json_delta", "partial_json") if tool else ("text_delta", "text")
    head = [
        sse("message_start", {"type": "message_start", "message": {
            "id": f"msg_stub{secrets.token_hex(8)}", "type": "message", "role": "assistant", "model": model,
            "content": [], "stop_reason": None, "stop_sequence": None,
            "usage": {"input_tokens": 10, "output_tokens": 1}}}),
        sse("content_block_start", {"type": "content_block_start", "index": 0, "content_block": start}),
    ]
    size = max(1, -(-len(whole) // parts))
    pieces = [whole[i: i + size] for i in range(0, len(whole), size)] or [""]
    pieces += ["" if tool else "."] * (parts - len(pieces))
    deltas = [sse("content_block_delta", {"type": "content_block_delta", "index": 0,
                                          "delta": {"type": kind, key: p}}) for p in pieces]
    tail = [
        sse("content_block_stop", {"type": "content_block_stop", "index": 0}),
        sse("message_delta", {"type": "message_delta",
                              "delta": {"stop_reason": _stop_reason(block), "stop_sequence": None},
                              "usage": {"output_tokens": len(pieces)}}),
        sse("message_stop", {"type": "message_stop"}),
    ]
    return head, deltas, tail


def message_json(block: Block, model: str) -> dict[str, Any]:
    return {"id": f"msg_stub{secrets.token_hex(8)}", "type": "message", "role": "assistant", "model": model,
            "content": [block], "stop_reason": _stop_reason(block), "stop_sequence": None,
            "usage": {"input_tokens": 10, "output_tokens": 5}}


@dataclass
class StubUpstream:
    """Serve on ``host:port`` (0 picks a port; see ``.port``) until stopped."""

    host: str = "127.0.0.1"
    port: int = 0
    text: str = DEFAULT_TEXT
    tls: ssl.SSLContext | None = None  # serve HTTPS with this server context
    log: bool = False  # print each request as a JSON line on stdout (when the stub runs in a container)
    requests: list[RecordedRequest] = field(default_factory=list)
    _server: asyncio.Server | None = None
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    async def __aenter__(self) -> Self:
        self._server = await serve_http(self._accept, self.host, self.port, self.tls)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.wait(list(self._tasks))
        await self._server.wait_closed()

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.host}:{self.port}"

    async def _accept(self, conn: HttpConnection) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            while (request := await conn.read_request(None)) is not None:
                assert isinstance(request, Request)  # no express path here: nothing resumes
                body = b"".join([chunk async for chunk in conn.body(None)])
                recorded = RecordedRequest(request.method.decode(), request.target.decode(),
                                           list(request.headers), body, conn.peer)
                self.requests.append(recorded)
                if self.log:
                    print(json.dumps({"method": recorded.method, "target": recorded.target, "peer": recorded.peer,
                                      "headers": [[n.decode(), v.decode()] for n, v in recorded.headers],
                                      **recorded.outline()}), flush=True)
                if not await self._answer(conn, recorded) or not conn.can_reuse():
                    break
        except ClientSide as stop:  # a broken request is answered, as real servers do: a probe can tell it got here
            if stop.status:
                with contextlib.suppress(ClientSide, LocalProtocolError):
                    await answer_or_reset(conn, stop.status, f"stub: {stop.reason}")
        except asyncio.CancelledError:
            pass
        finally:
            self._tasks.discard(task)
            conn.transport.close()

    async def _answer(self, conn: HttpConnection, request: RecordedRequest) -> bool:
        """Answer one request; False when the connection must end (the stub vanished on purpose)."""
        path = request.target.split("?", 1)[0]
        if (request.method, path) == ("POST", "/v1/messages/count_tokens"):
            await self._json(conn, 200, {"input_tokens": 12})
            return True
        if (request.method, path) == ("GET", "/v1/models"):
            await self._json(conn, 200, {"data": [{"type": "model", "id": "stub-model", "display_name": "Stub",
                                                   "created_at": "2025-01-01T00:00:00Z"}],
                                         "has_more": False, "first_id": "stub-model", "last_id": "stub-model"})
            return True
        if (request.method, path) != ("POST", "/v1/messages"):
            await self._json(conn, 404, {"type": "error", "error": {"type": "not_found_error",
                                                                    "message": f"stub: no route {path}"}})
            return True
        try:
            payload = request.json() or {}
        except ValueError:
            await self._json(conn, 400, {"type": "error", "error": {"type": "invalid_request_error",
                                                                    "message": "body is not JSON"}})
            return True
        steer = payload.get("stub") or {}
        model = str(payload.get("model", "stub-model"))
        block = answer_block(payload, self.text)
        credentials = [(n, v) for n, v in request.headers if n.lower() in (b"authorization", b"x-api-key")]
        values = [v.split(b" ", 1)[-1] for _, v in credentials]  # the scheme word cut off
        mode = steer.get("mode")
        if isinstance(delay := steer.get("delay"), (int, float)):
            await asyncio.sleep(min(max(0.0, delay), MAX_DELAY))
        if mode == "echo":
            await self._json(conn, 200, {"headers": [[n.decode(), v.decode()] for n, v in request.headers]})
        elif mode == "echo-header":
            await self._json(conn, 200, message_json(block, model),
                             [(b"x-echo-" + n.lower(), v) for n, v in credentials])
        elif mode == "echo-name":
            await self._json(conn, 200, message_json(block, model),
                             [(b"x-" + v.hex().encode(), b"1") for v in values])
        elif mode == "echo-encoded":
            encoding = steer.get("encoding")
            if encoding == "url":
                echoed = [urllib.parse.quote_from_bytes(v, safe="") for v in values]
            else:
                echoed = [base64.b64encode(v).decode().rstrip("=" if encoding == "base64-nopad" else "")
                          for v in values]
            await self._json(conn, 200, {"echo": echoed})
        elif mode == "echo-reason":
            reason = b" ".join(v for _, v in credentials) or b"no credential"
            await self._json(conn, 200, message_json(block, model), reason=reason)
        elif mode == "echo-split":
            await conn.send(Response(200, SSE_HEADERS))
            secret = b"".join(v for _, v in credentials)
            for piece in (b"data: {\"leak\": \"", secret[:7], secret[7:20], secret[20:], b"\"}\n\n"):
                await conn.send(Data(piece))
                await asyncio.sleep(0.05)
            await conn.send(EndOfMessage())
        elif mode == "gzip":
            body = gzip.compress(json.dumps(message_json(block, model)).encode())
            await conn.send(Response(200, [
                (b"content-type", b"application/json"), (b"content-encoding", b"gzip"),
                (b"content-length", str(len(body)).encode())]))
            await conn.send(Data(body))
            await conn.send(EndOfMessage())
        elif payload.get("stream"):
            return await self._stream(conn, block, model, int(steer.get("events", 1)),
                                      float(steer.get("interval", 0)), vanish=mode == "vanish")
        else:
            await self._json(conn, 200, message_json(block, model))
        return True

    async def _stream(self, conn: HttpConnection, block: Block, model: str, events: int, interval: float,
                      vanish: bool) -> bool:
        head, deltas, tail = message_events(block, model, max(1, events))
        await conn.send(Response(200, SSE_HEADERS))
        for frame in head:
            await conn.send(Data(frame))
        for i, frame in enumerate(deltas):
            if interval and i:
                await asyncio.sleep(interval)
            if vanish and i == len(deltas) // 2:
                conn.abort()
                return False
            stamp = f": sent_ns={time.time_ns()}\n".encode() if events > 1 else b""
            await conn.send(Data(stamp + frame))
        for frame in tail:
            await conn.send(Data(frame))
        await conn.send(EndOfMessage())
        return True

    @staticmethod
    async def _json(conn: HttpConnection, status: int, payload: Any, extra: Headers | None = None,
                    reason: bytes = b"") -> None:
        body = json.dumps(payload).encode()
        await conn.send_whole(Response(status, [
            (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
            (b"request-id", b"req_stub"), *(extra or [])], reason), body)  # (to HEAD, without the body)


async def serve(host: str, port: int, text: str = DEFAULT_TEXT, log: bool = False,
                tls: ssl.SSLContext | None = None) -> None:
    """Run a stub until cancelled (the ``stub-upstream`` command); ``tls``: serve HTTPS with it."""
    async with StubUpstream(host, port, text, tls, log=log) as stub:
        print(f"stub upstream on {stub.url}", flush=True)
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.Event().wait()
