"""A remote MCP server in a real bottle, with real Claude Code: a server built with the official SDK (``mcp``,
copied from the tests' own environment into a container of the gate image) on the tests' network over HTTPS,
recording every request and accepting only the real token, which only the gate holds.

One bottle for the module. Real Claude Code, against the stub Messages API scripted to call an MCP tool
(``call: mcp__tracker__get_issue {...}``), reaches the server through the gate with the real token; the tool
list Claude is offered lacks the denied tools; a denied call sent from the bottle never reaches the server and
is answered with the policy's JSON-RPC error; the sentinel to another host and malformed JSON-RPC are refused.
A call of an offered tool that the gate refuses (a token in its arguments) reaches Claude Code as the tool's
error, with the policy's words, and never the server.
"""

from __future__ import annotations

import importlib.metadata
import json
import re
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker
import pytest
import trustme

from claude_bottle.agent.schema import AgentConfig
from claude_bottle.launch import claude_command
from claude_bottle.runtime.run import Run
from claude_bottle.verify.standins import in_bottle as inside
from tests import mcp_tracker
from tests.bottle.conftest import TEST_LABEL, Upstream, bottle_against, gate_audit
from tests.helpers import tar_archive

pytestmark = pytest.mark.docker
SERVER, OTHER, PORT = "mcp-server", "mcp-other", 8443
# The SDK and what it needs at run time (its requirements, followed), copied as installed here: pure Python,
# or wheels for CPython 3.11 on glibc, which the gate image's Debian Python is. The gate's own venv adds
# cryptography.
ROOTS = ("mcp", "uvicorn")


def sdk_files() -> dict[str, bytes]:
    """The installed files of the SDK and its requirements under ``mcp/site/``, as they are in site-packages."""
    files: dict[str, bytes] = {}
    seen: set[str] = set()
    todo = list(ROOTS)
    while todo:
        name = todo.pop()
        key = re.sub(r"[-_.]+", "-", name).lower()
        if key in seen:
            continue
        seen.add(key)
        try:
            distribution = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue  # an optional or platform-only requirement (pywin32)
        todo += [re.split(r"[ ;<>=!\[~(]", r)[0] for r in distribution.requires or () if "extra ==" not in r]
        for file in distribution.files or ():
            if str(file).startswith("..") or "__pycache__" in str(file):
                continue
            path = Path(str(distribution.locate_file(file)))
            if path.is_file():
                files[f"mcp/site/{file}"] = path.read_bytes()
    return files


@dataclass
class McpServer:
    container: Any
    ca: trustme.CA
    token: str

    def requests(self) -> list[dict[str, Any]]:
        lines = self.container.logs(stdout=True, stderr=False).decode().splitlines()
        return [json.loads(line) for line in lines if line.startswith("{")]

    def calls(self) -> list[str]:
        bodies = [json.loads(r["body"]) for r in self.requests() if r["body"].startswith(("{", "["))]
        flat = [b for body in bodies for b in (body if isinstance(body, list) else [body])]
        return [b["params"]["name"] for b in flat if isinstance(b, dict) and b.get("method") == "tools/call"]


@pytest.fixture(scope="module")
def mcp_server(client: docker.DockerClient, upstream: Upstream, built_images: tuple[str, str]) -> Iterator[McpServer]:
    ca, token = trustme.CA(), "mcp-real-token-" + secrets.token_hex(20)
    leaf = ca.issue_cert(SERVER, OTHER)
    container = client.containers.create(
        built_images[1], command=["/opt/gate/bin/python", "/opt/mcp/server.py"], environment={"MCP_TOKEN": token,
                                                                               "PYTHONPATH": "/opt/mcp/site"},
        name=f"claude-bottle-test-{secrets.token_hex(3)}-mcp", labels={TEST_LABEL: "1"}, network=upstream.network,
        networking_config={upstream.network: client.api.create_endpoint_config(aliases=[SERVER, OTHER])},
        cap_drop=["ALL"], security_opt=["no-new-privileges"], working_dir="/tmp", entrypoint=[], user="65534")
    try:
        container.put_archive("/opt", tar_archive({
            "mcp/server.py": Path(mcp_tracker.__file__).read_bytes(), "mcp/cert.pem": b"".join(b.bytes() for b in leaf.cert_chain_pems),
            "mcp/key.pem": leaf.private_key_pem.bytes(), **sdk_files()}, mode=0o644))
        container.start()
        deadline = time.monotonic() + 60
        while b"mcp server serving" not in container.logs():
            container.reload()
            if container.status == "exited" or time.monotonic() > deadline:
                raise RuntimeError(f"the MCP server did not start: {container.logs().decode()[-3000:]}")
            time.sleep(0.2)
        time.sleep(1)  # uvicorn binds just after the line
        yield McpServer(container, ca, token)
    finally:
        container.remove(force=True)


@pytest.fixture(scope="module")
def bottle(client: docker.DockerClient, upstream: Upstream, mcp_server: McpServer,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    home = tmp_path_factory.mktemp("mcp")
    ca_file = home / "mcp-ca.pem"
    mcp_server.ca.cert_pem.write_to_path(str(ca_file))
    agent = (f'version = 1\nallow = ["{OTHER}:{PORT}"]\nallow_private = ["{upstream.subnet}"]\n'
             f'[mcp.servers.tracker]\nurl = "https://{SERVER}:{PORT}/mcp"\ntools = ["search_*", "get_issue"]\n'
             'deny_tools = ["delete_*"]\ncredential = "tracker"\n'
             f'[credentials.tracker]\nhosts = ["{SERVER}:{PORT}"]\nscheme = "bearer"\nenv = "TEST_MCP_TOKEN"\n')
    with bottle_against(client, upstream, "mcptools", agent, home, (ca_file,),
                        env={"TEST_MCP_TOKEN": mcp_server.token}) as run:
        yield run


def jsonrpc(run: Run, payload: object, host: str = SERVER) -> tuple[int, str]:
    """``payload`` (JSON text or an object) posted from the bottle by curl, as Claude Code would, with the
    bottle's credential for the server (the sentinel its MCP config holds)."""
    body = payload if isinstance(payload, str) else json.dumps(payload)
    sentinel = run.spec.mcp_servers["tracker"]["headers"]["Authorization"]
    return inside(run, f"curl -sS -D - -X POST https://{host}:{PORT}/mcp -H 'Content-Type: application/json' "
                       f"-H 'Accept: application/json, text/event-stream' -H 'Authorization: {sentinel}' "
                       "--data-binary @-", stdin=body)


def test_claude_code_calls_an_allowed_tool_sees_no_denied_one_and_the_gate_refuses_the_rest(
        bottle: Run, mcp_server: McpServer, upstream: Upstream) -> None:
    before = len(upstream.requests())
    command = " ".join(claude_command(AgentConfig()))
    answer = inside(bottle, f"cd /workspace && timeout 150 {command} -p "
                            "'call: mcp__tracker__get_issue {\"number\": 7}' 2>&1")
    messages = [r for r in upstream.requests()[before:] if str(r.get("target", "")).startswith("/v1/messages")]
    config = inside(bottle, "cat ~/.claude.json")[1]
    denied = jsonrpc(bottle, {"jsonrpc": "2.0", "id": 9, "method": "tools/call",
                              "params": {"name": "delete_issue", "arguments": {"number": 1}}})
    malformed = jsonrpc(bottle, '{"method": "tools/call"}')
    elsewhere = jsonrpc(bottle, {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, host=OTHER)
    audit = gate_audit(bottle)
    seen = mcp_server.requests()

    assert answer[0] == 0 and "Tool said: " in answer[1] and "issue 7 is open" in answer[1], answer[1]
    assert mcp_server.calls() == ["get_issue"], "only the allowed call reached the server"
    assert seen and all(r["authorization"] == f"Bearer {mcp_server.token}" for r in seen), \
        "every request the server saw carried the real token, which the gate added"
    assert all(r["host"].startswith(SERVER) for r in seen), "nothing reached the server under another name"
    offered = json.dumps([m.get("tool_names", []) for m in messages])
    assert "mcp__tracker__get_issue" in offered and "mcp__tracker__search_issues" in offered, offered[:2000]
    assert "delete_issue" not in offered, "the tool list Claude was offered lacks the denied tool"

    assert mcp_server.token not in config and "claude-bottle-sentinel-tracker-" in config
    code, reply = denied
    assert code == 0 and "-32001" in reply and "claude-bottle policy" in reply and "deny_tools" in reply, reply
    assert "HTTP/1.1 400" in malformed[1] and "not well-formed JSON-RPC" in malformed[1], malformed[1]
    assert "HTTP/1.1 403" in elsewhere[1] and "DLP rule held-secret" in elsewhere[1], elsewhere[1]
    calls = [r for r in audit if r.get("listener") == "mcp"]  # a line per JSON-RPC message
    assert {"server": "tracker", "method": "tools/call", "tool": "get_issue", "decision": "allow"}.items() <= \
        next(c for c in calls if c.get("tool") == "get_issue").items()
    assert any(c.get("tool") == "delete_issue" and c["decision"] == "deny" for c in calls)
    assert mcp_server.token not in json.dumps(audit)



def test_claude_code_receives_the_policy_error_as_the_tool_error_and_the_server_never_sees_the_call(
        bottle: Run, mcp_server: McpServer) -> None:
    """An offered tool whose call the gate refuses: the model writes a GitHub token into its arguments (the
    prompt holds it JSON-escaped, which the stub's JSON reading undoes, as a model could). The gate answers
    the call with its JSON-RPC error; Claude Code turns it into the tool's error, and its next Messages
    request, which repeats the call's arguments, is refused by DLP too: the token reaches neither side."""
    token = "ghp_" + secrets.token_hex(18)
    escaped = "\\u0067" + token[1:]  # no token in the prompt, for the gate's JSON-unescaped view either
    command = " ".join(claude_command(AgentConfig(), "--output-format", "stream-json", "--verbose"))
    before = len(gate_audit(bottle))
    _, output = inside(bottle, f"cd /workspace && timeout 150 {command} -p "
                               f"'call: mcp__tracker__search_issues {{\"query\": \"{escaped}\"}}' 2>&1")
    audit = gate_audit(bottle)[before:]
    events = [json.loads(line) for line in output.splitlines() if line.startswith("{")]
    results = [block for event in events if event.get("type") == "user"
               for block in event.get("message", {}).get("content", []) if isinstance(block, dict)
               and block.get("type") == "tool_result"]

    assert len(results) == 1 and results[0].get("is_error"), output[-3000:]
    text = json.dumps(results[0].get("content"))
    assert "claude-bottle policy" in text and "DLP rule github-token" in text and "(its arguments)" in text, text
    assert "search_issues" not in mcp_server.calls(), "the refused call never reached the server"
    assert any(line.get("listener") == "mcp" and line.get("tool") == "search_issues" and line["decision"] == "deny"
               and line.get("rule") == "[dlp] github-token" for line in audit), audit
    assert any(line.get("listener") == "api" and line["decision"] == "deny"
               and line.get("rule") == "[dlp] github-token" for line in audit), \
        "the next Messages request carries the call's arguments: refused too"
    assert token not in json.dumps(audit)
