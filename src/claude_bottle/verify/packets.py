"""The probe's attacks of direct egress (``claude_bottle.verify.probe``): a packet that gets an answer, even a
refusal, reached something. Each returns what happened and whether it was blocked. Standard library only."""

from __future__ import annotations

import errno
import socket
import struct
import time

TIMEOUT = 3.0
# An IPv6 address sends nothing while duplicate address detection runs (about a second after the link comes
# up): an attack on IPv6 waits this long for it, as an attacker would.
TENTATIVE_SECONDS = 5.0
IFA_F_TENTATIVE = 0x40
DNS_RCODES = {0: "NOERROR", 1: "FORMERR", 2: "SERVFAIL", 3: "NXDOMAIN", 4: "NOTIMP", 5: "REFUSED"}


def error_words(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError | socket.timeout):
        return "no answer (timed out)"
    return getattr(exc, "strerror", None) or str(exc) or type(exc).__name__


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
        return error_words(exc), True


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
        return error_words(exc), True


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
        return error_words(exc), True


def icmp_echo(host: str) -> tuple[str, bool]:
    """The unprivileged ICMP socket a non-root ping uses, where the namespace's ping_group_range allows it."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_ICMP) as sock:
            sock.settimeout(TIMEOUT)
            sock.sendto(struct.pack("!BBHHH", 8, 0, 0, 0, 1) + b"claude-bottle", (host, 0))
            sock.recvfrom(2048)
        return "echo reply", False
    except OSError as exc:
        return error_words(exc), True


def raw_socket(family: int, kind: int, protocol: int) -> tuple[str, bool]:
    try:
        socket.socket(family, kind, protocol).close()
        return "opened", False
    except OSError as exc:
        return error_words(exc), True


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

