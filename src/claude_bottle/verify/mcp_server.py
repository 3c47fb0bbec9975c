"""The remote MCP server ``verify`` attacks through the gate: the smallest honest streamable HTTP server, with
two read tools and one write tool, that logs every request it receives.

Run as ``python -m claude_bottle.verify.mcp_server --listen HOST:PORT --log --tls PEM`` in a container of the
gate image, beside verify's other stand-ins. The official SDK (``mcp`` on PyPI, which the test suite's tracker
uses) is not in the gate image, and verify runs on the images it would attack: this is standard library only.
What the attacks need of a server is what a real one does with what reaches it: read JSON-RPC 2.0 (one
message or a batch) on any path, answer ``initialize``, ``tools/list`` and ``tools/call`` in JSON or as an
SSE event (as the client's ``Accept`` prefers), and run a tool whatever the case or width of its name and
decode a gzip-encoded body (as a lenient server might), so that anything getting past the gate would be
carried out.

With ``--log``, each request is printed as one JSON line: its method, target, headers and body (what the
bottle sent, which verify searches for its markers and the route's sentinel). The stand-in never checks the
credential: verify reads the ``authorization`` it logged.
"""

from __future__ import annotations

import argparse
import json
import ssl
import sys
import threading
import unicodedata
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

TOOLS = (
    {"name": "search_issues", "description": "Search the issues.",
     "inputSchema": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}},
    {"name": "get_issue", "description": "Read one issue.",
     "inputSchema": {"type": "object", "properties": {"number": {"type": "integer"}}, "required": ["number"]}},
    {"name": "delete_issue", "description": "Delete an issue.",
     "inputSchema": {"type": "object", "properties": {"number": {"type": "integer"}}, "required": ["number"]}},
)
PROTOCOL = "2025-06-18"
MAX_BODY = 1 << 20
SERVING = "mcp stand-in on"  # the line printed once it listens


def lenient(name: str) -> str:
    """``name`` as a lenient server would look it up: compatibility forms folded, case folded, invisible
    characters dropped."""
    folded = unicodedata.normalize("NFKC", name).casefold()
    return "".join(c for c in folded if unicodedata.category(c) != "Cf").strip()


def answer(message: Any) -> dict[str, Any] | None:
    """The reply to one JSON-RPC message, or None for a notification or a response (nothing to answer)."""
    if not isinstance(message, dict) or "method" not in message:
        return None
    if "id" not in message:
        return None
    method, params, reply = message.get("method"), message.get("params"), {"jsonrpc": "2.0", "id": message["id"]}
    if method == "initialize":
        return {**reply, "result": {"protocolVersion": PROTOCOL, "capabilities": {"tools": {"listChanged": False}},
                                    "serverInfo": {"name": "verify-tracker", "version": "1"}}}
    if method == "tools/list":
        return {**reply, "result": {"tools": list(TOOLS)}}
    if method == "tools/call":
        name = params.get("name") if isinstance(params, dict) else None
        known = {str(tool["name"]) for tool in TOOLS}
        folded = lenient(name) if isinstance(name, str) else ""
        if folded not in known:
            return {**reply, "error": {"code": -32602, "message": f"unknown tool {name!r}"}}
        return {**reply, "result": {"content": [{"type": "text", "text": f"{folded} ran"}], "isError": False}}
    return {**reply, "error": {"code": -32601, "message": f"no method {method!r}"}}


def answers(body: bytes) -> tuple[int, Any]:
    """The HTTP status and the JSON to send for a POST ``body`` (None: no content, 202)."""
    try:
        data = json.loads(body)
    except ValueError:
        return 400, {"jsonrpc": "2.0", "id": None, "error": {"code": -32700, "message": "parse error"}}
    replies = [r for r in (answer(m) for m in (data if isinstance(data, list) else [data])) if r is not None]
    if not replies:
        return 202, None
    return 200, replies if isinstance(data, list) else replies[0]


class Server(ThreadingHTTPServer):
    log = False  # print each request as a JSON line (``--log``)
    # Requests are handled on threads at once, and print() writes a line and its newline apart: one locked
    # write per line, so two lines never run into one.
    log_lock = threading.Lock()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass  # the JSON lines are the log

    def _record(self, body: bytes) -> None:
        if not isinstance(self.server, Server) or not self.server.log:
            return
        line = json.dumps({"method": self.command, "target": self.path,
                           "headers": [[n, v] for n, v in self.headers.items()],
                           "body": body.decode("utf-8", "replace")})
        with self.server.log_lock:
            sys.stdout.write(line + "\n")
            sys.stdout.flush()

    def _read_body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            body = b""
            while len(body) <= MAX_BODY:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if not size:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    break
                body += self.rfile.read(size)
                self.rfile.readline()
            return body
        return self.rfile.read(min(int(self.headers.get("Content-Length") or 0), MAX_BODY))

    def _decoded(self, body: bytes) -> bytes:
        """``body`` gzip-decoded when it says it is (as a lenient server would), at most ``MAX_BODY``."""
        if "gzip" not in self.headers.get("Content-Encoding", "").lower():
            return body
        try:
            return zlib.decompressobj(wbits=31).decompress(body, MAX_BODY)
        except zlib.error:
            return body

    def _send(self, status: int, kind: str, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        body = self._decoded(self._read_body())
        self._record(body)
        status, reply = answers(body)
        if reply is None:
            return self._send(status, "application/json", b"")
        data = json.dumps(reply).encode()
        accept = self.headers.get("Accept", "")
        if "text/event-stream" in accept and "application/json" not in accept:
            return self._send(status, "text/event-stream", b"event: message\ndata: " + data + b"\n\n")
        self._send(status, "application/json", data)

    def _other(self) -> None:
        self._record(self._read_body())
        self._send(405, "application/json", b'{"error": "POST only"}')

    do_GET = do_PUT = do_DELETE = do_PATCH = _other


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="mcp_server")
    parser.add_argument("--listen", required=True, metavar="HOST:PORT")
    parser.add_argument("--tls", required=True, metavar="PEM", help="the certificate chain and key")
    parser.add_argument("--log", action="store_true", help="print each request as a JSON line")
    options = parser.parse_args(argv)
    host, _, port = options.listen.rpartition(":")
    server = Server((host, int(port)), Handler)
    server.log = options.log
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(options.tls)
    # The handshake in each request's thread, not in the accept loop: a client that never speaks TLS (a
    # plain HTTP request the gate might pass on) holds only its own thread.
    server.socket = context.wrap_socket(server.socket, server_side=True, do_handshake_on_connect=False)
    print(f"{SERVING} https://{host}:{server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main(sys.argv[1:])
