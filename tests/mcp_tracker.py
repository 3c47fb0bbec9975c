"""The MCP server of the MCP tests: a tracker built with the official SDK (two read tools, one write tool),
behind a recorder that hands every request to ``record`` and refuses any without the real token.

The gate tests serve it on loopback (``recording(app(), ...)``); the bottle tests copy this file into a
container and run it as a script, the SDK on its path, the token in ``$MCP_TOKEN``."""

from __future__ import annotations

import json
import os
from collections.abc import Awaitable, Callable
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.server.transport_security import TransportSecuritySettings

Asgi = Callable[[Any, Any, Any], Awaitable[None]]


def tracker() -> MCPServer:
    server = MCPServer("tracker")

    @server.tool()
    def search_issues(query: str) -> str:
        """Search the issues."""
        return f"found: {query}"

    @server.tool()
    def get_issue(number: int) -> str:
        """Read one issue."""
        return f"issue {number} is open"

    @server.tool()
    def delete_issue(number: int) -> str:
        """Delete an issue."""
        return f"deleted {number}"

    return server


def app(json_response: bool = False) -> Asgi:
    """The tracker's streamable HTTP app, answering in SSE or (``json_response``) in JSON."""
    made: Asgi = tracker().streamable_http_app(
        stateless_http=True, json_response=json_response,
        transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False))
    return made


def recording(inner: Asgi, authorization: str, record: Callable[[dict[str, Any]], None]) -> Asgi:
    """``inner`` behind a recorder: each HTTP request's method, path, host, authorization and body (bytes) go to
    ``record``; one without ``authorization`` (the whole header value) gets a 401."""
    async def recorder(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await inner(scope, receive, send)
        headers = {k.decode(): v.decode() for k, v in scope["headers"]}
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        record({"method": scope["method"], "path": scope["path"], "host": headers.get("host"),
                "authorization": headers.get("authorization"), "body": body})
        if headers.get("authorization") != authorization:
            await send({"type": "http.response.start", "status": 401, "headers": [(b"content-length", b"0")]})
            return await send({"type": "http.response.body", "body": b""})
        replayed = False

        async def replay() -> Any:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await inner(scope, replay, send)

    return recorder


if __name__ == "__main__":
    import uvicorn

    def log(request: dict[str, Any]) -> None:
        print(json.dumps({**request, "body": request["body"].decode("utf-8", "replace")}), flush=True)

    print("mcp server serving", flush=True)
    uvicorn.run(recording(app(), "Bearer " + os.environ["MCP_TOKEN"], log), host="0.0.0.0", port=8443,
                ssl_certfile="/opt/mcp/cert.pem", ssl_keyfile="/opt/mcp/key.pem", log_level="warning")
