"""The stub Messages API steered by the conversation: a `run: ...` prompt becomes a Bash tool call, and a
tool result is reported back, as real Claude Code needs to run a tool against it."""

from __future__ import annotations

import asyncio
import json
import ssl
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from claude_bottle.cli import cli
from claude_bottle.errors import ConfigError
from claude_bottle.gate.ca import RunCA
from claude_bottle.policy.hosts import Allowlist
from claude_bottle.stub import DEFAULT_TEXT, StubUpstream, answer_block

BASH = {"name": "Bash", "description": "Run a shell command", "input_schema": {"type": "object"}}


def request(*messages: dict[str, Any], tools: tuple[dict[str, Any], ...] = (BASH,), stream: bool = True
            ) -> dict[str, Any]:
    return {"model": "claude-test", "max_tokens": 100, "stream": stream, "tools": list(tools),
            "messages": list(messages)}


def user(*blocks: dict[str, Any] | str) -> dict[str, Any]:
    return {"role": "user", "content": [{"type": "text", "text": b} if isinstance(b, str) else b for b in blocks]}


ASKED = {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "Bash",
                                           "input": {"command": "echo hi"}}]}


async def post(stub: StubUpstream, payload: dict[str, Any]) -> bytes:
    def call() -> bytes:
        req = urllib.request.Request(f"{stub.url}/v1/messages", data=json.dumps(payload).encode(),
                                     headers={"content-type": "application/json"})
        with urllib.request.urlopen(req, timeout=5) as response:
            return bytes(response.read())

    return await asyncio.to_thread(call)


def events(body: bytes) -> list[tuple[str, dict[str, Any]]]:
    frames = []
    for frame in body.decode().split("\n\n"):
        fields = dict(line.split(": ", 1) for line in frame.splitlines() if line.startswith(("event:", "data:")))
        if fields:
            frames.append((fields["event"], json.loads(fields["data"])))
    return frames


def test_a_run_line_becomes_a_bash_call() -> None:
    block = answer_block(request(user("<system-reminder>x</system-reminder>", "please\nrun: ls -l /tmp ")), "t")
    assert block["type"] == "tool_use" and block["name"] == "Bash" and block["id"].startswith("toolu_")
    assert block["input"]["command"] == "ls -l /tmp" and block["input"]["description"]


def test_a_call_line_calls_any_offered_tool_by_name_with_its_input() -> None:
    mcp_tool = {"name": "mcp__tracker__get_issue", "input_schema": {"type": "object"}}
    block = answer_block(request(user('call: mcp__tracker__get_issue {"number": 7}'), tools=(BASH, mcp_tool)), "t")
    assert (block["type"], block["name"], block["input"]) == ("tool_use", "mcp__tracker__get_issue", {"number": 7})
    assert answer_block(request(user("call: mcp__tracker__delete_issue {}"), tools=(BASH, mcp_tool)), "t") == \
        {"type": "text", "text": "t"}, "a tool not offered is not called"
    assert answer_block(request(user("call: mcp__tracker__get_issue {not json"), tools=(mcp_tool,)), "t")["type"] \
        == "text"


def test_a_plain_string_prompt_counts_too() -> None:
    block = answer_block(request({"role": "user", "content": "run: true"}), "t")
    assert block["input"] == {"command": "true", "description": block["input"]["description"]}


def test_no_bash_offered_no_tool_call() -> None:
    assert answer_block(request(user("run: true"), tools=()), "t") == {"type": "text", "text": "t"}


def test_only_the_last_user_message_counts() -> None:
    payload = request(user("run: true"), {"role": "assistant", "content": "ok"}, user("say hi"))
    assert answer_block(payload, "t") == {"type": "text", "text": "t"}


@pytest.mark.parametrize("content", ["\n  tool-ran\nsecond line", [{"type": "text", "text": "tool-ran\nmore"}]])
def test_a_tool_result_is_reported_with_its_first_line(content: str | list[dict[str, str]]) -> None:
    payload = request(user("run: echo tool-ran"), ASKED,
                      user({"type": "tool_result", "tool_use_id": "toolu_1", "content": content}))
    assert answer_block(payload, "t") == {"type": "text", "text": "Tool said: tool-ran"}


TOOL_SEARCH = {"name": "ToolSearch", "description": "Load deferred tools", "input_schema": {"type": "object"}}
WEB_SEARCH = {"name": "WebSearch", "description": "Search the web", "input_schema": {"type": "object"}}


def test_a_deferred_tool_is_loaded_with_tool_search_then_called() -> None:
    asked = user("search: claude bottle")
    first = answer_block(request(asked, tools=(BASH, TOOL_SEARCH)), "t")
    assert first["name"] == "ToolSearch" and first["input"] == {"query": "select:WebSearch", "max_results": 1}
    loaded = user({"type": "tool_result", "tool_use_id": first["id"],
                   "content": [{"type": "tool_reference", "tool_name": "WebSearch"}]})
    searched = {"role": "assistant", "content": [first]}
    second = answer_block(request(asked, searched, loaded, tools=(BASH, TOOL_SEARCH, WEB_SEARCH)), "t")
    assert second["name"] == "WebSearch" and second["input"] == {"query": "claude bottle"}
    # still not offered after the search: no loop, the search's result is reported
    third = answer_block(request(asked, searched, loaded, tools=(BASH, TOOL_SEARCH)), "t")
    assert third == {"type": "text", "text": "Tool said: (no output)"}


def test_an_empty_tool_result_says_so() -> None:
    payload = request(user("run: true"), ASKED, user({"type": "tool_result", "tool_use_id": "toolu_1", "content": ""}))
    assert answer_block(payload, "t")["text"] == "Tool said: (no output)"


async def test_tool_call_streams_as_input_json_deltas(stub: StubUpstream) -> None:
    frames = events(await post(stub, {**request(user("run: echo 'a \"b\"' | tee /tmp/x")),
                                      "stub": {"events": 4}}))
    names = [name for name, _ in frames]
    assert names == ["message_start", "content_block_start", *["content_block_delta"] * 4, "content_block_stop",
                     "message_delta", "message_stop"]
    start = frames[1][1]["content_block"]
    assert (start["type"], start["name"], start["input"]) == ("tool_use", "Bash", {})
    assert start["id"].startswith("toolu_")
    deltas = [data["delta"] for name, data in frames if name == "content_block_delta"]
    assert {d["type"] for d in deltas} == {"input_json_delta"}
    assert json.loads("".join(d["partial_json"] for d in deltas))["command"] == "echo 'a \"b\"' | tee /tmp/x"
    assert frames[-2][1]["delta"]["stop_reason"] == "tool_use"


async def test_tool_call_without_streaming(stub: StubUpstream) -> None:
    message = json.loads(await post(stub, request(user("run: date"), stream=False)))
    assert message["stop_reason"] == "tool_use"
    (block,) = message["content"]
    assert (block["type"], block["name"], block["input"]["command"]) == ("tool_use", "Bash", "date")


async def test_tool_result_answer_streams_as_text(stub: StubUpstream) -> None:
    payload = request(user("run: echo tool-ran"), ASKED,
                      user({"type": "tool_result", "tool_use_id": "toolu_1", "content": "tool-ran"}))
    frames = events(await post(stub, payload))
    text = "".join(data["delta"]["text"] for name, data in frames if name == "content_block_delta")
    assert text == "Tool said: tool-ran"
    assert frames[-2][1]["delta"]["stop_reason"] == "end_turn"


async def test_other_prompts_still_get_the_default_text(stub: StubUpstream) -> None:
    frames = events(await post(stub, request(user("say hi"))))
    assert "".join(data["delta"]["text"] for name, data in frames if name == "content_block_delta") == DEFAULT_TEXT


def test_the_stub_refuses_a_tls_file_it_cannot_load(tmp_path: Path) -> None:
    bad = tmp_path / "tls.pem"
    bad.write_text("not a certificate\n")
    result = CliRunner().invoke(cli, ["stub-upstream", "--listen", "127.0.0.1:0", "--tls", str(bad)])
    assert isinstance(result.exception, ConfigError)  # main() turns it into one line and exit code 2
    assert str(result.exception).startswith(f"--tls {bad}: cannot load a certificate chain and key")


async def test_the_stub_serves_https_with_a_chain_and_key_from_one_file(tmp_path: Path) -> None:
    ca = RunCA.generate(Allowlist.parse(["127.0.0.1"]).patterns)
    chain = tmp_path / "tls.pem"
    chain.write_bytes(ca.issue("127.0.0.1"))
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(chain)
    async with StubUpstream(tls=tls) as stub:
        def call() -> bytes:
            context = ssl.create_default_context(cadata=ca.certificate_pem.decode())
            with urllib.request.urlopen(f"{stub.url}/v1/models", timeout=5, context=context) as response:
                return bytes(response.read())

        assert b"stub-model" in await asyncio.to_thread(call)
