"""Whose fault, by one rule (docs/gate.md, "Whose fault"): a peer that breaks HTTP, goes silent or hangs up is
classified the same way whether it happens in a head or in a body, on the client's side and on the
upstream's. Checked through sockets and the audit."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest

from tests.conftest import GateFactory, RunningGate
from tests.helpers import eventually, parse_head, raw_server, read_all

pytestmark = pytest.mark.asyncio

UPLOAD = "POST /v1/upload HTTP/1.1\r\nHost: gate\r\n"


async def client_sends(gate: RunningGate, data: bytes, close: bool = False, wait: float = 3) -> tuple[bytes, Any]:
    """Send ``data`` to the API listener (and close the sending side with ``close``); what came back, and the
    one audit line."""
    reader, writer = await asyncio.open_connection(gate.api.host, gate.api.port)
    writer.write(data)
    await writer.drain()
    if close:
        writer.close()
        answer = b""
    else:
        answer = await read_all(reader, wait)
        writer.close()
    await eventually(gate.records, what="the audit line")
    (record,) = gate.records()
    return answer, record


# -- the client's side: a request head or body, broken, slow or cut off

@pytest.mark.parametrize(("data", "where"), [
    (b"GET /v1/models HTTP/1.1\r\nHost: gate\r\nContent-Length: 2x\r\n\r\n", "head"),
    (b"POST /v1/messages HTTP/1.1\r\nHost: gate\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\nzz\r\n", "body"),
])
async def test_a_client_that_breaks_http_is_refused_400_in_a_head_or_a_body(make_gate: GateFactory, data: bytes,
                                                                           where: str) -> None:
    async with make_gate() as gate:
        answer, record = await client_sends(gate, data)
    assert parse_head(answer)[0] == 400, where
    assert record["decision"] == "deny" and record["status"] == 400
    assert "malformed request" in record["reason"] and "upstream" not in record["reason"]


@pytest.mark.parametrize(("data", "words"), [
    (UPLOAD.encode() + b"Content-Le", "request head not complete within 0.5s"),
    (UPLOAD.encode() + b"Content-Length: 10\r\n\r\nfour", "client idle too long"),
])
async def test_a_client_that_goes_silent_is_408_in_a_head_or_a_body(make_gate: GateFactory, data: bytes,
                                                                   words: str) -> None:
    async with make_gate(api_paths=("POST /v1/upload",), header_timeout=0.5, idle_timeout=0.5) as gate:
        answer, record = await client_sends(gate, data)
    status, headers = parse_head(answer)
    assert status == 408 and words in headers["x-deny-reason"]
    assert record["decision"] == "error" and record["status"] == 408
    assert words in record["reason"] and "upstream" not in record["reason"]


@pytest.mark.parametrize(("data", "where"), [
    (UPLOAD.encode() + b"Content-Le", "in the middle of a request head"),
    (UPLOAD.encode() + b"Content-Length: 10\r\n\r\nfour", "in the middle of a body"),
])
async def test_a_client_that_hangs_up_went_away_in_a_head_or_a_body(make_gate: GateFactory, data: bytes,
                                                                   where: str) -> None:
    async with make_gate(api_paths=("POST /v1/upload",)) as gate:
        _, record = await client_sends(gate, data, close=True)
    assert record["decision"] == "error" and record["status"] == 0
    assert record["reason"].endswith(f"client went away {where}")


# -- the upstream's side: a response head or body, broken, slow or cut off

async def upstream_answers(make_gate: GateFactory, answer: bytes, hang_up: bool) -> tuple[bytes, Any]:
    """A request through the API listener to an upstream that reads it, sends ``answer``, then hangs up
    (``hang_up``) or stays silent; what the client got, and the audit line."""
    async def origin(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):
            await reader.readuntil(b"\r\n\r\n{}")
            writer.write(answer)
            await writer.drain()
            if hang_up:
                writer.close()
            else:
                await reader.read()

    async with raw_server(origin, "127.0.0.1") as endpoint, \
            make_gate(upstream=f"http://{endpoint}", api_paths=("POST /v1/upload",), idle_timeout=0.5) as gate:
        return await client_sends(gate, UPLOAD.encode() + b"Content-Length: 2\r\n\r\n{}")


@pytest.mark.parametrize(("answer", "sent"), [
    (b"HTTP/1.1 200 OK\r\nContent-Length: 2x\r\n\r\n", 502),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\nzz\r\n", 200),
])
async def test_an_upstream_that_breaks_http_is_502_in_a_head_or_a_body(make_gate: GateFactory, answer: bytes,
                                                                      sent: int) -> None:
    got, record = await upstream_answers(make_gate, answer, hang_up=False)
    assert parse_head(got)[0] == sent  # a response already started is cut by a reset, never completed
    assert record["decision"] == "error" and record["status"] == sent
    assert "upstream broke HTTP/1.1" in record["reason"]


@pytest.mark.parametrize(("answer", "sent"), [
    (b"HTTP/1.1 200 OK\r\nContent-Le", 504),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nfour", 200),
])
async def test_an_upstream_that_goes_silent_is_504_in_a_head_or_a_body(make_gate: GateFactory, answer: bytes,
                                                                      sent: int) -> None:
    got, record = await upstream_answers(make_gate, answer, hang_up=False)
    assert parse_head(got)[0] == sent
    assert record["decision"] == "error" and record["status"] == sent
    assert record["reason"].endswith("upstream stopped responding") and "client" not in record["reason"]


@pytest.mark.parametrize(("answer", "sent", "where"), [
    (b"", 502, "without a response"),
    (b"HTTP/1.1 200 OK\r\nContent-Le", 502, "without a response"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nfour", 200, "in the middle of a body"),
])
async def test_an_upstream_that_hangs_up_is_502_in_a_head_or_a_body(make_gate: GateFactory, answer: bytes,
                                                                   sent: int, where: str) -> None:
    got, record = await upstream_answers(make_gate, answer, hang_up=True)
    assert parse_head(got)[0] == sent
    assert record["decision"] == "error" and record["status"] == sent
    assert record["reason"].endswith(f"upstream closed the connection {where}")
