"""gate/http1.py and gate/receiving.py's reading and framing on llhttp: what the gate adds to the parser, byte by byte."""

from __future__ import annotations

import asyncio

import pytest

from claude_bottle.gate.connection import HttpConnection
from claude_bottle.gate.failures import ClientSide, UpstreamSide
from claude_bottle.gate.http1 import (
    CONNECTION_CLOSED,
    END_OF_MESSAGE,
    ConnectionClosed,
    Data,
    EndOfMessage,
    LocalProtocolError,
    MessageParser,
    Request,
    Response,
    State,
)
from claude_bottle.gate.refusals import send_refusal
from tests.helpers import RecordingTransport


def connection(*data: bytes, client: bool = False, max_header_bytes: int = 32 * 1024
               ) -> tuple[HttpConnection, RecordingTransport]:
    writer = RecordingTransport()
    conn = HttpConnection(client=client, max_header_bytes=max_header_bytes)
    conn.connection_made(writer)  # type: ignore[arg-type]
    for piece in data:
        conn.receive_data(piece)
    return conn, writer


async def events(conn: HttpConnection, n: int) -> list[object]:
    return [await conn.next_event() for _ in range(n)]




async def upstream_answering(answer: bytes, method: bytes = b"GET", closed: bool = False) -> HttpConnection:
    """An upstream connection that sent a ``method`` request and got ``answer``, then the close with ``closed``."""
    conn, _ = connection(client=True)
    await conn.send(Request(method, b"/", [(b"host", b"u")]))
    await conn.send(EndOfMessage())
    conn.receive_data(answer)
    if closed:
        conn.receive_data(b"")
    return conn

async def answer_and_reuse(conn: HttpConnection) -> None:
    """Answer the request read (204) and start the next exchange on the connection."""
    await conn.send(Response(204, []))
    await conn.send(EndOfMessage())
    assert conn.can_reuse()

async def test_a_request_arrives_with_lower_case_names_trimmed_values_and_its_framing() -> None:
    conn, _ = connection(b"POST /v1/messages?beta=true HTTP/1.1\r\nHost: g\r\nX-Thing:  a b \t\r\n"
                         b"Content-Length: 2\r\nExpect: 100-continue\r\n\r\n{}")
    request, data, end = await events(conn, 3)
    assert isinstance(request, Request)
    assert (request.method, request.target, request.http_version) == (b"POST", b"/v1/messages?beta=true", b"1.1")
    assert request.headers == [(b"host", b"g"), (b"x-thing", b"a b"), (b"content-length", b"2"),
                               (b"expect", b"100-continue")]
    assert (request.content_length, request.chunked, request.keep_alive) == (2, False, True)
    assert request.expects_continue and conn.they_are_waiting_for_100_continue is False  # the body came
    assert data == Data(b"{}") and isinstance(end, EndOfMessage)


@pytest.mark.parametrize(("data", "status", "words"), [
    (b"GET / HTTP/2.0\r\nHost: x\r\n\r\n", 505, "HTTP/2.0 is not supported"),
    (b"GET / HTTP/0.9\r\n\r\n", 505, "HTTP/0.9"),
    (b"GET / HTTP/1.2\r\nHost: x\r\n\r\n", 505, "HTTP/1.2"),
    (b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n", 501, "chunked"),
    (b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n", 501, "chunked"),
    (b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\nx", 400, "Content-Length"),
    (b"POST / HTTP/1.1\r\nHost: x\r\nUpgrade: h2c\r\nConnection: upgrade\r\nContent-Length: 5\r\n\r\nhello", 400,
     "upgrade"),
    (b"GET / HTTP/1.1\r\nHost: x\r\nX: a\x01b\r\n\r\n", 400, "header value"),
    (b"GET / HTTP/1.1\r\nHost : x\r\n\r\n", 400, "header token"),
    (b"GET /\xc3\xa9 HTTP/1.1\r\nHost: x\r\n\r\n", 400, "url"),
    (b"GET / HTTP/1.1\r\n\r\n", 400, "Host"),
    (b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close, Host\r\n\r\n", 400, "names host"),
])
async def test_what_the_gate_refuses_beyond_llhttp_and_in_its_own_words(data: bytes, status: int, words: str) -> None:
    conn, _ = connection(data)
    with pytest.raises(ClientSide) as refused:  # the client's fault, with the status a server answers
        await conn.next_event()
    assert refused.value.status == status and words in refused.value.reason
    with pytest.raises(ClientSide):  # and it stays refused
        await conn.next_event()


async def test_a_head_over_the_limit_is_431_whole_or_trickled_in() -> None:
    big = b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 2000 + b"\r\n\r\n"
    for pieces in ([big], [big[i : i + 100] for i in range(0, len(big), 100)]):
        conn, _ = connection(*pieces, max_header_bytes=1024)
        with pytest.raises(ClientSide) as refused:
            await conn.next_event()
        assert refused.value.status == 431


async def test_a_head_begun_in_the_read_that_ended_the_message_before_it_is_held_to_the_limit() -> None:
    """Where in that read the head began, llhttp does not tell: its bytes there went uncounted, and a head of up
    to a read's size past the limit passed."""
    conn, _ = connection(b"GET / HTTP/1.1\r\nHost: x\r\n\r\nGET /next HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 900,
                         b"a" * 900 + b"\r\n\r\n", max_header_bytes=1024)
    first, end = await events(conn, 2)
    assert isinstance(first, Request) and isinstance(end, EndOfMessage)
    await answer_and_reuse(conn)
    with pytest.raises(ClientSide) as refused:
        await conn.next_event()
    assert refused.value.status == 431


async def test_a_large_body_before_a_pipelined_head_does_not_count_against_the_head() -> None:
    body = b"x" * 5000
    conn, _ = connection(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\n\r\n" + body + b"GET /next HT",
                         b"TP/1.1\r\nHost: x\r\n\r\n", max_header_bytes=1024)
    first, data, end = await events(conn, 3)
    assert isinstance(first, Request) and data == Data(body) and isinstance(end, EndOfMessage)
    await answer_and_reuse(conn)
    second = await conn.next_event()
    assert isinstance(second, Request) and second.target == b"/next"


async def test_an_error_in_a_pipelined_request_waits_behind_the_one_before_it() -> None:
    conn, _ = connection(b"GET /a HTTP/1.1\r\nHost: x\r\n\r\nGET /b HTTP/1.1\nHost: x\n\n")
    first, end = await events(conn, 2)
    assert isinstance(first, Request) and first.target == b"/a" and isinstance(end, EndOfMessage)
    await answer_and_reuse(conn)
    with pytest.raises(ClientSide, match="bare LF"):
        await conn.next_event()


async def test_an_upgrade_request_without_a_body_is_an_ordinary_request_and_what_follows_is_read() -> None:
    conn, _ = connection(b"GET /a HTTP/1.1\r\nHost: x\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\n"
                         b"HTTP2-Settings: AAMAAABkAAQAoAAAAAIAAAAA\r\n\r\nGET /b HTTP/1.1\r\nHost: x\r\n\r\n")
    first, end = await events(conn, 2)
    assert isinstance(first, Request) and first.target == b"/a" and isinstance(end, EndOfMessage)
    await answer_and_reuse(conn)
    second = await conn.next_event()
    assert isinstance(second, Request) and second.target == b"/b"


async def test_the_bytes_after_a_connect_are_the_tunnels_or_after_a_refusal_the_next_request() -> None:
    conn, writer = connection(b"CONNECT a.example:443 HTTP/1.1\r\nHost: a.example:443\r\n\r\n\x16\x03\x01")
    assert isinstance(await conn.next_event(), Request)
    await conn.send(Response(200, [], b"Connection established"))
    assert conn.our_state is State.SWITCHED and conn.trailing_data == b"\x16\x03\x01"
    assert writer.writes == [b"HTTP/1.1 200 Connection established\r\n\r\n"]

    conn, _ = connection(b"CONNECT a.example:443 HTTP/1.1\r\nHost: a.example:443\r\n\r\nGET / HTTP/1.1\r\nHost: g\r\n\r\n")
    assert isinstance(await conn.next_event(), Request)
    assert isinstance(await conn.next_event(), EndOfMessage)
    await send_refusal(conn, 403, "refused")
    assert conn.can_reuse()
    after = await conn.next_event()
    assert isinstance(after, Request) and after.method == b"GET"


async def test_a_chunked_bodys_trailers_are_dropped_and_do_not_reach_the_next_head() -> None:
    conn, _ = connection(b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nab\r\n0\r\n"
                         b"X-Trailer: 1\r\n\r\nGET / HTTP/1.1\r\nHost: y\r\n\r\n")
    request, data, end = await events(conn, 3)
    assert isinstance(request, Request) and request.chunked and data == Data(b"ab") and isinstance(end, EndOfMessage)
    assert request.headers == [(b"host", b"x"), (b"transfer-encoding", b"chunked")], "a trailer joined the head"
    await answer_and_reuse(conn)
    after = await conn.next_event()
    assert isinstance(after, Request) and after.headers == [(b"host", b"y")]


@pytest.mark.parametrize("client", [False, True])
async def test_a_trailer_section_over_the_head_limit_is_431_in_many_fields_or_one_trickled_in(client: bool) -> None:
    """Trailers are held by no one, yet llhttp parses any number of them, and a field whole however long: a peer
    sending them for as long as the idle timeout allows would grow the gate's memory without bound."""
    head = (b"HTTP/1.1 200 OK\r\n" if client else b"POST / HTTP/1.1\r\nHost: x\r\n") + \
        b"Transfer-Encoding: chunked\r\n\r\n2\r\nab\r\n0\r\n"
    many = [b"X-T: %d\r\n" % n for n in range(500)]
    one = [b"X-T: "] + [b"a" * 100] * 50
    for trailers in (many, one):
        conn, _ = connection(head, *trailers, client=client, max_header_bytes=1024)
        with pytest.raises(ClientSide if not client else UpstreamSide) as refused:
            for _ in range(4):
                await conn.next_event(timeout=0.5)  # without the bound, nothing comes: only the wait's end
        assert "trailer section larger than 1024 bytes" in refused.value.reason
        assert refused.value.status == (502 if client else 431)


async def test_a_chunked_body_in_many_small_chunks_is_not_taken_for_trailers() -> None:
    body = [b"1\r\n%d\r\n" % (n % 10) for n in range(3000)]
    conn, _ = connection(b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n", b"".join(body),
                         *body, b"0\r\nX-T: 1\r\n\r\n", max_header_bytes=1024)
    received = []
    event = await conn.next_event()
    while not isinstance(event, EndOfMessage):
        received.append(event)
        event = await conn.next_event()
    assert sum(len(e.data) for e in received if isinstance(e, Data)) == 6000


async def test_http_1_0_gets_a_body_ended_by_the_close_and_no_keep_alive() -> None:
    conn, writer = connection(b"GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
    request = await conn.next_event()
    assert isinstance(request, Request) and not request.keep_alive
    await conn.next_event()
    await conn.send(Response(200, [(b"content-type", b"text/plain")]))
    await conn.send(Data(b"hello"))
    await conn.send(EndOfMessage())
    assert writer.writes == [b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\nconnection: close\r\n\r\nhello"]
    assert not conn.can_reuse()


async def test_a_response_of_unknown_length_goes_chunked_to_http_1_1_and_head_gets_no_body() -> None:
    conn, writer = connection(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    await events(conn, 2)
    await conn.send(Response(200, []))
    await conn.send(Data(b"abc"))
    await conn.send(EndOfMessage())
    assert writer.writes == [b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"]
    conn, writer = connection(b"HEAD / HTTP/1.1\r\nHost: x\r\n\r\n")
    await events(conn, 2)
    await conn.send(Response(200, [(b"content-length", b"10")]))
    with pytest.raises(LocalProtocolError):
        await conn.send(Data(b"x"))
    conn, writer = connection(b"HEAD / HTTP/1.1\r\nHost: x\r\n\r\n")  # the gate's own answer, whole: its head
    await events(conn, 2)
    await conn.send_whole(Response(403, [(b"content-length", b"7")]), b"refused")
    assert writer.writes == [b"HTTP/1.1 403 Forbidden\r\ncontent-length: 7\r\n\r\n"]
    assert conn.can_reuse()


async def test_a_body_must_match_its_length_and_a_header_cannot_break_the_head() -> None:
    conn, _ = connection(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    await events(conn, 2)
    await conn.send(Response(200, [(b"content-length", b"2")]))
    with pytest.raises(LocalProtocolError, match="more body"):
        await conn.send(Data(b"abc"))
    conn, _ = connection(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    await events(conn, 2)
    with pytest.raises(LocalProtocolError, match="line break"):
        await conn.send(Response(200, [(b"x-injected", b"a\r\nset-cookie: b")]))


async def test_a_body_that_arrived_whole_is_taken_at_once_and_one_still_coming_is_left() -> None:
    conn, _ = connection(b"POST / HTTP/1.1\r\nHost: g\r\nContent-Length: 5\r\n\r\nab")
    assert isinstance(await conn.read_request(1), Request)
    assert conn.arrived_body() is None  # three bytes still to come: nothing is taken
    conn.receive_data(b"cde")
    assert conn.arrived_body() == b"abcde" and conn.their_state is State.DONE
    chunked, _ = connection(b"POST / HTTP/1.1\r\nHost: g\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nab\r\n",
                            b"1\r\nc\r\n0\r\n\r\nGET /next HTTP/1.1\r\nHost: g\r\n\r\n")
    assert isinstance(await chunked.read_request(1), Request)
    assert chunked.arrived_body() == b"abc"
    await answer_and_reuse(chunked)
    assert (await chunked.read_request(1)).target == b"/next"  # type: ignore[union-attr]
    cut = await upstream_answering(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nok", closed=True)
    assert isinstance(await cut.next_event(), Response)
    assert cut.arrived_body() is None  # cut short: left for the stream to report
    data, closed = await events(cut, 2)
    assert data == Data(b"ok") and isinstance(closed, ConnectionClosed)


async def test_the_upstream_side_frames_requests_and_reads_responses() -> None:
    conn, writer = connection(client=True)
    await conn.send(Request(b"POST", b"/v1/messages", [(b"host", b"u"), (b"transfer-encoding", b"chunked")]))
    await conn.send(Data(b"{}"))
    await conn.send(EndOfMessage())
    assert writer.writes == [b"POST /v1/messages HTTP/1.1\r\nhost: u\r\ntransfer-encoding: chunked\r\n\r\n"
                             b"2\r\n{}\r\n0\r\n\r\n"]
    conn.receive_data(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
    interim, response, data, end = await events(conn, 4)
    assert type(interim).__name__ == "InformationalResponse"
    assert isinstance(response, Response) and response.status_code == 200 and data == Data(b"ok")
    assert isinstance(end, EndOfMessage) and conn.can_reuse()


async def test_a_response_to_head_has_no_body_and_its_connection_is_not_reused() -> None:
    conn = await upstream_answering(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n", b"HEAD")
    response, end = await events(conn, 2)
    assert isinstance(response, Response) and isinstance(end, EndOfMessage)
    assert not conn.can_reuse()


async def test_a_response_ended_by_the_close_is_complete_at_the_close_and_not_reused() -> None:
    conn = await upstream_answering(b"HTTP/1.1 200 OK\r\n\r\nall of it", closed=True)
    response, data, end, closed = await events(conn, 4)
    assert isinstance(response, Response) and data == Data(b"all of it")
    assert isinstance(end, EndOfMessage) and isinstance(closed, ConnectionClosed)
    assert not conn.can_reuse()


@pytest.mark.parametrize(("data", "words"), [
    (b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\nConnection: upgrade\r\n\r\n", "switched protocols"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\nxx", "chunked"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n", "both"),
])
async def test_what_an_upstream_may_not_answer(data: bytes, words: str) -> None:
    conn = await upstream_answering(data, closed=True)
    with pytest.raises(UpstreamSide, match=words) as refused:
        while True:
            await conn.next_event()
    assert refused.value.status == 502 and refused.value.reason.startswith("upstream broke HTTP/1.1")


async def test_a_hang_up_is_the_same_in_a_head_or_a_body_on_either_side() -> None:
    """A close in the middle of a message is a hang-up wherever it falls, never a broken message: the client
    went away (nothing to answer), the upstream closed (502)."""
    for cut in (b"GET / HTTP/1.1\r\nHo", b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 9\r\n\r\nok"):
        conn, _ = connection(cut, b"")
        with pytest.raises(ClientSide) as client:
            if await conn.read_request(1) is not None:
                async for _ in conn.body(1):
                    pass
        assert client.value.status == 0 and client.value.reason.startswith("client went away in the middle of a")
    head = await upstream_answering(b"HTTP/1.1 200 OK\r\nContent-Le", closed=True)
    assert isinstance(await head.next_event(), ConnectionClosed)  # what the forward path reports as the close
    body = await upstream_answering(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nok", closed=True)
    assert isinstance(await body.next_event(), Response)
    with pytest.raises(UpstreamSide) as upstream:
        async for _ in body.body(1):
            pass
    assert upstream.value.status == 502 and upstream.value.reason == "upstream closed the connection in the middle of a body"


async def test_silence_is_the_sides_timeout_in_a_head_or_a_body() -> None:
    """A client too slow with its head or its body is 408; an upstream too slow with either is 504. Between
    requests, before a byte of the next head, a client's silence ends nothing."""
    idle, _ = connection()
    assert await idle.read_request(0.01) is None
    slow_head, _ = connection(b"GET / HTTP/1.1\r\nHo")
    with pytest.raises(ClientSide) as head:
        await slow_head.read_request(0.01)
    assert head.value.status == 408 and head.value.reason == "request head not complete within 0.01s"
    slow_body, _ = connection(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 9\r\n\r\nok")
    assert await slow_body.read_request(1) is not None
    with pytest.raises(ClientSide) as body:
        async for _ in slow_body.body(0.01):
            pass
    assert body.value.status == 408 and body.value.reason == "client idle too long"
    for answer in (b"HTTP/1.1 200 OK\r\nContent-Le", b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nok"):
        upstream = await upstream_answering(answer)
        with pytest.raises(UpstreamSide) as silent:
            while True:
                await upstream.next_event(0.01)
        assert silent.value.status == 504 and silent.value.reason == "upstream stopped responding"


async def test_a_body_cut_short_ends_in_the_close_for_the_caller_to_judge() -> None:
    conn = await upstream_answering(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nok", closed=True)
    response, data, closed = await events(conn, 3)
    assert isinstance(response, Response) and data == Data(b"ok") and isinstance(closed, ConnectionClosed)
    with pytest.raises(Exception, match="middle of a body"):
        async for _ in conn.body(None):
            pass


async def test_reading_pauses_past_the_high_water_mark_and_resumes_when_the_reader_waits() -> None:
    """A client sending faster than the gate takes its events (pipelining, or a body the upstream is slow to
    take) is stopped at the socket, not buffered without bound."""

    class Transport(RecordingTransport):
        def __init__(self) -> None:
            super().__init__()
            self.paused = False

        def pause_reading(self) -> None:
            self.paused = True

        def resume_reading(self) -> None:
            self.paused = False

    transport = Transport()
    conn = HttpConnection()
    conn.connection_made(transport)  # type: ignore[arg-type]
    chunk = b"x" * 65536
    conn.data_received(b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
    for _ in range(5):
        conn.data_received(b"%x\r\n%b\r\n" % (len(chunk), chunk))
    assert transport.paused
    assert isinstance(await conn.next_event(), Request)
    for _ in range(5):
        assert await conn.next_event() == Data(chunk)
    assert transport.paused  # taken, but nobody waits for more yet
    waiting = asyncio.ensure_future(conn.next_event(1))
    await asyncio.sleep(0)
    assert not transport.paused
    conn.data_received(b"0\r\n\r\n")
    assert isinstance(await waiting, EndOfMessage)


def test_the_parser_alone_turns_bytes_into_events_without_io() -> None:
    """gate/http1.py needs no connection: bytes in, events out, a hang-up mid-head queued as the close."""
    parser = MessageParser(client=False, max_header_bytes=1024)
    parser.receive(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nok")
    request, data, end = parser.events
    assert isinstance(request, Request) and request.content_length == 2
    assert data == Data(b"ok") and end is END_OF_MESSAGE
    parser.events.clear()
    parser.receive(b"GET / HTTP/1.1\r\nHo")
    assert parser.head_started and not parser.events
    parser.receive_eof()
    assert list(parser.events) == [CONNECTION_CLOSED] and parser.head_started
