"""Classify IP addresses, and parse IP literals in every spelling a resolver would accept.

The egress proxy allows only globally routable addresses unless the user opts in with ``--allow-private``.
Classification is by table, most specific first, so each refusal names the exact reason.
"""

from __future__ import annotations

import enum
import ipaddress
import re
from dataclasses import dataclass

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


class AddressClass(enum.Enum):
    GLOBAL = "global"
    LOOPBACK = "loopback"
    PRIVATE = "private (RFC 1918)"
    CGNAT = "shared address space (CGNAT 100.64.0.0/10)"
    CLOUD_METADATA = "cloud metadata service"
    LINK_LOCAL = "link-local"
    MULTICAST = "multicast"
    UNSPECIFIED = "unspecified"
    RESERVED = "reserved / not globally routable"
    UNIQUE_LOCAL = "IPv6 unique local (fc00::/7)"
    IPV4_MAPPED = "IPv4-mapped IPv6"
    IPV4_COMPATIBLE = "IPv4-compatible IPv6"
    NAT64 = "NAT64 (IPv4 embedded in IPv6)"
    SIX_TO_FOUR = "6to4 (IPv4 embedded in IPv6)"
    TEREDO = "Teredo (IPv4 embedded in IPv6)"


def _nets(*cidrs: str) -> tuple[IPNetwork, ...]:
    return tuple(ipaddress.ip_network(c) for c in cidrs)


# Most specific first: a metadata address is also link-local, but the more useful reason wins.
_TABLE: tuple[tuple[tuple[IPNetwork, ...], AddressClass], ...] = (
    (_nets("169.254.169.254/32", "169.254.170.2/32", "100.100.100.200/32", "fd00:ec2::254/128"),
     AddressClass.CLOUD_METADATA),
    (_nets("0.0.0.0/32", "::/128"), AddressClass.UNSPECIFIED),
    (_nets("127.0.0.0/8", "::1/128"), AddressClass.LOOPBACK),
    (_nets("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"), AddressClass.PRIVATE),
    (_nets("100.64.0.0/10"), AddressClass.CGNAT),
    (_nets("169.254.0.0/16", "fe80::/10"), AddressClass.LINK_LOCAL),
    (_nets("224.0.0.0/4", "ff00::/8"), AddressClass.MULTICAST),
    (_nets("fc00::/7"), AddressClass.UNIQUE_LOCAL),
    (_nets("::ffff:0:0/96", "::ffff:0:0:0/96"), AddressClass.IPV4_MAPPED),
    (_nets("::/96"), AddressClass.IPV4_COMPATIBLE),
    (_nets("64:ff9b::/96", "64:ff9b:1::/48"), AddressClass.NAT64),
    (_nets("2002::/16"), AddressClass.SIX_TO_FOUR),
    (_nets("2001::/32"), AddressClass.TEREDO),
    (_nets("0.0.0.0/8", "192.0.0.0/24", "192.0.2.0/24", "192.88.99.0/24", "198.18.0.0/15",
           "198.51.100.0/24", "203.0.113.0/24", "240.0.0.0/4", "100::/64", "2001:db8::/32",
           "fec0::/10", "3fff::/20"),
     AddressClass.RESERVED),
)


def classify(address: IPAddress) -> AddressClass:
    """The class of ``address``; anything Python does not call global and no row names is RESERVED."""
    for networks, cls in _TABLE:
        if any(address.version == net.version and address in net for net in networks):
            return cls
    return AddressClass.GLOBAL if address.is_global else AddressClass.RESERVED


@dataclass(frozen=True)
class AddressGuard:
    """Refuses every address that is not globally routable, except inside the opted-in networks."""

    allow_private: tuple[IPNetwork, ...] = ()

    def check(self, address: IPAddress) -> tuple[bool, str]:
        cls = classify(address)
        if cls is AddressClass.GLOBAL:
            return True, f"{address} is globally routable"
        for net in self.allow_private:
            if address.version == net.version and address in net:
                return True, f"{address} is {cls.value}, allowed by --allow-private {net}"
        return False, f"{address} is {cls.value}; refused (allow it with --allow-private CIDR)"


def parse_network(text: str) -> IPNetwork:
    """A CIDR for ``--allow-private``; host bits set is an error, as it usually hides a typo."""
    try:
        return ipaddress.ip_network(text.strip(), strict=True)
    except ValueError as exc:
        raise ValueError(f"{text!r} is not a network in CIDR form such as 10.0.0.0/8 or fd00::/8 ({exc})") from None


_V4_PART = re.compile(r"(0x[0-9a-f]*|0[0-7]*|[1-9][0-9]*)", re.IGNORECASE)


def parse_ipv4_literal(text: str) -> ipaddress.IPv4Address | None:
    """Parse IPv4 in every inet_aton spelling: ``127.1``, ``0x7f000001``, ``2130706433``, ``0177.0.0.1``.

    Resolvers accept these forms, so the guard must see through them. Returns None when ``text`` is not
    IPv4 in any spelling.
    """
    parts = text.split(".")
    if not 1 <= len(parts) <= 4 or not all(_V4_PART.fullmatch(p) for p in parts):
        return None
    values = []
    for p in parts:
        if p[:2].lower() == "0x":
            values.append(int(p[2:] or "0", 16))
        elif len(p) > 1 and p[0] == "0":
            values.append(int(p, 8))
        else:
            values.append(int(p))
    *head, last = values
    if any(v > 255 for v in head) or last >= 256 ** (4 - len(head)):
        return None
    number = last
    for i, v in enumerate(head):
        number += v << (8 * (3 - i))
    return ipaddress.IPv4Address(number)


def parse_ip_literal(text: str) -> IPAddress | None:
    """An IP address written as a host (IPv6 with or without brackets), or None if ``text`` is a name."""
    bracketed = text.startswith("[") and text.endswith("]")
    if bracketed:
        text = text[1:-1]
    if ":" in text:
        if "%" in text:
            return None  # zone ids are never valid targets; callers reject the host as malformed
        try:
            return ipaddress.IPv6Address(text)
        except ValueError:
            return None
    return None if bracketed else parse_ipv4_literal(text)

