"""Address classification, the private-address guard, and IP literal parsing."""

from __future__ import annotations

import ipaddress

import pytest

from claude_bottle.policy.addresses import (
    AddressClass,
    AddressGuard,
    classify,
    parse_ip_literal,
    parse_ipv4_literal,
    parse_network,
)

C = AddressClass

CLASSIFY_CASES = [
    # CGNAT 100.64.0.0/10 and its neighbours
    ("100.63.255.255", C.GLOBAL),
    ("100.64.0.0", C.CGNAT),
    ("100.127.255.255", C.CGNAT),
    ("100.128.0.0", C.GLOBAL),
    # loopback
    ("127.0.0.1", C.LOOPBACK),
    ("127.255.255.254", C.LOOPBACK),
    ("::1", C.LOOPBACK),
    # RFC 1918
    ("10.0.0.0", C.PRIVATE),
    ("10.255.255.255", C.PRIVATE),
    ("172.15.255.255", C.GLOBAL),
    ("172.16.0.0", C.PRIVATE),
    ("172.31.255.255", C.PRIVATE),
    ("172.32.0.0", C.GLOBAL),
    ("192.168.0.1", C.PRIVATE),
    ("192.168.255.255", C.PRIVATE),
    # metadata wins over link-local
    ("169.254.169.254", C.CLOUD_METADATA),
    ("169.254.170.2", C.CLOUD_METADATA),
    ("100.100.100.200", C.CLOUD_METADATA),
    ("fd00:ec2::254", C.CLOUD_METADATA),
    ("169.254.1.1", C.LINK_LOCAL),
    ("fe80::1", C.LINK_LOCAL),
    # unspecified
    ("0.0.0.0", C.UNSPECIFIED),
    ("::", C.UNSPECIFIED),
    # reserved / documentation / benchmarking / class E / broadcast
    ("0.1.2.3", C.RESERVED),
    ("240.0.0.1", C.RESERVED),
    ("255.255.255.255", C.RESERVED),
    ("192.0.0.9", C.RESERVED),
    ("192.0.2.1", C.RESERVED),
    ("192.88.99.1", C.RESERVED),
    ("198.18.0.1", C.RESERVED),
    ("198.19.255.255", C.RESERVED),
    ("198.20.0.0", C.GLOBAL),
    ("198.51.100.1", C.RESERVED),
    ("203.0.113.1", C.RESERVED),
    ("2001:db8::1", C.RESERVED),
    ("100::1", C.RESERVED),
    ("fec0::1", C.RESERVED),
    ("3fff::1", C.RESERVED),
    ("2001:2::1", C.RESERVED),
    # multicast
    ("224.0.0.1", C.MULTICAST),
    ("239.255.255.255", C.MULTICAST),
    ("ff02::1", C.MULTICAST),
    # unique local
    ("fc00::1", C.UNIQUE_LOCAL),
    ("fd12::1", C.UNIQUE_LOCAL),
    # IPv4 embedded in IPv6: refused whatever the embedded address is
    ("::ffff:127.0.0.1", C.IPV4_MAPPED),
    ("::ffff:8.8.8.8", C.IPV4_MAPPED),
    ("::ffff:0:8.8.8.8", C.IPV4_MAPPED),
    ("::8.8.8.8", C.IPV4_COMPATIBLE),
    ("64:ff9b::7f00:1", C.NAT64),
    ("64:ff9b::808:808", C.NAT64),
    ("64:ff9b:1::1", C.NAT64),
    ("2002:7f00:1::1", C.SIX_TO_FOUR),
    ("2002:808:808::1", C.SIX_TO_FOUR),
    ("2001:0:4136:e378:8000:63bf:3fff:fdd2", C.TEREDO),
    # public
    ("8.8.8.8", C.GLOBAL),
    ("1.1.1.1", C.GLOBAL),
    ("2606:4700:4700::1111", C.GLOBAL),
]


@pytest.mark.parametrize(("text", "expected"), CLASSIFY_CASES, ids=[c[0] for c in CLASSIFY_CASES])
def test_classify(text: str, expected: AddressClass) -> None:
    assert classify(ipaddress.ip_address(text)) is expected


@pytest.mark.parametrize(
    "text",
    ["::ffff:127.0.0.1", "::ffff:8.8.8.8", "64:ff9b::808:808", "2002:808:808::1",
     "2001:0:4136:e378:8000:63bf:3fff:fdd2", "::8.8.8.8"],
)
def test_embedded_ipv4_is_refused_by_default_guard(text: str) -> None:
    allowed, reason = AddressGuard().check(ipaddress.ip_address(text))
    assert allowed is False
    assert "IPv4" in reason
    assert "refused" in reason
    assert "--allow-private" in reason


GUARD_CASES = [
    # (address, allow_private, allowed, words that must be in the reason)
    ("8.8.8.8", (), True, ["8.8.8.8", "globally routable"]),
    ("2606:4700:4700::1111", (), True, ["globally routable"]),
    ("10.1.2.3", (), False, ["10.1.2.3", "private (RFC 1918)", "refused", "--allow-private"]),
    ("127.0.0.1", (), False, ["loopback", "refused", "--allow-private"]),
    ("169.254.169.254", (), False, ["cloud metadata service", "refused", "--allow-private"]),
    ("100.64.0.1", (), False, ["CGNAT", "refused"]),
    ("fd12::1", (), False, ["unique local", "refused"]),
    ("10.1.2.3", ("10.0.0.0/8",), True, ["private (RFC 1918)", "allowed by --allow-private 10.0.0.0/8"]),
    ("10.1.2.3", ("10.1.2.3/32",), True, ["allowed by --allow-private 10.1.2.3/32"]),
    ("10.1.2.3", ("192.168.0.0/16",), False, ["refused", "--allow-private"]),
    ("11.0.0.1", ("10.0.0.0/8",), True, ["globally routable"]),
    ("127.0.0.1", ("127.0.0.0/8",), True, ["loopback", "allowed by --allow-private 127.0.0.0/8"]),
    ("fd12::1", ("fd00::/8",), True, ["unique local", "allowed by --allow-private fd00::/8"]),
    ("fd12::1", ("10.0.0.0/8", "fd00::/8"), True, ["fd00::/8"]),
    ("10.1.2.3", ("fd00::/8",), False, ["refused"]),
    # an IPv4 network never allows the same address in IPv4-mapped IPv6 form
    ("::ffff:10.1.2.3", ("10.0.0.0/8",), False, ["IPv4-mapped IPv6", "refused", "--allow-private"]),
    ("::ffff:127.0.0.1", ("127.0.0.0/8",), False, ["IPv4-mapped IPv6", "refused"]),
    ("64:ff9b::a01:203", ("10.0.0.0/8",), False, ["NAT64", "refused"]),
    # same-version containment: an IPv6 network can opt in the mapped form explicitly
    ("::ffff:10.1.2.3", ("::ffff:0:0/96",), True, ["IPv4-mapped IPv6", "allowed by --allow-private"]),
]


@pytest.mark.parametrize(
    ("text", "networks", "allowed", "words"),
    GUARD_CASES,
    ids=[f"{c[0]}-allow{','.join(c[1]) or 'none'}" for c in GUARD_CASES],
)
def test_address_guard(text: str, networks: tuple[str, ...], allowed: bool, words: list[str]) -> None:
    guard = AddressGuard(tuple(ipaddress.ip_network(n) for n in networks))
    ok, reason = guard.check(ipaddress.ip_address(text))
    assert ok is allowed
    for word in words:
        assert word in reason, (word, reason)


def test_guard_refusal_reason_exact() -> None:
    ok, reason = AddressGuard().check(ipaddress.ip_address("192.168.1.1"))
    assert (ok, reason) == (False, "192.168.1.1 is private (RFC 1918); refused (allow it with --allow-private CIDR)")


IPV4_VALID = [
    ("127.1", "127.0.0.1"),
    ("0x7f000001", "127.0.0.1"),
    ("0X7F000001", "127.0.0.1"),
    ("0X7F.0.0.1", "127.0.0.1"),
    ("0x7f.0x0.0.1", "127.0.0.1"),
    ("2130706433", "127.0.0.1"),
    ("0177.0.0.1", "127.0.0.1"),
    ("0177.1", "127.0.0.1"),
    ("127.0.1", "127.0.0.1"),
    ("1.2.3.4", "1.2.3.4"),
    ("1.0xffffff", "1.255.255.255"),
    ("1.2.256", "1.2.1.0"),
    ("1.2.65535", "1.2.255.255"),
    ("4294967295", "255.255.255.255"),
    ("0", "0.0.0.0"),
    ("010.0.0.1", "8.0.0.1"),
]


@pytest.mark.parametrize(("text", "expected"), IPV4_VALID, ids=[c[0] for c in IPV4_VALID])
def test_parse_ipv4_literal_valid(text: str, expected: str) -> None:
    assert parse_ipv4_literal(text) == ipaddress.IPv4Address(expected)


IPV4_INVALID = ["256.0.0.1", "1.2.3.4.5", "08.0.0.1", "4294967296", "", "a.b.c.d", "1..2", "1.2.3.", ".1.2.3",
                "0x100.0.0.1", "1.0x1000000", "1.2.65536", "1.16777216", " 1.2.3.4", "1.2.3.4 ", "example.com", "-1.2.3.4", "0xg"]


@pytest.mark.parametrize("text", IPV4_INVALID, ids=[repr(t) for t in IPV4_INVALID])
def test_parse_ipv4_literal_invalid(text: str) -> None:
    assert parse_ipv4_literal(text) is None


IP_LITERAL_CASES = [
    ("[::1]", "::1"),
    ("::1", "::1"),
    ("[2001:DB8:0::1]", "2001:db8::1"),
    ("fe80::1%eth0", None),
    ("[fe80::1%eth0]", None),
    ("example.com", None),
    ("localhost", None),
    ("a:b", None),
    ("127.1", "127.0.0.1"),
    ("0x7f000001", "127.0.0.1"),
]


@pytest.mark.parametrize(("text", "expected"), IP_LITERAL_CASES, ids=[c[0] for c in IP_LITERAL_CASES])
def test_parse_ip_literal(text: str, expected: str | None) -> None:
    result = parse_ip_literal(text)
    if expected is None:
        assert result is None
    else:
        assert result == ipaddress.ip_address(expected)


NETWORK_VALID = [("10.0.0.0/8", "10.0.0.0/8"), (" fd00::/8 ", "fd00::/8"), ("10.1.2.3/32", "10.1.2.3/32"),
                 ("10.1.2.3", "10.1.2.3/32"), ("::1/128", "::1/128")]


@pytest.mark.parametrize(("text", "expected"), NETWORK_VALID, ids=[c[0] for c in NETWORK_VALID])
def test_parse_network_valid(text: str, expected: str) -> None:
    assert parse_network(text) == ipaddress.ip_network(expected)


@pytest.mark.parametrize(
    ("text", "detail"),
    [("10.0.0.1/8", "host bits set"), ("fd00::1/8", "host bits set"), ("x", "does not appear"),
     ("10.0.0.0/33", ""), ("", "")],
    ids=["v4-host-bits", "v6-host-bits", "name", "prefix-too-long", "empty"],
)
def test_parse_network_errors(text: str, detail: str) -> None:
    with pytest.raises(ValueError, match="not a network in CIDR form") as info:
        parse_network(text)
    message = str(info.value)
    assert repr(text) in message
    assert "10.0.0.0/8" in message  # the example of the right form
    assert detail in message
