"""Host names, targets and allowlist patterns.

Matching rules (also in docs/allowlist.md):
- Names compare case-insensitively, a single trailing dot is ignored, and Unicode names are compared in
  their IDNA (punycode) form, so ``Bücher.example.`` and ``xn--bcher-kva.example`` are the same host.
- ``example.com`` matches only that host. ``*.example.com`` matches every name below it at any depth
  (``a.example.com``, ``a.b.example.com``) but not ``example.com`` itself: list both if you want both.
- Without a port a pattern allows ports 443 and 80; ``host:8443`` allows only that port.
- IP literals may be listed exactly (``10.1.2.3:8080``, ``[2001:db8::1]:443``); the address guard still
  applies to them, so a private address also needs ``--allow-private``.
- Patterns that match everything or a whole public suffix (``*``, ``*.com``, ``*.co.uk``) are refused.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

import idna
from publicsuffixlist import PublicSuffixList

from claude_bottle.policy.addresses import IPAddress, parse_ip_literal

DEFAULT_PORTS = (443, 80)
_LABEL = re.compile(r"[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?")
_NUMERIC_LABEL = re.compile(r"(0x[0-9a-f]*|[0-9]+)")


class InvalidHost(ValueError):
    """A host, port or pattern that cannot be used; the message says why."""


@dataclass(frozen=True)
class Target:
    """Where a client asked to go: a normalised name, or an IP literal, and a port."""

    host: str  # normalised: lower-case ASCII name, or the canonical text of the IP literal
    port: int
    ip: IPAddress | None = None

    def __str__(self) -> str:
        host = f"[{self.host}]" if self.ip is not None and self.ip.version == 6 else self.host
        return f"{host}:{self.port}"


def normalize_host(raw: str) -> tuple[str, IPAddress | None]:
    """Canonical form of a host as (name, None) or (address text, address). Raises InvalidHost."""
    text = raw.strip()
    if text.startswith("[") != text.endswith("]"):
        raise InvalidHost(f"unbalanced brackets in host {raw!r}")
    ip = parse_ip_literal(text)
    if ip is not None:
        return str(ip), ip
    if text.startswith("[") or ":" in text or "%" in text:
        raise InvalidHost(f"{raw!r} is not a valid IP address")
    if text.endswith("."):
        text = text[:-1]
    if not text:
        raise InvalidHost("empty host")
    try:
        if text.isascii():
            # ASCII needs no IDNA mapping (which would refuse the '_' some hosts use); punycode must decode.
            name = text.lower()
            if any(label.startswith("xn--") for label in name.split(".")):
                idna.decode(name)
        else:
            name = idna.encode(text, uts46=True, std3_rules=False).decode("ascii")
    except (idna.IDNAError, UnicodeError) as exc:
        raise InvalidHost(f"{raw!r} is not a valid host name ({exc})") from None
    labels = name.split(".")
    if len(name) > 253 or not all(_LABEL.fullmatch(label) for label in labels):
        raise InvalidHost(f"{raw!r} is not a valid host name")
    if _NUMERIC_LABEL.fullmatch(labels[-1]):
        # A numeric last label makes resolvers read the whole host as an IPv4 literal.
        raise InvalidHost(f"{raw!r} is neither a host name nor a valid IPv4 address")
    return name, None


def parse_port(text: str, what: str) -> int:
    if not (text.isascii() and text.isdigit()) or not 1 <= int(text) <= 65535:
        raise InvalidHost(f"{what} port {text!r} is not a number from 1 to 65535")
    return int(text)


def split_host_port(text: str) -> tuple[str, str | None]:
    """Split ``host``, ``host:port``, ``[v6]`` or ``[v6]:port``; a bare IPv6 address has no port."""
    if text.startswith("["):
        end = text.find("]")
        if end < 0:
            raise InvalidHost(f"unbalanced brackets in {text!r}")
        rest = text[end + 1 :]
        if rest and not rest.startswith(":"):
            raise InvalidHost(f"unexpected text after ']' in {text!r}")
        return text[: end + 1], (rest[1:] if rest else None)
    if text.count(":") == 1:
        host, port = text.split(":")
        return host, port
    return text, None


def parse_authority(text: str) -> Target:
    """The ``host:port`` of a CONNECT request; the port is required."""
    host, port = split_host_port(text)
    if port is None:
        raise InvalidHost(f"CONNECT target {text!r} needs a port, as in example.com:443")
    name, ip = normalize_host(host)
    return Target(name, parse_port(port, "target"), ip)


@functools.cache
def _public_suffixes() -> PublicSuffixList:
    return PublicSuffixList()


@dataclass(frozen=True)
class HostPattern:
    """One allowlist entry: an exact host or ``*.suffix``, with one port or the default ports."""

    host: str
    wildcard: bool
    port: int | None

    def matches(self, target: Target) -> bool:
        if target.port not in ((self.port,) if self.port is not None else DEFAULT_PORTS):
            return False
        if self.wildcard:
            return target.ip is None and target.host.endswith("." + self.host)
        return target.host == self.host

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        text = f"*.{host}" if self.wildcard else host
        return f"{text}:{self.port}" if self.port is not None else text


def parse_pattern(text: str) -> HostPattern:
    """Parse one ``--allow`` entry. Raises InvalidHost with a message that says how to write it."""
    raw = text.strip()
    if raw in ("*", "*.", "*:*") or raw.startswith("*:"):
        raise InvalidHost(f"allow pattern {text!r} matches every host; list the hosts you need instead")
    if "://" in raw or "/" in raw:
        raise InvalidHost(f"allow pattern {text!r}: give a host, not a URL (for example api.github.com)")
    host, port_text = split_host_port(raw)
    port = parse_port(port_text, f"allow pattern {text!r}:") if port_text is not None else None
    wildcard = host.startswith("*.")
    body = host[2:] if wildcard else host
    if "*" in body:
        raise InvalidHost(
            f"allow pattern {text!r}: '*' may only stand alone as the first label, as in *.example.com"
        )
    try:
        name, ip = normalize_host(body)
    except InvalidHost as exc:
        raise InvalidHost(f"allow pattern {text!r}: {exc}") from None
    if wildcard and ip is not None:
        raise InvalidHost(f"allow pattern {text!r}: wildcards apply to names, not IP addresses")
    if wildcard and _public_suffixes().is_public(name):
        raise InvalidHost(
            f"allow pattern {text!r} would match every site under the public suffix {name!r}; "
            f"list the sites you need, such as *.example.{name}"
        )
    return HostPattern(name, wildcard, port)


@dataclass(frozen=True)
class Allowlist:
    patterns: tuple[HostPattern, ...] = ()

    @classmethod
    def parse(cls, texts: list[str] | tuple[str, ...]) -> Allowlist:
        return cls(tuple(parse_pattern(t) for t in texts))

    def match(self, target: Target) -> HostPattern | None:
        return next((p for p in self.patterns if p.matches(target)), None)

    def texts(self) -> tuple[str, ...]:
        """Each pattern as ``--allow`` and an agent file write it (parsed back to the same pattern)."""
        return tuple(str(p) for p in self.patterns)
