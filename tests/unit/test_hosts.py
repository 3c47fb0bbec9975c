"""Host normalisation, allowlist patterns and their matching, CONNECT authorities."""

from __future__ import annotations

import ipaddress

import pytest

from claude_bottle.policy.hosts import (
    Allowlist,
    HostPattern,
    InvalidHost,
    Target,
    normalize_host,
    parse_authority,
    parse_pattern,
    parse_port,
)

NORMALIZE_CASES = [
    ("example.com", "example.com", None),
    ("EXAMPLE.Com", "example.com", None),
    ("example.com.", "example.com", None),
    ("  Example.COM.  ", "example.com", None),
    ("Bücher.example", "xn--bcher-kva.example", None),
    ("BÜCHER.example.", "xn--bcher-kva.example", None),
    ("xn--bcher-kva.example", "xn--bcher-kva.example", None),
    ("localhost", "localhost", None),
    ("a-b.example", "a-b.example", None),
    ("_dmarc.a_b.example", "_dmarc.a_b.example", None),  # underscores occur in real host names
    ("x1.example.123a", "x1.example.123a", None),
    # every inet_aton spelling becomes the canonical address
    ("127.0.0.1", "127.0.0.1", "127.0.0.1"),
    ("127.1", "127.0.0.1", "127.0.0.1"),
    ("0x7f000001", "127.0.0.1", "127.0.0.1"),
    ("0X7F.0.0.1", "127.0.0.1", "127.0.0.1"),
    ("2130706433", "127.0.0.1", "127.0.0.1"),
    ("0177.0.0.1", "127.0.0.1", "127.0.0.1"),
    ("0x0a.1.2.3", "10.1.2.3", "10.1.2.3"),
    # IPv6 with and without brackets, canonicalised
    ("[::1]", "::1", "::1"),
    ("::1", "::1", "::1"),
    ("[2001:DB8:0:0::1]", "2001:db8::1", "2001:db8::1"),
]


@pytest.mark.parametrize(("raw", "name", "ip"), NORMALIZE_CASES, ids=[c[0] for c in NORMALIZE_CASES])
def test_normalize_host(raw: str, name: str, ip: str | None) -> None:
    result = normalize_host(raw)
    assert result == (name, ipaddress.ip_address(ip) if ip is not None else None)


NORMALIZE_INVALID = [
    ("[1.2.3.4]", "not a valid IP address"),  # brackets are for IPv6 only
    ("", "empty host"),
    ("   ", "empty host"),
    (".", "empty host"),
    ("a..b", "not a valid host name"),
    ("example.com..", "not a valid host name"),
    ("-a.com", "not a valid host name"),
    ("a-.com", "not a valid host name"),
    ("a" * 64 + ".com", "not a valid host name"),
    (".".join(["a" * 63] * 4) + ".com", "not a valid host name"),
    ("exa mple.com", "not a valid host name"),
    ("ex*ample.com", "not a valid host name"),
    ("a.123", "neither a host name nor a valid IPv4 address"),
    ("a.0x1f", "neither a host name nor a valid IPv4 address"),
    ("256.0.0.1", "neither a host name nor a valid IPv4 address"),
    ("1.2.3.4.5", "neither a host name nor a valid IPv4 address"),
    ("08.0.0.1", "neither a host name nor a valid IPv4 address"),
    ("\uff11\uff12\uff17.\uff10.\uff10.\uff11", "neither a host name nor a valid IPv4 address"),  # fullwidth digits
    ("[::1", "unbalanced brackets"),
    ("::1]", "unbalanced brackets"),
    ("[fe80::1%eth0]", "not a valid IP address"),
    ("fe80::1%eth0", "not a valid IP address"),
    ("[example.com]", "not a valid IP address"),
    ("a:b", "not a valid IP address"),
    ("ex%61mple.com", "not a valid IP address"),
    ("xn--zz.com", "not a valid host name"),
]


@pytest.mark.parametrize(("raw", "words"), NORMALIZE_INVALID, ids=[repr(c[0][:24]) for c in NORMALIZE_INVALID])
def test_normalize_host_invalid(raw: str, words: str) -> None:
    with pytest.raises(InvalidHost) as info:
        normalize_host(raw)
    assert words in str(info.value)


def test_normalize_host_total_length_limit() -> None:
    # 4 labels of 61 + "com": 4 * 62 + 3 = 251 characters is fine, one label longer is not
    ok = ".".join(["a" * 61] * 4) + ".com"
    assert len(ok) == 251
    assert normalize_host(ok) == (ok, None)
    with pytest.raises(InvalidHost):
        normalize_host(".".join(["a" * 62] * 4) + ".com")  # 255 characters


PATTERN_VALID = [
    ("example.com", HostPattern("example.com", False, None), "example.com"),
    (" Example.COM. ", HostPattern("example.com", False, None), "example.com"),
    ("*.example.com", HostPattern("example.com", True, None), "*.example.com"),
    ("*.Example.com.", HostPattern("example.com", True, None), "*.example.com"),
    ("*.example.co.uk", HostPattern("example.co.uk", True, None), "*.example.co.uk"),
    ("example.com:8443", HostPattern("example.com", False, 8443), "example.com:8443"),
    ("*.example.com:8443", HostPattern("example.com", True, 8443), "*.example.com:8443"),
    ("*.Bücher.example", HostPattern("xn--bcher-kva.example", True, None), "*.xn--bcher-kva.example"),
    ("10.1.2.3:8080", HostPattern("10.1.2.3", False, 8080), "10.1.2.3:8080"),
    ("0x0a.1.2.3", HostPattern("10.1.2.3", False, None), "10.1.2.3"),
    ("[2001:db8::1]:443", HostPattern("2001:db8::1", False, 443), "[2001:db8::1]:443"),
    ("[2001:DB8::1]", HostPattern("2001:db8::1", False, None), "[2001:db8::1]"),
    ("2001:db8::1", HostPattern("2001:db8::1", False, None), "[2001:db8::1]"),
    ("localhost:65535", HostPattern("localhost", False, 65535), "localhost:65535"),
    ("localhost:1", HostPattern("localhost", False, 1), "localhost:1"),
]


@pytest.mark.parametrize(("text", "pattern", "shown"), PATTERN_VALID, ids=[c[0] for c in PATTERN_VALID])
def test_parse_pattern_valid(text: str, pattern: HostPattern, shown: str) -> None:
    parsed = parse_pattern(text)
    assert parsed == pattern
    assert str(parsed) == shown
    assert parse_pattern(str(parsed)) == parsed  # the printed form parses back to the same pattern


PATTERN_INVALID = [
    ("*", ["matches every host"]),
    ("*.", ["matches every host"]),
    ("*:*", ["matches every host"]),
    ("*:443", ["matches every host"]),
    ("*.com", ["public suffix 'com'", "*.example.com"]),
    ("*.COM.", ["public suffix 'com'"]),
    ("*.co.uk", ["public suffix 'co.uk'"]),
    ("*.github.io", ["public suffix 'github.io'"]),
    ("a.*.com", ["'*' may only stand alone as the first label"]),
    ("*foo.com", ["'*' may only stand alone as the first label"]),
    ("*.*.example.com", ["'*' may only stand alone as the first label"]),
    ("foo*.example.com", ["'*' may only stand alone as the first label"]),
    ("http://x", ["not a URL"]),
    ("https://example.com", ["not a URL"]),
    ("x/y", ["not a URL"]),
    ("example.com/", ["not a URL"]),
    ("host:0", ["port '0'", "from 1 to 65535"]),
    ("host:70000", ["port '70000'", "from 1 to 65535"]),
    ("host:", ["port ''", "from 1 to 65535"]),
    ("host:-1", ["port '-1'", "from 1 to 65535"]),
    ("host:http", ["port 'http'", "from 1 to 65535"]),
    ("*.1.2.3.4", ["wildcards apply to names, not IP addresses"]),
    ("*.[::1]", ["wildcards apply to names, not IP addresses"]),
    ("a..b", ["allow pattern 'a..b'", "not a valid host name"]),
    ("[::1", ["unbalanced brackets"]),
    ("[::1]x", ["unexpected text after ']'"]),
    ("", ["empty host"]),
]


@pytest.mark.parametrize(("text", "words"), PATTERN_INVALID, ids=[repr(c[0]) for c in PATTERN_INVALID])
def test_parse_pattern_invalid(text: str, words: list[str]) -> None:
    with pytest.raises(InvalidHost) as info:
        parse_pattern(text)
    message = str(info.value)
    for word in words:
        assert word in message, (word, message)


def _target(authority: str) -> Target:
    return parse_authority(authority)


MATCH_CASES = [
    # (pattern, target authority, matches)
    ("example.com", "example.com:443", True),
    ("example.com", "example.com:80", True),
    ("example.com", "EXAMPLE.com.:443", True),
    ("example.com", "example.com:8443", False),
    ("example.com", "example.com:22", False),
    ("example.com", "a.example.com:443", False),
    ("example.com", "example.com.evil:443", False),
    ("example.com", "notexample.com:443", False),
    ("example.com:8443", "example.com:8443", True),
    ("example.com:8443", "example.com:443", False),
    ("example.com:8443", "example.com:80", False),
    ("example.com:443", "example.com:443", True),
    ("example.com:443", "example.com:80", False),
    ("*.x.com", "x.com:443", False),
    ("*.x.com", "a.x.com:443", True),
    ("*.x.com", "a.b.x.com:443", True),
    ("*.x.com", "A.X.COM:80", True),
    ("*.x.com", "ax.com:443", False),
    ("*.x.com", "a.x.com.evil.com:443", False),
    ("*.x.com", "a.x.com:8443", False),
    ("*.x.com:8443", "a.x.com:8443", True),
    ("*.x.com:8443", "a.x.com:443", False),
    ("*.bücher.example", "www.xn--bcher-kva.example:443", True),
    ("xn--bcher-kva.example", "Bücher.example:443", True),
    ("10.1.2.3:8080", "10.1.2.3:8080", True),
    ("10.1.2.3:8080", "0x0a.1.2.3:8080", True),
    ("10.1.2.3:8080", "167838211:8080", True),
    ("10.1.2.3:8080", "10.1.2.3:443", False),
    ("10.1.2.3", "10.1.2.3:443", True),
    ("10.1.2.3", "10.1.2.4:443", False),
    ("[2001:db8::1]:443", "[2001:0db8:0::1]:443", True),
    ("[2001:db8::1]:443", "[2001:db8::2]:443", False),
    ("2001:db8::1", "[2001:db8::1]:80", True),
]


@pytest.mark.parametrize(
    ("pattern", "authority", "expected"), MATCH_CASES, ids=[f"{c[0]}~{c[1]}" for c in MATCH_CASES]
)
def test_pattern_matches(pattern: str, authority: str, expected: bool) -> None:
    assert parse_pattern(pattern).matches(_target(authority)) is expected
    allowlist = Allowlist.parse([pattern])
    assert allowlist.match(_target(authority)) == (parse_pattern(pattern) if expected else None)


def test_wildcard_never_matches_ip_target() -> None:
    pattern = HostPattern("3.4", True, None)  # cannot come from parse_pattern; checks the ip guard in matches()
    assert pattern.matches(Target("1.2.3.4", 443, ipaddress.ip_address("1.2.3.4"))) is False


def test_allowlist_match_returns_first_matching_pattern() -> None:
    allowlist = Allowlist.parse(["other.com", "*.example.com", "api.example.com"])
    assert allowlist.match(_target("api.example.com:443")) == HostPattern("example.com", True, None)
    assert allowlist.match(_target("other.com:80")) == HostPattern("other.com", False, None)
    assert allowlist.match(_target("example.com:443")) is None
    assert Allowlist().match(_target("example.com:443")) is None


AUTHORITY_VALID = [
    ("example.com:443", Target("example.com", 443, None), "example.com:443"),
    ("Example.COM.:8443", Target("example.com", 8443, None), "example.com:8443"),
    ("127.1:22", Target("127.0.0.1", 22, ipaddress.ip_address("127.0.0.1")), "127.0.0.1:22"),
    ("[::1]:443", Target("::1", 443, ipaddress.ip_address("::1")), "[::1]:443"),
    ("[2001:DB8::1]:65535", Target("2001:db8::1", 65535, ipaddress.ip_address("2001:db8::1")),
     "[2001:db8::1]:65535"),
]


@pytest.mark.parametrize(("text", "target", "shown"), AUTHORITY_VALID, ids=[c[0] for c in AUTHORITY_VALID])
def test_parse_authority(text: str, target: Target, shown: str) -> None:
    parsed = parse_authority(text)
    assert parsed == target
    assert str(parsed) == shown


AUTHORITY_INVALID = [
    ("example.com", "needs a port"),
    ("[::1]", "needs a port"),
    ("::1", "needs a port"),
    ("::1:443", "needs a port"),
    ("example.com:", "target port ''"),
    ("example.com:0", "target port '0'"),
    ("example.com:65536", "target port '65536'"),
    ("example.com:+443", "target port '+443'"),
    ("example.com: 443", "target port ' 443'"),
    ("[::1]x", "unexpected text after ']'"),
    ("[::1:443", "unbalanced brackets"),
    ("a..b:443", "not a valid host name"),
    ("[fe80::1%eth0]:443", "not a valid IP address"),
    ("a.123:443", "neither a host name nor a valid IPv4 address"),
]


@pytest.mark.parametrize(("text", "words"), AUTHORITY_INVALID, ids=[c[0] for c in AUTHORITY_INVALID])
def test_parse_authority_invalid(text: str, words: str) -> None:
    with pytest.raises(InvalidHost) as info:
        parse_authority(text)
    assert words in str(info.value)


@pytest.mark.parametrize(("text", "expected"), [("1", 1), ("443", 443), ("65535", 65535)])
def test_parse_port_valid(text: str, expected: int) -> None:
    assert parse_port(text, "target") == expected


# A port is ASCII digits only. '\u00b2' (superscript two) passes str.isdigit() but int() refuses it, so
# parse_port must still raise InvalidHost (the documented error), not a bare ValueError.
@pytest.mark.parametrize(
    "text",
    ["0", "65536", "", "-1", "+1", " 1", "1 ", "0x50", "\u00b2", "1\u00b2"],
    ids=["zero", "too-big", "empty", "negative", "plus", "lead-space", "trail-space", "hex", "superscript-2",
         "digit-superscript"],
)
def test_parse_port_invalid(text: str) -> None:
    with pytest.raises(InvalidHost, match="is not a number from 1 to 65535"):
        parse_port(text, "target")
