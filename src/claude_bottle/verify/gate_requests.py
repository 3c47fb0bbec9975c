"""The probe's attacks on the gate (``claude_bottle.verify.probe``): requests to its listeners, first flights
inside the tunnels it allows, a head trickled in, a connection flood. Each returns what happened, whether it
was blocked, and (where an answer came) the evidence. Standard library only."""

from __future__ import annotations

import contextlib
import json
import resource
import socket
import ssl
import time
from typing import Any

from claude_bottle.verify.attack import Outcome
from claude_bottle.verify.packets import TIMEOUT, error_words

# The gate resolves a CONNECT's host before it answers and dials it after the first flight; a slow resolver
# or first connection (Podman's networks) can take seconds. A tunnel attack must not be judged on an answer
# that had no time to come: the first bytes get this long, the rest TIMEOUT. A refusal closes at once.
SLOW_ANSWER_TIMEOUT = 15.0
REFUSED_STATUSES = {400, 403, 405, 407, 413, 414, 431, 501, 505}  # a refusal; 502/504 mean the gate dialled


def exchange(host: str, port: int, request: bytes) -> tuple[int | None, bytes]:
    """Send raw bytes, read until the peer closes or goes quiet: (status or None, everything that came back)."""
    received = b""
    try:
        with socket.create_connection((host, port), TIMEOUT) as sock:
            sock.settimeout(TIMEOUT)
            sock.sendall(request)
            while len(received) < 1 << 20:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                received += chunk
    except OSError:
        pass
    status = None
    if received.startswith(b"HTTP/1."):
        status = int(received.split(b" ", 2)[1])
    return status, received


def judged(status: int | None, received: bytes) -> tuple[str, bool]:
    if status is None:
        return "connection closed without an answer", True
    line = received.split(b"\r\n", 1)[0].decode("latin-1")
    reason = next((h.split(b":", 1)[1].strip().decode("latin-1") for h in received.split(b"\r\n")
                   if h.lower().startswith(b"x-deny-reason:")), "")
    shown = f" ({reason})" if reason and not line.endswith(reason) else ""  # the gate's phrase is the reason
    return f"{line}{shown}", status in REFUSED_STATUSES


def proxy_request(targets: dict[str, Any], request: bytes) -> tuple[str, bool, str]:
    status, received = exchange(targets["gate"], targets["proxy_port"], request)
    actual, blocked = judged(status, received)
    return actual, blocked, received[:4096].decode("latin-1")


def connect(authority: str, extra: str = "") -> bytes:
    return f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n{extra}\r\n".encode()


def get(url: str, host: str, extra: str = "") -> bytes:
    return f"GET {url} HTTP/1.1\r\nHost: {host}\r\n{extra}Connection: close\r\n\r\n".encode()


def api_request(targets: dict[str, Any], method: str, path: str, body: dict[str, Any] | None = None,
                extra: str = "") -> tuple[str, bool, str]:
    data = json.dumps(body).encode() if body is not None else b""
    head = (f"{method} {path} HTTP/1.1\r\nHost: gate\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\n{extra}Connection: close\r\n\r\n").encode()
    status, received = exchange(targets["gate"], targets["api_port"], head + data)
    actual, blocked = judged(status, received)
    return actual, blocked, received[:1 << 16].decode("latin-1")


def client_hello(server_name: str) -> bytes:
    """The first flight of Python's TLS client naming ``server_name``, made in memory."""
    outgoing = ssl.MemoryBIO()
    tls = ssl.create_default_context().wrap_bio(ssl.MemoryBIO(), outgoing, server_hostname=server_name)
    with contextlib.suppress(ssl.SSLWantReadError):  # waiting for the server: the hello is in ``outgoing``
        tls.do_handshake()
    return outgoing.read()


def through_tunnel(targets: dict[str, Any], authority: str, first_flight: bytes) -> tuple[int | None, bytes]:
    """CONNECT ``authority``; once answered 200, send ``first_flight`` and read what comes back until the
    tunnel closes or goes quiet. (The CONNECT status, or None; what came after the CONNECT answer.)"""
    received, status = b"", None
    try:
        with socket.create_connection((targets["gate"], targets["proxy_port"]), TIMEOUT) as sock:
            sock.settimeout(SLOW_ANSWER_TIMEOUT)
            sock.sendall(connect(authority))
            while b"\r\n\r\n" not in received and len(received) < 65536:
                chunk = sock.recv(4096)
                if not chunk:
                    break
                received += chunk
            head, _, received = received.partition(b"\r\n\r\n")
            if head.startswith(b"HTTP/1."):
                status = int(head.split(b" ", 2)[1])
            if status == 200:
                sock.sendall(first_flight)
                while len(received) < 65536 and (chunk := sock.recv(4096)):
                    received += chunk
                    sock.settimeout(TIMEOUT)
    except OSError:
        pass
    return status, received


def _first_line(data: bytes) -> str:
    return data.split(b"\r\n", 1)[0][:80].decode("latin-1")


def fronted_hello(targets: dict[str, Any]) -> tuple[str, bool, str]:
    """Domain fronting: a tunnel to an allowed host whose TLS hello names another. The control, a hello
    naming the allowed host, must reach it (the stub there answers TLS bytes with an HTTP 400), else the
    check proves nothing."""
    front = f"{targets['front_host']}:{targets['front_port']}"
    status, control = through_tunnel(targets, front, client_hello(targets["front_host"]))
    if status != 200 or not control:
        return f"inconclusive: a hello naming {targets['front_host']} got no answer either (CONNECT {status})", \
            False, ""
    status, answer = through_tunnel(targets, front, client_hello(targets["unlisted_host"]))
    if answer:
        return f"relayed: the upstream answered {_first_line(answer)}", False, answer[:4096].decode("latin-1")
    return f"cut by the gate (CONNECT {status}; the same hello naming {targets['front_host']} got through)", True, ""


def non_tls_in_tunnel(targets: dict[str, Any]) -> tuple[str, bool, str]:
    front = f"{targets['front_host']}:{targets['front_port']}"
    request = f"GET /v1/models HTTP/1.1\r\nHost: {targets['unlisted_host']}\r\nConnection: close\r\n\r\n"
    status, answer = through_tunnel(targets, front, request.encode())
    if answer:
        return f"relayed: the upstream answered {_first_line(answer)}", False, answer[:4096].decode("latin-1")
    return f"cut by the gate (CONNECT {status}, then nothing came back)", status is not None, ""


def slow_head(targets: dict[str, Any]) -> tuple[str, bool]:
    """A request head trickled in a byte at a time, each byte well inside any per-read timeout: the gate must
    cut it at its deadline for the whole head."""
    deadline = float(targets["header_timeout"])
    give_up = deadline + 10
    head = b"GET http://" + targets["unlisted_host"].encode() + b"/ HTTP/1.1\r\nX-Slow: " + b"a" * 100_000
    sent, cut = 0, False
    started = time.monotonic()
    try:
        with socket.create_connection((targets["gate"], targets["proxy_port"]), TIMEOUT) as sock:
            sock.settimeout(0.25)
            while time.monotonic() - started < give_up and sent < len(head):
                sock.sendall(head[sent : sent + 1])
                sent += 1
                try:
                    sock.recv(4096)  # an answer (408) or the close: either way, cut
                    cut = True
                    break
                except TimeoutError:
                    continue
    except OSError:
        cut = True  # a reset while sending: cut as well
    elapsed = time.monotonic() - started
    if cut and elapsed <= deadline + 5:
        return f"cut after {elapsed:.0f}s and {sent} bytes (head deadline {deadline:g}s)", True
    return f"still taking bytes after {elapsed:.0f}s ({sent} bytes; head deadline {deadline:g}s)", False


def connection_flood(targets: dict[str, Any]) -> Outcome:
    """Connections up to a little past the proxy listener's cap, all held open: the excess must be refused
    (503), and once they close the gate must answer again. Run alone: it fills the gate on purpose."""
    cap = int(targets["max_connections"])
    total = cap + 16
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < total + 64 <= hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (total + 64, hard))
    held: list[socket.socket] = []
    refused = still_open = 0
    try:
        for _ in range(total):
            held.append(socket.create_connection((targets["gate"], targets["proxy_port"]), TIMEOUT))
        time.sleep(1.0)  # let the gate accept, and refuse, every one
        for sock in held:
            sock.setblocking(False)
            try:
                refused += sock.recv(4096).startswith(b"HTTP/1.1 503")
            except BlockingIOError:
                still_open += 1
            except OSError:
                pass
    except OSError as exc:
        return Outcome("egress proxy", f"a connection flood ({total} held open)", "excess refused, gate recovers",
                       f"could not open {total} connections: {error_words(exc)}", False)
    finally:
        for sock in held:
            sock.close()
    after: tuple[str, bool] = ("no answer", False)
    stop = time.monotonic() + 10
    while time.monotonic() < stop:  # the gate sees the closes shortly
        status, received = exchange(targets["gate"], targets["proxy_port"], connect(f"{targets['unlisted_host']}:443"))
        after = judged(status, received)
        if status != 503:
            break
        time.sleep(0.2)
    blocked = refused > 0 and still_open <= cap and status == 403
    return Outcome("egress proxy", f"a connection flood ({total} held open, cap {cap})",
                   "excess refused, gate recovers",
                   f"{refused} refused with 503, {still_open} held; afterwards {after[0]}", blocked)

