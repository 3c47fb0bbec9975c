"""The benchmark's clients: HTTP/1.1 over h11 (blocking for sequential work, asyncio for concurrent
streams), the SSE event counter, the CONNECT client and the TCP sink at the far end of every tunnel."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import select
import socket
import struct
import sys
import threading
import time
from typing import Any

import h11

from .core import SOCKET_TIMEOUT_S, BenchError, Deadline


class SseScanner:
    """Counts the stub's SSE events and turns each ``: sent_ns=`` comment into a delivery delay."""

    def __init__(self) -> None:
        self.pending = b""
        self.delays_ns: list[int] = []
        self.deltas = 0
        self.stopped = False

    def feed(self, payload: bytes, arrival_ns: int) -> None:
        data = self.pending + payload
        lines = data.split(b"\n")
        self.pending = lines.pop()
        for line in lines:
            if line.startswith(b": sent_ns="):
                self.delays_ns.append(arrival_ns - int(line[10:]))
            elif line == b"event: content_block_delta":
                self.deltas += 1
            elif line == b"event: message_stop":
                self.stopped = True


Request = tuple[str, list[tuple[str, str]], bytes]  # a POST: target, headers but Host, body


def post(target: str, body: bytes, extra: tuple[tuple[str, str], ...] = ()) -> Request:
    """A ``POST`` of a JSON body as Claude Code sends it; the connection adds its own Host."""
    return target, [("Content-Type", "application/json"), ("anthropic-version", "2023-06-01"), *extra,
                    ("Content-Length", str(len(body)))], body


def messages_request(payload: dict[str, Any]) -> Request:
    """A ``POST /v1/messages`` of ``payload``, with a client credential of its own for the gate to strip."""
    return post("/v1/messages", json.dumps(payload, separators=(",", ":")).encode(),
                (("x-api-key", f"sk-ant-api03-placeholder-{'0' * 24}"),))


SMALL_PAYLOAD: dict[str, Any] = {"model": "claude-bench", "max_tokens": 16,
                                 "messages": [{"role": "user", "content": "ping"}]}


def stream_payload(events: int, interval: float) -> dict[str, Any]:
    return {**SMALL_PAYLOAD, "stream": True, "stub": {"events": events, "interval": interval}}


class Exchange:
    """One request/response cycle on an h11 connection: the bytes to send, then ``feed`` what arrives."""

    def __init__(self, conn: h11.Connection, authority: str, request: Request) -> None:
        target, headers, body = request
        head = h11.Request(method="POST", target=target, headers=[("Host", authority), *headers])
        self.conn = conn
        self.wire = b"".join(conn.send(e) or b"" for e in (head, h11.Data(data=body), h11.EndOfMessage()))
        self.status = 0
        self.keep_alive = True
        self.size = 0
        self.done = False

    def feed(self, data: bytes, sse: SseScanner | None, arrival_ns: int) -> None:
        """Body bytes go to ``sse``; ``done`` turns true at the response's end (b"" means the peer closed)."""
        self.conn.receive_data(data)
        while True:
            event = self.conn.next_event()
            if event is h11.NEED_DATA:
                if not data:
                    raise BenchError("connection closed in the middle of a response")
                return
            if isinstance(event, h11.Response):
                self.status = event.status_code
                self.keep_alive = (b"connection", b"close") not in [(k, v.lower()) for k, v in event.headers]
            elif isinstance(event, h11.Data):
                self.size += len(event.data)
                if sse is not None:
                    sse.feed(bytes(event.data), arrival_ns)
            elif isinstance(event, h11.EndOfMessage):
                self.done = True
                return
            elif isinstance(event, h11.ConnectionClosed):
                raise BenchError("connection closed in the middle of a response")


class SyncHttp:
    """One keep-alive connection with blocking sockets: the lowest-overhead client for sequential work."""

    def __init__(self, host: str, port: int) -> None:
        self.address = (host, port)
        self.authority = f"{host}:{port}"
        self.sock, self.conn = self._connect()

    def _connect(self) -> tuple[socket.socket, h11.Connection]:
        sock = socket.create_connection(self.address, timeout=SOCKET_TIMEOUT_S)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock, h11.Connection(h11.CLIENT)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()

    def reopen_if_closed(self) -> None:
        """Connect again if the server closed this connection while it sat idle between requests, as the gate
        does past its keep-alive idle time (30 s, its header timeout): a request written into a connection the
        server closed fails with a broken pipe. Call it between timed requests, never inside: it costs a
        system call."""
        if not select.select([self.sock], [], [], 0)[0]:
            return  # nothing to read: still open
        try:
            closed = self.sock.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            closed = True
        if closed:
            self.close()
            self.sock, self.conn = self._connect()

    def exchange(self, request: Request, sse: SseScanner | None = None) -> tuple[int, int]:
        """Send one request, read the whole response. Returns (status, body bytes)."""
        if self.conn.our_state is h11.DONE:
            self.conn.start_next_cycle()
        ex = Exchange(self.conn, self.authority, request)
        sock = self.sock
        sock.sendall(ex.wire)
        while not ex.done:
            data = sock.recv(65536)
            ex.feed(data, sse, time.time_ns())
        if not ex.keep_alive:
            raise BenchError(f"{self.authority} closed keep-alive (status {ex.status})")
        return ex.status, ex.size


async def stream_once(host: str, port: int, events: int, interval: float, errors: dict[str, int],
                      delays: list[int], timeout: float) -> None:
    """One SSE stream on a connection of its own; an error is counted in ``errors``, not raised."""
    writer = None
    try:
        async with asyncio.timeout(timeout):
            reader, writer = await asyncio.open_connection(host, port)
            ex = Exchange(h11.Connection(h11.CLIENT), f"{host}:{port}",
                          messages_request(stream_payload(events, interval)))
            writer.write(ex.wire)
            await writer.drain()
            sse = SseScanner()
            while not ex.done:
                data = await reader.read(65536)
                ex.feed(data, sse, time.time_ns())
        if ex.status != 200:
            errors[f"status {ex.status}"] = errors.get(f"status {ex.status}", 0) + 1
        elif sse.deltas != events or not sse.stopped:
            errors["incomplete stream"] = errors.get("incomplete stream", 0) + 1
        else:
            delays.extend(sse.delays_ns)
    except Exception as exc:  # counted, not raised: the phase measures errors
        key = f"{type(exc).__name__}"
        errors[key] = errors.get(key, 0) + 1
    finally:
        if writer is not None:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()



def sink_main(listen: str) -> None:
    """A TCP sink (run as a subprocess): per connection, read an 8-byte length, then read and discard that
    many bytes, then answer with the 8-byte count received. Exits when its standard input closes."""
    host, port = listen.rsplit(":", 1)
    server = socket.create_server((host, int(port)), backlog=64)
    print(f"sink on {host}:{server.getsockname()[1]}", flush=True)

    def watchdog() -> None:
        sys.stdin.buffer.read()  # EOF: the parent is gone
        os._exit(0)

    def serve(conn: socket.socket) -> None:
        buf = bytearray(1 << 20)
        view = memoryview(buf)
        with conn:
            conn.settimeout(120)
            try:
                head = b""
                while len(head) < 8:
                    data = conn.recv(8 - len(head))
                    if not data:
                        return
                    head += data
                (expected,) = struct.unpack("!Q", head)
                got = 0
                while got < expected:
                    n = conn.recv_into(view, min(len(buf), expected - got))
                    if not n:
                        break
                    got += n
                conn.sendall(struct.pack("!Q", got))
                conn.recv(1)  # wait for the client to close first
            except OSError:
                pass

    threading.Thread(target=watchdog, daemon=True).start()
    while True:
        conn, _ = server.accept()
        threading.Thread(target=serve, args=(conn,), daemon=True).start()


def open_tunnel(first_hop: tuple[str, int], connect_to: str | None) -> tuple[socket.socket, int]:
    """A connection to ``first_hop`` (TCP_NODELAY), through ``CONNECT connect_to`` when given: (socket, the
    proxy's status; 200 when direct). The caller closes the socket."""
    sock = socket.create_connection(first_hop, timeout=SOCKET_TIMEOUT_S)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if connect_to is None:
        return sock, 200
    sock.sendall(f"CONNECT {connect_to} HTTP/1.1\r\nHost: {connect_to}\r\n\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head:
        data = sock.recv(4096)
        if not data or len(head) > 65536:
            return sock, 0
        head += data
    status = int(head.split(b" ", 2)[1]) if head.startswith(b"HTTP/") else 0
    if status == 200 and head.split(b"\r\n\r\n", 1)[1]:
        raise BenchError("unexpected bytes after the CONNECT answer")
    return sock, status


def push_bytes(first_hop: tuple[str, int], connect_to: str | None, total: int, chunk: int,
               payload: memoryview, deadline: Deadline) -> float:
    """Send ``total`` bytes in ``chunk``-byte writes to the sink, directly or through a CONNECT tunnel;
    return the seconds from the first byte until the sink confirmed it had every byte."""
    sock, status = open_tunnel(first_hop, connect_to)
    try:
        if status != 200:
            raise BenchError(f"CONNECT {connect_to} answered {status or 'nothing'}")
        start = time.perf_counter()
        sock.sendall(struct.pack("!Q", total))
        sent = 0
        checks = 0
        while sent < total:
            n = min(chunk, total - sent)
            sock.sendall(payload[:n])
            sent += n
            checks += 1
            if checks % 256 == 0:
                deadline.check()
        ack = b""
        while len(ack) < 8:
            data = sock.recv(8 - len(ack))
            if not data:
                raise BenchError("the sink closed before confirming receipt")
            ack += data
        elapsed = time.perf_counter() - start
        (got,) = struct.unpack("!Q", ack)
        if got != total:
            raise BenchError(f"the sink received {got} of {total} bytes")
        return elapsed
    finally:
        sock.close()


# --------------------------------------------------------------------------------------------- results


if __name__ == "__main__":  # the sink, as a subprocess: python -m benchkit.client HOST:PORT
    sink_main(sys.argv[1])
