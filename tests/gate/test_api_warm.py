"""The API listener's contract on a warm pool: a first small exchange is done on the gate's kept-alive client
connection before each case, so the API upstream pool holds an idle connection when the case's requests come,
on that same client connection. Whatever path the gate takes for such a request, a client and the upstream
see what they see on a cold gate: the answer, the audit line, the timeouts, the refusals, the failures.

One gate for the module, in front of an ``Origin`` (tests/api_origin.py), which each request steers by its
``x-origin`` header. Every case checks that its request went over the pooled connection its warm-up left
(else it proved nothing).
"""

from __future__ import annotations

import asyncio
import json
import socket
import struct
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio

from claude_bottle.stub import DEFAULT_TEXT, StubUpstream
from tests.api_origin import BIG, FIRST_EVENTS, LAST_EVENTS, SMALL, Client, Origin, event, read_chunk
from tests.conftest import RunningGate, gate_factory
from tests.helpers import eventually, messages_request

pytestmark = pytest.mark.asyncio(loop_scope="module")

IDLE_TIMEOUT = 1.0  # the module gate's: how long it waits for a silent upstream
BODY_LIMIT = 8192  # and the largest Messages body it takes
# The fields of an audit line that say what happened (not when, nor from which client port).
OUTCOME = ("listener", "method", "target", "path", "decision", "reason", "status", "rule", "side", "bytes_up",
           "bytes_down")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def origin() -> AsyncIterator[Origin]:
    upstream = Origin()
    server = await asyncio.start_server(upstream.serve, upstream.host, 0)
    upstream.port = server.sockets[0].getsockname()[1]
    try:
        yield upstream
    finally:
        server.close()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def gate(origin: Origin) -> AsyncIterator[RunningGate]:
    async with gate_factory(origin.url)(idle_timeout=IDLE_TIMEOUT, max_body_bytes=BODY_LIMIT) as running:
        yield running


@pytest_asyncio.fixture(loop_scope="module")
async def client(gate: RunningGate, origin: Origin) -> AsyncIterator[Client]:
    """A client connection whose warm-up exchange is done: the gate's pool holds that upstream connection."""
    origin.release = asyncio.Event()
    connection = await Client.to(gate)
    try:
        await warm_up(connection, origin)
        yield connection
    finally:
        connection.close()


async def warm_up(client: Client, origin: Origin) -> None:
    before = len(origin.requests)
    assert (await client.ask(extra="x-seq: warm-up\r\n")).status == 200
    assert len(origin.requests) == before + 1


def warm_connection(origin: Origin) -> int:
    """The origin connection the last warm-up went on: the one the pool holds."""
    return [seen for seen in origin.requests if b"x-seq: warm-up" in seen.head][-1].connection


async def new_lines(gate: RunningGate, since: int, count: int) -> list[dict[str, Any]]:
    """The audit lines after the first ``since``, once there are ``count`` of them."""
    await eventually(lambda: len(gate.records()) >= since + count, what=f"{count} audit line(s)")
    return gate.records()[since:]


def outcome(line: dict[str, Any]) -> dict[str, Any]:
    return {name: line.get(name) for name in OUTCOME}


# -- allowed exchanges, one after another on one client connection


async def test_fifty_warm_requests_are_each_answered_and_audited_as_the_cold_first_one() -> None:
    """A gate of its own in front of the stub Messages API: its first request is cold, the fifty after it warm."""
    placeholder = "sk-ant-oat01-placeholder-the-bottle-holds"
    async with StubUpstream() as stub, gate_factory(stub.url)() as running:
        client = await Client.to(running)
        try:
            for _ in range(51):
                answer = await client.ask(extra=f"Authorization: Bearer {placeholder}\r\n")
                assert answer.status == 200
                assert json.loads(answer.body)["content"] == [{"type": "text", "text": DEFAULT_TEXT}]
        finally:
            client.close()
        lines = await new_lines(running, 0, 51)
    assert len(lines) == 51, "one audit line per request"
    cold = outcome(lines[0])
    assert cold["decision"] == "allow" and cold["status"] == 200 and cold["path"] == "/v1/messages"
    assert cold["bytes_up"] == len(json.dumps(SMALL)) and cold["bytes_down"] > 0
    assert [outcome(line) for line in lines[1:]] == [cold] * 50
    assert len(stub.requests) == 51
    assert len({seen.peer for seen in stub.requests}) == 1, "every request after the first went on the pool"
    for seen in stub.requests:
        assert seen.header("authorization") == [f"Bearer {running.token}"]
        assert placeholder.encode() not in b"".join(value for _, value in seen.headers)
        assert seen.json() == SMALL


async def test_spaced_requests_restart_the_idle_timer_and_an_idle_connection_is_closed_unaudited(
        origin: Origin) -> None:
    """Requests 0.6 x the header timeout apart for over twice that timeout are all served; then, idle past
    it, the connection is closed, with nothing audited for the idle."""
    timeout = 1.2  # the gap it leaves (0.48s) is what a stalled test process may lose and still pass
    async with gate_factory(origin.url)(header_timeout=timeout, idle_timeout=IDLE_TIMEOUT) as running:
        client = await Client.to(running)
        try:
            await warm_up(client, origin)
            loop = asyncio.get_running_loop()
            started, served = loop.time(), 0
            while loop.time() - started <= 2 * timeout and served < 10:
                await asyncio.sleep(0.6 * timeout)
                assert (await client.ask()).status == 200, f"request {served + 1} was not served"
                served += 1
            assert origin.requests[-1].connection == warm_connection(origin)
            idle_from = loop.time()
            assert await client.closed_by_gate(3 * timeout), "the gate answered nothing, yet sent bytes"
            idled = loop.time() - idle_from
        finally:
            client.close()
        lines = await new_lines(running, 0, served + 1)
        await asyncio.sleep(0.1)  # a line for the idle, if one came, would be written as the connection ends
        assert len(running.records()) == served + 1, "the idle connection's end was audited"
    assert served >= 4
    assert 0.8 * timeout <= idled < 2.5 * timeout, f"closed after {idled:.2f}s idle, the timeout is {timeout}s"
    assert all(line["decision"] == "allow" and line["status"] == 200 for line in lines)


async def test_pipelined_requests_are_answered_and_audited_in_order(gate: RunningGate, origin: Origin,
                                                                    client: Client) -> None:
    mark = len(gate.records())
    first = {**SMALL, "metadata": {"user_id": "first"}}
    second = {**SMALL, "metadata": {"user_id": "the second, longer"}}
    client.send(messages_request(first, "x-seq: 1\r\n", keep_alive=True)
                + messages_request(second, "x-seq: 2\r\n", keep_alive=True))
    answers = [await client.response(), await client.response()]
    assert [(a.status, json.loads(a.body)["seq"]) for a in answers] == [(200, "1"), (200, "2")]
    lines = await new_lines(gate, mark, 2)
    assert [(line["decision"], line["bytes_up"]) for line in lines] == \
        [("allow", len(json.dumps(first))), ("allow", len(json.dumps(second)))]
    assert [json.loads(seen.body) for seen in origin.requests[-2:]] == [first, second]
    assert origin.requests[-2].connection == warm_connection(origin)


async def test_pipelined_requests_answered_while_the_client_is_not_reading_arrive_whole_and_in_order(
        gate: RunningGate, origin: Origin, client: Client) -> None:
    """Large and small answers in turn pile up while the client reads nothing: the gate waits for it (it
    stops reading the client's requests meanwhile), and each answer arrives whole, in order."""
    mark, count = len(gate.records()), 16
    client.send(b"".join(messages_request(SMALL, f"x-origin: {'big' if n % 2 else 'ok'}\r\nx-seq: {n}\r\n",
                                          keep_alive=True) for n in range(count)))
    await client.writer.drain()
    await asyncio.sleep(0.3)  # the answers pile up in the gate and the sockets
    answers = [await client.response() for _ in range(count)]
    assert [a.status for a in answers] == [200] * count
    assert [a.body == BIG if n % 2 else json.loads(a.body)["seq"] == str(n) for n, a in enumerate(answers)] \
        == [True] * count
    lines = await new_lines(gate, mark, count)
    assert [line["bytes_down"] for line in lines] == [len(a.body) for a in answers]


async def test_a_large_whole_response_is_delivered_intact(gate: RunningGate, origin: Origin,
                                                          client: Client) -> None:
    mark = len(gate.records())
    answer = await client.ask(extra="x-origin: big\r\n")
    assert answer.status == 200 and answer.headers["content-length"] == str(len(BIG))
    assert answer.body == BIG
    assert origin.requests[-1].connection == warm_connection(origin)
    assert (await client.ask()).status == 200, "the connection serves on after it"
    big, _ = await new_lines(gate, mark, 2)
    assert (big["decision"], big["status"], big["bytes_down"]) == ("allow", 200, len(BIG))


async def test_a_streamed_response_reaches_the_client_before_the_upstream_ends_it(
        gate: RunningGate, origin: Origin, client: Client) -> None:
    mark = len(gate.records())
    client.send(messages_request({**SMALL, "stream": True}, "x-origin: sse\r\n", keep_alive=True))
    status, headers = await client.head()
    assert status == 200 and headers["content-type"] == "text/event-stream"
    received = b""
    async with asyncio.timeout(3):
        while received.count(b"\n\n") < FIRST_EVENTS:
            received += await read_chunk(client.reader)
    assert not origin.sent_last, "the client got the first events only once the stream had ended"
    origin.release.set()
    async with asyncio.timeout(5):
        while chunk := await read_chunk(client.reader):
            received += chunk
    assert received == b"".join(event(n) for n in range(FIRST_EVENTS + LAST_EVENTS))
    assert origin.requests[-1].connection == warm_connection(origin)
    (line,) = await new_lines(gate, mark, 1)
    assert (line["decision"], line["status"], line["bytes_down"]) == ("allow", 200, len(received))
    assert (await client.ask()).status == 200, "the connection serves on after the stream"


@pytest.mark.parametrize("script", ["interim", "split"])
async def test_a_response_not_whole_at_once_is_delivered_whole(gate: RunningGate, origin: Origin, client: Client,
                                                               script: str) -> None:
    """An interim 103 first (hop-by-hop: the client never sees it), or a final response in two pieces."""
    mark = len(gate.records())
    answer = await client.ask(extra=f"x-origin: {script}\r\nx-seq: {script}\r\n")
    assert answer.status == 200 and json.loads(answer.body)["seq"] == script
    assert "link" not in answer.headers
    assert origin.requests[-1].connection == warm_connection(origin)
    assert (await client.ask()).status == 200, "the connection serves on after it"
    line, _ = await new_lines(gate, mark, 2)
    assert (line["decision"], line["status"], line["bytes_down"]) == ("allow", 200, len(answer.body))


@pytest.mark.parametrize("framing", ["content-length", "chunked"])
async def test_a_request_body_in_pieces_goes_up_whole(gate: RunningGate, origin: Origin, client: Client,
                                                      framing: str) -> None:
    """The head and part of the body, then the rest: not a whole request when it first arrives."""
    mark = len(gate.records())
    body = json.dumps(SMALL).encode()
    half = len(body) // 2
    if framing == "chunked":
        head = b"Transfer-Encoding: chunked\r\n\r\n"
        pieces = [b"%x\r\n%b\r\n" % (half, body[:half]), b"%x\r\n%b\r\n0\r\n\r\n" % (len(body) - half, body[half:])]
    else:
        head = b"Content-Length: %d\r\n\r\n" % len(body)
        pieces = [body[:half], body[half:]]
    client.send(b"POST /v1/messages HTTP/1.1\r\nHost: gate\r\nContent-Type: application/json\r\nx-seq: pieces\r\n"
                + head + pieces[0])
    await client.writer.drain()
    await asyncio.sleep(0.1)
    client.send(pieces[1])
    answer = await client.response()
    assert answer.status == 200 and json.loads(answer.body)["seq"] == "pieces"
    assert origin.requests[-1].body == body
    assert origin.requests[-1].connection == warm_connection(origin)
    (line,) = await new_lines(gate, mark, 1)
    assert (line["decision"], line["status"], line["bytes_up"]) == ("allow", 200, len(body))


async def test_a_whole_request_with_the_start_of_the_next_in_one_write(gate: RunningGate, origin: Origin,
                                                                       client: Client) -> None:
    """What follows a whole request in the same read is the next request's start, kept for it."""
    mark = len(gate.records())
    second = messages_request(SMALL, "x-seq: 2\r\n", keep_alive=True)
    client.send(messages_request(SMALL, "x-seq: 1\r\n", keep_alive=True) + second[:40])
    first = await client.response()
    await asyncio.sleep(0.1)
    client.send(second[40:])
    answers = [first, await client.response()]
    assert [(a.status, json.loads(a.body)["seq"]) for a in answers] == [(200, "1"), (200, "2")]
    assert [seen.connection for seen in origin.requests[-2:]] == [warm_connection(origin)] * 2
    lines = await new_lines(gate, mark, 2)
    assert [(line["decision"], line["status"]) for line in lines] == [("allow", 200)] * 2


# -- the client's own choices


async def test_connection_close_from_the_client_is_answered_then_closed(gate: RunningGate, origin: Origin,
                                                                        client: Client) -> None:
    mark = len(gate.records())
    client.send(messages_request(SMALL, "x-seq: last\r\n"))  # Connection: close
    answer = await client.response()
    assert answer.status == 200 and json.loads(answer.body)["seq"] == "last"
    assert answer.headers["connection"] == "close"
    assert await client.closed_by_gate()
    assert origin.requests[-1].connection == warm_connection(origin)
    (line,) = await new_lines(gate, mark, 1)
    assert (line["decision"], line["status"]) == ("allow", 200)


async def test_expect_100_continue_is_answered_and_the_body_goes_up_whole(gate: RunningGate, origin: Origin,
                                                                          client: Client) -> None:
    mark = len(gate.records())
    body = json.dumps(SMALL).encode()
    client.send(b"POST /v1/messages HTTP/1.1\r\nHost: gate\r\nContent-Type: application/json\r\n"
                b"Expect: 100-continue\r\nx-seq: continued\r\nContent-Length: %d\r\n\r\n" % len(body))
    assert (await client.head(3))[0] == 100
    client.send(body)
    answer = await client.response()
    assert answer.status == 200 and json.loads(answer.body)["seq"] == "continued"
    seen = origin.requests[-1]
    assert seen.body == body and b"expect" not in seen.head.lower()
    assert seen.connection == warm_connection(origin)
    (line,) = await new_lines(gate, mark, 1)
    assert (line["decision"], line["status"], line["bytes_up"]) == ("allow", 200, len(body))


# -- refusals: as on a cold connection


def refused_request(kind: str, token: str) -> bytes:
    if kind == "a held secret in the body":
        return messages_request({**SMALL, "metadata": {"user_id": token}}, keep_alive=True)
    if kind == "a path the API route refuses":
        return b"GET /v1/organizations/me HTTP/1.1\r\nHost: gate\r\n\r\n"
    if kind == "a Messages body over the size limit":
        return messages_request({**SMALL, "metadata": {"user_id": "x" * BODY_LIMIT}}, keep_alive=True)
    mcp = [{"type": "url", "url": "https://collector.example/sse", "name": "c"}]
    return messages_request({**SMALL, "mcp_servers": mcp}, keep_alive=True)


@pytest.mark.parametrize("kind", ["a held secret in the body", "a path the API route refuses",
                                  "a Messages body the policy refuses", "a Messages body over the size limit"])
async def test_a_refusal_on_a_warm_connection_is_the_cold_one_and_the_connection_serves_on(
        gate: RunningGate, origin: Origin, client: Client, kind: str) -> None:
    """Each refusal is answered and audited as on a fresh gate; the connection serves on, except after a body
    over the limit (413), the rest of which a gate never reads: then it closes."""
    async with gate_factory(origin.url)(token=gate.token, max_body_bytes=BODY_LIMIT) as cold_gate:
        cold_client = await Client.to(cold_gate)
        try:
            cold_client.send(refused_request(kind, gate.token))
            cold = await cold_client.response()
        finally:
            cold_client.close()
        (cold_line,) = await new_lines(cold_gate, 0, 1)
    mark, upstream_before = len(gate.records()), len(origin.requests)
    client.send(refused_request(kind, gate.token))
    warm = await client.response()
    (warm_line,) = await new_lines(gate, mark, 1)

    too_large = kind == "a Messages body over the size limit"
    assert warm.status == cold.status == (413 if too_large else 403)
    assert warm.headers == cold.headers and warm.body == cold.body
    assert outcome(warm_line) == outcome(cold_line) and warm_line["decision"] == "deny"
    assert len(origin.requests) == upstream_before, "a refused request reached the upstream"
    if too_large:
        assert warm.headers["connection"] == "close" and await client.closed_by_gate()
        return
    assert "connection" not in warm.headers, "the gate keeps a connection after a refusal whose body it read"
    assert (await client.ask(extra="x-seq: after\r\n")).status == 200
    assert origin.requests[-1].connection == warm_connection(origin), "the pooled connection served on"


@pytest.mark.parametrize("script", ["echo", "echo-header", "echo-name"])
async def test_a_reflected_credential_is_refused_on_a_warm_connection_as_on_a_cold_one(
        gate: RunningGate, origin: Origin, client: Client, script: str) -> None:
    extra = f"x-origin: {script}\r\n"
    async with gate_factory(origin.url)(token=gate.token) as cold_gate:
        cold_client = await Client.to(cold_gate)
        try:
            cold = await cold_client.ask(extra=extra)
        finally:
            cold_client.close()
        (cold_line,) = await new_lines(cold_gate, 0, 1)
    mark = len(gate.records())
    warm = await client.ask(extra=extra)
    (warm_line,) = await new_lines(gate, mark, 1)
    assert origin.requests[-1].connection == warm_connection(origin)
    for form in (gate.token.encode(), gate.token.encode().hex().encode()):
        assert form not in warm.body + json.dumps(warm.headers).encode()
    assert (warm.status, warm.headers, warm.body) == (cold.status, cold.headers, cold.body)
    assert outcome(warm_line) == outcome(cold_line)
    assert warm.status == 502 and warm.headers["connection"] == "close" and await client.closed_by_gate()
    assert warm_line["decision"] == "error" and "credential" in warm_line["reason"]


# -- the upstream's failures, on the pooled connection


async def test_a_silent_upstream_is_504_within_about_the_idle_timeout(gate: RunningGate, origin: Origin,
                                                                      client: Client) -> None:
    mark = len(gate.records())
    loop = asyncio.get_running_loop()
    started = loop.time()
    answer = await client.ask(extra="x-origin: silent\r\n")
    waited = loop.time() - started
    assert answer.status == 504 and "upstream stopped responding" in answer.headers["x-deny-reason"]
    assert IDLE_TIMEOUT * 0.9 <= waited < IDLE_TIMEOUT + 2, f"answered after {waited:.2f}s"
    assert origin.requests[-1].connection == warm_connection(origin)
    assert answer.headers["connection"] == "close" and await client.closed_by_gate()
    (line,) = await new_lines(gate, mark, 1)
    assert (line["decision"], line["status"], line["side"]) == ("error", 504, "upstream")


async def test_answers_late_by_most_of_the_idle_timeout_are_each_waited_for_in_full(
        gate: RunningGate, origin: Origin, client: Client) -> None:
    """Each wait for a response has the whole idle timeout, however the waits before it on the same upstream
    connection were timed: the second answer is still awaited when the first wait's timeout would have ended."""
    mark, delay = len(gate.records()), 0.6 * IDLE_TIMEOUT
    for n in range(2):
        answer = await client.ask(extra=f"x-origin: slow\r\nx-delay: {delay}\r\nx-seq: {n}\r\n")
        assert answer.status == 200 and json.loads(answer.body)["seq"] == str(n)
    assert [seen.connection for seen in origin.requests[-2:]] == [warm_connection(origin)] * 2
    lines = await new_lines(gate, mark, 2)
    assert [(line["decision"], line["status"]) for line in lines] == [("allow", 200)] * 2


async def test_an_upstream_that_hangs_up_without_answering_is_502(gate: RunningGate, origin: Origin,
                                                                  client: Client) -> None:
    mark = len(gate.records())
    answer = await client.ask(extra="x-origin: hangup\r\n")
    assert answer.status == 502
    assert origin.requests[-1].connection == warm_connection(origin)
    assert answer.headers["connection"] == "close" and await client.closed_by_gate()
    (line,) = await new_lines(gate, mark, 1)
    assert (line["decision"], line["status"], line["side"]) == ("error", 502, "upstream")
    assert line["reason"].endswith("upstream closed the connection without a response")


async def test_an_upstream_answer_with_connection_close_is_delivered_and_the_next_request_goes_fresh(
        gate: RunningGate, origin: Origin, client: Client) -> None:
    mark = len(gate.records())
    answer = await client.ask(extra="x-origin: close\r\nx-seq: closing\r\n")
    assert answer.status == 200 and json.loads(answer.body)["seq"] == "closing"
    assert "connection" not in answer.headers, "the upstream's Connection header is its own hop's"
    closed = origin.requests[-1].connection
    assert closed == warm_connection(origin)
    again = await client.ask(extra="x-seq: again\r\n")
    assert again.status == 200 and json.loads(again.body)["seq"] == "again"
    assert origin.requests[-1].connection != closed, "a request went on a connection the upstream closed"
    lines = await new_lines(gate, mark, 2)
    assert [(line["decision"], line["status"]) for line in lines] == [("allow", 200)] * 2


async def test_a_pooled_connection_the_upstream_closed_while_idle_is_not_used(gate: RunningGate, origin: Origin,
                                                                              client: Client) -> None:
    mark = len(gate.records())
    assert (await client.ask(extra="x-origin: then-close\r\n")).status == 200
    closed = origin.requests[-1].connection
    assert closed == warm_connection(origin)
    await asyncio.sleep(0.2)  # the upstream has closed it, idle in the pool
    again = await client.ask(extra="x-seq: again\r\n")
    assert again.status == 200 and json.loads(again.body)["seq"] == "again"
    assert origin.requests[-1].connection != closed
    lines = await new_lines(gate, mark, 2)
    assert [(line["decision"], line["status"]) for line in lines] == [("allow", 200)] * 2


async def test_a_stopping_gate_lets_an_exchange_in_flight_finish(origin: Origin) -> None:
    """The gate stops while a warm request waits for its answer at the upstream: the answer, due within the
    drain time, still reaches the client, with its one line; then the connection ends, and with it the stop,
    long before the drain time is out."""
    loop, origin.release = asyncio.get_running_loop(), asyncio.Event()
    async with gate_factory(origin.url)(drain_seconds=10) as running:
        client = await Client.to(running)
        await warm_up(client, origin)
        before = len(origin.requests)
        client.send(messages_request(SMALL, "x-origin: hold\r\nx-seq: in flight\r\n", keep_alive=True))
        await eventually(lambda: len(origin.requests) > before, what="the request at the upstream")
        loop.call_later(0.1, origin.release.set)
        stopping = loop.time()
    stopped = loop.time() - stopping
    try:
        answer = await client.response()
        assert answer.status == 200 and json.loads(answer.body)["seq"] == "in flight"
        assert await client.closed_by_gate()
    finally:
        client.close()
    assert origin.requests[-1].connection == warm_connection(origin)
    assert stopped < 3, f"the stop took {stopped:.1f}s: it waited for the drain time (10s), not the exchange"
    assert [(line["decision"], line["status"]) for line in running.records()] == [("allow", 200)] * 2


@pytest.mark.parametrize("how", ["close", "reset"])
async def test_a_client_gone_while_the_answer_is_pending_is_audited_and_the_gate_serves_on(
        gate: RunningGate, origin: Origin, client: Client, how: str) -> None:
    """A client that closes (a FIN, as one that exits sends) or resets is gone: the line says so, on
    the client's side, with nothing sent. Either way the upstream got the request whole, and the gate serves
    the next client."""
    mark, before = len(gate.records()), len(origin.requests)
    client.send(messages_request(SMALL, "x-origin: hold\r\nx-seq: held\r\n", keep_alive=True))
    await eventually(lambda: len(origin.requests) > before, what="the request at the upstream")
    if how == "reset":
        sock = client.writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # an RST, not a FIN
        client.writer.transport.abort()
    else:
        client.close()
    await asyncio.sleep(0.1)  # the gate has seen the client go before the answer comes
    origin.release.set()
    (line,) = await new_lines(gate, mark, 1)
    assert origin.requests[-1].connection == warm_connection(origin)
    assert (line["decision"], line["status"], line.get("side"), line["bytes_down"]) == ("error", 0, "client", 0)
    assert line["reason"].endswith("; then client went away")
    assert line["bytes_up"] == len(json.dumps(SMALL))
    fresh = await Client.to(gate)
    try:
        assert (await fresh.ask()).status == 200
    finally:
        fresh.close()
    assert origin.half == [], "the upstream saw a request cut short"
