"""gate/sending.py's coalesced writes: a message in one write, a streamed piece out before the loop waits."""

from __future__ import annotations

import asyncio

import pytest

from claude_bottle.gate.connection import HttpConnection
from claude_bottle.gate.framing import JOIN_BELOW
from claude_bottle.gate.http1 import (
    Data,
    EndOfMessage,
    InformationalResponse,
    LocalProtocolError,
    Request,
    Response,
    State,
)
from tests.helpers import RecordingTransport


async def answering(head: bytes) -> tuple[HttpConnection, RecordingTransport]:
    writer = RecordingTransport()
    conn = HttpConnection()
    conn.connection_made(writer)  # type: ignore[arg-type]
    conn.receive_data(head)
    assert isinstance(await conn.read_request(1), Request)
    return conn, writer


async def test_a_response_goes_out_in_one_write_when_it_ends() -> None:
    conn, writer = await answering(b"POST /v1/messages HTTP/1.1\r\nHost: gate\r\nContent-Length: 0\r\n\r\n")
    await conn.send(Response(200, [(b"content-length", b"2")]))
    await conn.send(Data(b"ok"))
    assert writer.writes == []
    await conn.send(EndOfMessage())
    assert len(writer.writes) == 1
    assert writer.writes[0].startswith(b"HTTP/1.1 200 OK\r\n") and writer.writes[0].endswith(b"\r\n\r\nok")


async def test_a_whole_message_goes_out_in_one_write_framed_as_its_head_says() -> None:
    conn, writer = await answering(b"GET / HTTP/1.1\r\nHost: gate\r\n\r\n")
    await conn.send_whole(Response(200, [(b"transfer-encoding", b"chunked")]), b"ok")
    assert writer.writes == [b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n"]
    assert conn.our_state is State.DONE
    for length, words in ((b"3", "less body"), (b"1", "more body")):
        held, _ = await answering(b"GET / HTTP/1.1\r\nHost: gate\r\n\r\n")
        with pytest.raises(LocalProtocolError, match=words):
            await held.send_whole(Response(200, [(b"content-length", length)]), b"ok")


async def test_a_whole_message_of_every_framing_ends_its_exchange_in_the_state_it_leaves() -> None:
    empty, writer = await answering(b"GET / HTTP/1.1\r\nHost: gate\r\n\r\n")
    await empty.send_whole(Response(200, [(b"transfer-encoding", b"chunked")]), b"")
    assert writer.writes == [b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\n"]
    old, writer = await answering(b"GET / HTTP/1.0\r\n\r\n")  # no length for an HTTP/1.0 peer: the close ends it
    await old.send_whole(Response(200, []), b"ok")
    assert writer.writes == [b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\nok"] and old.our_state is State.MUST_CLOSE
    closing, writer = await answering(b"GET / HTTP/1.1\r\nHost: gate\r\nConnection: close\r\n\r\n")
    await closing.send_whole(Response(200, [(b"content-length", b"2")]), b"ok")
    assert writer.writes[0].endswith(b"connection: close\r\n\r\nok") and closing.our_state is State.MUST_CLOSE
    head, writer = await answering(b"HEAD / HTTP/1.1\r\nHost: gate\r\n\r\n")
    await head.send_whole(Response(200, [(b"content-length", b"2")]), b"")  # the length of what GET would get
    assert writer.writes == [b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n"] and head.our_state is State.DONE
    tunnel, writer = await answering(b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n")
    with pytest.raises(LocalProtocolError, match="no body"):
        await tunnel.send_whole(Response(200, []), b"")


async def test_a_whole_body_goes_in_its_heads_bytes_when_small_and_as_itself_when_large() -> None:
    conn, writer = await answering(b"GET / HTTP/1.1\r\nHost: gate\r\n\r\n")
    body = b"line\r\nbreaks\n\r in a body are its own"
    await conn.send_whole(Response(200, [(b"content-length", b"%d" % len(body))]), body)
    assert writer.writes == [b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%b" % (len(body), body)]
    broken, _ = await answering(b"GET / HTTP/1.1\r\nHost: gate\r\n\r\n")
    with pytest.raises(LocalProtocolError, match="line break"):  # in a header: still refused, body or not
        await broken.send_whole(Response(200, [(b"x-a", b"1\r\nx-b: 2"), (b"content-length", b"2")]), b"ok")

    class Vectored(RecordingTransport):
        def writelines(self, pieces: list[bytes]) -> None:
            self.pieces = pieces

    large = b"x" * JOIN_BELOW
    conn = HttpConnection(client=True)
    conn.connection_made(vectored := Vectored())  # type: ignore[arg-type]
    await conn.send_whole(Request(b"POST", b"/", [(b"host", b"up"), (b"content-length", b"%d" % len(large))]),
                          large)
    assert vectored.pieces[0] == b"POST / HTTP/1.1\r\nhost: up\r\ncontent-length: %d\r\n\r\n" % len(large)
    assert len(vectored.pieces) == 2 and vectored.pieces[1] is large  # never copied


async def test_a_streamed_piece_goes_out_before_the_loop_waits_for_the_next() -> None:
    conn, writer = await answering(b"GET /stream HTTP/1.1\r\nHost: gate\r\n\r\n")
    await conn.send(Response(200, [(b"transfer-encoding", b"chunked")]))
    await conn.send(Data(b"event: one\n\n"))
    await asyncio.sleep(0)  # what waiting for the upstream's next event does
    assert len(writer.writes) == 1 and writer.writes[0].endswith(b"event: one\n\n\r\n")
    await conn.send(Data(b"event: two\n\n"))
    await asyncio.sleep(0)
    assert len(writer.writes) == 2 and b"event: two" in writer.writes[1]


async def test_an_interim_response_and_a_connect_answer_go_out_at_once() -> None:
    conn, writer = await answering(b"POST / HTTP/1.1\r\nHost: gate\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n")
    await conn.send(InformationalResponse(100))
    assert writer.writes == [b"HTTP/1.1 100 Continue\r\n\r\n"]
    tunnel, tunnel_writer = await answering(b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n")
    await tunnel.send(Response(200, [], b"Connection established"))
    assert tunnel_writer.writes == [b"HTTP/1.1 200 Connection established\r\n\r\n"]


async def test_what_was_kept_back_is_written_before_a_reset() -> None:
    conn, writer = await answering(b"GET / HTTP/1.1\r\nHost: gate\r\n\r\n")
    await conn.send(Response(200, [(b"content-length", b"10")]))
    conn.abort()
    assert len(writer.writes) == 1 and writer.writes[0].startswith(b"HTTP/1.1 200 OK\r\n")
    assert writer.aborted
