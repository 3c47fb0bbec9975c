"""DLP through the encodings a server undoes, on a gate on loopback (plain HTTP through the proxy, and the API
route): compressed request bodies, JSON string escapes, percent-escapes twice; a bomb and an encoding the gate
cannot undo are refused, and nothing of a refused request completes upstream."""

from __future__ import annotations

import gzip
import json
import zlib

import brotli
import pytest

from claude_bottle.stub import StubUpstream
from tests.conftest import GateFactory
from tests.gate import test_request_filters
from tests.gate.test_request_filters import GITHUB_TOKEN, absolute, plain_gate
from tests.helpers import exchange, messages_request, parse_head

pytestmark = pytest.mark.asyncio
plain = test_request_filters.plain  # the plain-HTTP server fixture


def json_escaped(value: str) -> str:
    return "".join(f"\\u{ord(c):04x}" for c in value)


def percent_twice(value: str) -> str:
    return "".join(f"%25{ord(c):02X}" for c in value)


def compressed(coding: str, data: bytes) -> bytes:
    """``data`` in ``coding``: one of gzip, deflate, br, or several applied in order (``gzip, br``)."""
    for one in coding.split(", "):
        data = gzip.compress(data) if one == "gzip" else brotli.compress(data) if one == "br" else zlib.compress(data)
    return data


@pytest.mark.parametrize("coding", ["gzip", "deflate", "br", "gzip, br"])
async def test_a_compressed_body_carrying_a_secret_is_refused_and_a_clean_one_goes_up_as_sent(
        make_gate: GateFactory, plain: StubUpstream, coding: str) -> None:
    async with plain_gate(make_gate, plain.port) as gate:
        leak = compressed(coding, json.dumps({"note": gate.token, "pad": "x" * 3000}).encode())
        clean = compressed(coding, json.dumps({"note": "nothing to see"}).encode())
        header = f"Content-Encoding: {coding}\r\n"
        refused = parse_head(await exchange(gate.proxy, absolute("POST", plain.port, "/up", leak, header)))
        passed = parse_head(await exchange(gate.proxy, absolute("POST", plain.port, "/up", clean, header)))
        records = gate.records()
    assert refused[0] == 403
    assert refused[1]["x-deny-reason"].endswith(f"DLP rule held-secret (with its {coding} undone)")
    assert passed[0] == 404, "the stub answered"
    assert [r.body for r in plain.requests] == [clean], "the body goes up compressed, as sent"
    assert records[0]["rule"] == "[dlp] held-secret"


async def test_a_chunked_gzip_upload_is_scanned_as_it_streams(make_gate: GateFactory, plain: StubUpstream) -> None:
    async with plain_gate(make_gate, plain.port) as gate:
        body = gzip.compress(b"x" * 100_000 + b" " + GITHUB_TOKEN.encode() + b" " + b"y" * 100_000)
        chunks = b"".join(f"{len(body[i:i + 4096]):x}\r\n".encode() + body[i:i + 4096] + b"\r\n"
                          for i in range(0, len(body), 4096))
        host = f"plain.example.test:{plain.port}"
        request = (f"POST http://{host}/up HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n"
                   "Content-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n").encode() + chunks + b"0\r\n\r\n"
        status, headers = parse_head(await exchange(gate.proxy, request))
    assert status == 403 and headers["x-deny-reason"].endswith("DLP rule github-token (with its gzip undone)")
    assert plain.requests == []


@pytest.mark.parametrize("coding", ["gzip", "br", "br, gzip"])
async def test_a_decompression_bomb_is_refused_not_scanned_forever(make_gate: GateFactory, plain: StubUpstream,
                                                                    coding: str) -> None:
    bomb = compressed(coding, bytes(20 * 1024 * 1024))  # 20 KB or far less, 20 MiB decoded
    async with plain_gate(make_gate, plain.port) as gate:
        status, headers = parse_head(await exchange(
            gate.proxy, absolute("POST", plain.port, "/up", bomb, f"Content-Encoding: {coding}\r\n"), 10))
    assert status == 413 and "decompression bomb" in headers["x-deny-reason"]
    assert plain.requests == []


@pytest.mark.parametrize(("header", "status", "words"), [
    ("Content-Encoding: zstd\r\n", 415, "cannot decode"),
    ("Content-Encoding: gzip\r\n", 400, "not valid gzip"),
    ("Content-Encoding: br\r\n", 400, "not valid br"),
], ids=["unknown-coding", "corrupt", "corrupt-br"])
async def test_a_body_the_gate_cannot_decode_is_refused(make_gate: GateFactory, plain: StubUpstream, header: str,
                                                        status: int, words: str) -> None:
    async with plain_gate(make_gate, plain.port) as gate:
        answer = parse_head(await exchange(gate.proxy, absolute("POST", plain.port, "/up", b"\x8b\x1fnot it", header)))
    assert answer[0] == status and words in answer[1]["x-deny-reason"]
    assert plain.requests == []


@pytest.mark.parametrize("where", ["json body", "url"])
@pytest.mark.parametrize("encoding", ["json-escaped", "percent-twice"])
async def test_a_secret_in_an_encoding_the_server_undoes_is_refused(make_gate: GateFactory, plain: StubUpstream,
                                                                   where: str, encoding: str) -> None:
    async with plain_gate(make_gate, plain.port) as gate:
        encoded = (json_escaped if encoding == "json-escaped" else percent_twice)(gate.token)
        if where == "url":
            request = absolute("GET", plain.port, f"/q?s={encoded}")
        else:
            request = absolute("POST", plain.port, "/up", ('{"note": "' + encoded + '"}').encode())
        status, headers = parse_head(await exchange(gate.proxy, request))
    assert status == 403 and headers["x-deny-reason"].endswith("DLP rule held-secret")
    assert plain.requests == []


async def test_the_api_route_refuses_a_json_escaped_token_and_passes_ordinary_escapes(
        make_gate: GateFactory, stub: StubUpstream) -> None:
    async with make_gate() as gate:
        ordinary = await exchange(gate.api, messages_request(
            {"model": "m", "messages": [{"role": "user", "content": "colour \x1b[31mred\x1b[0m caf\u00e9 a/b"}]}))
        raw = messages_request({"model": "m", "messages": [{"role": "user", "content": "TOKEN"}]})
        escaped = raw.replace(b"TOKEN", json_escaped(GITHUB_TOKEN).encode())
        escaped = escaped.replace(b"Content-Length: %d" % (len(raw.split(b"\r\n\r\n", 1)[1])),
                                  b"Content-Length: %d" % (len(escaped.split(b"\r\n\r\n", 1)[1])))
        leaked = await exchange(gate.api, escaped)
    assert parse_head(ordinary)[0] == 200
    assert parse_head(leaked)[0] == 403 and b"DLP rule github-token" in leaked
    assert len(stub.requests) == 1
