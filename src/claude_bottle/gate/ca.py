"""The gate's certificate authority for one run: made at start, held in memory, gone when the gate exits.

The gate terminates TLS toward allowlisted hosts with leaf certificates this CA mints on demand. Its private
key exists only in this process's memory: it is never serialised, so it is in no file, variable, argument,
log line or pickle. Only the certificate leaves the gate: announced on the gate's start-up output
(``announcement``), written by ``claude-bottle gate --ca-cert-out``, and added to the bottle's trust store by
the host before the bottle starts.

Name constraints (RFC 5280, critical) limit the CA to the allowlisted names, so a client that trusts it
trusts it for nothing else, even if the key were stolen from a running gate:

- ``host`` and ``*.host`` both become the subtree ``host``: a constraint cannot say "below this name but not
  the name itself", nor carry a port; the egress policy still decides those.
- An IP literal in the allowlist becomes that one address (/32 or /128); without any, every IP address is
  excluded, so no address certificate can be minted.
- The API upstream's host is excluded: the CA can never speak for the credential's own destination.
- The names are fixed when the gate starts; a gate with other names needs another CA (and the hosts of a
  run's bottle trust only its own gate's).
- With no allowlisted name the CA permits only the ``invalid`` name (RFC 6761), which never resolves.
- In learn mode (``every_name``) it permits every name but the excluded ones, so the destinations a learning
  gate lets through are inspected too (rules can be suggested, DLP applies); IP addresses stay as above.

Clients that enforce name constraints: OpenSSL (Python, curl, node, pip), GnuTLS (Debian's git), BoringSSL
(Claude Code's runtime), Go, NSS. ``context_for`` also refuses a host outside them, before minting.

Leaves are ECDSA P-256 (a few hundred microseconds to mint; see benchmarks/inspection_bench.py), valid for
a day from five minutes ago, and minted again after half of that; at most ``max_hosts`` server contexts are
kept, least recently used first out.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import ipaddress
import os
import ssl
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from claude_bottle.policy.addresses import IPAddress, IPNetwork
from claude_bottle.policy.hosts import HostPattern, InvalidHost, normalize_host

CA_LIFETIME = dt.timedelta(days=365)  # the key dies with the process long before; this only bounds a copy
LEAF_LIFETIME = dt.timedelta(days=1)
LEAF_RENEW_AFTER = LEAF_LIFETIME / 2
BACKDATE = dt.timedelta(minutes=5)  # clocks of the gate and its clients may differ a little
MAX_HOSTS = 256
NOTHING = "invalid"  # RFC 6761: the name permitted when nothing is allowlisted
ALPN = ["http/1.1"]
_ALL_ADDRESSES = (ipaddress.ip_network("0.0.0.0/0"), ipaddress.ip_network("::/0"))


class HostNotPermitted(ValueError):
    """``context_for`` was asked for a host outside the CA's names: not allowlisted when the gate started,
    or the API upstream's. The message names the host."""


@dataclass(frozen=True)
class NameScope:
    """The names a CA may certify, as its name constraints say them. Pure."""

    names: tuple[str, ...]  # DNS subtrees: the name and every name below it
    addresses: tuple[IPNetwork, ...]  # single addresses
    excluded_names: tuple[str, ...] = ()
    excluded_addresses: tuple[IPNetwork, ...] = ()
    every_name: bool = False  # learn mode: every DNS name but the excluded ones (``names`` then play no part)

    @classmethod
    def of(cls, patterns: Iterable[HostPattern], excluded_hosts: Iterable[str] = (),
           every_name: bool = False) -> NameScope:
        """The scope of allowlist ``patterns`` (ports play no part), less ``excluded_hosts``; with
        ``every_name``, every name less ``excluded_hosts``."""
        names: dict[str, None] = {}
        addresses: dict[IPNetwork, None] = {}
        for pattern in patterns:
            ip = _ip(pattern.host)
            if ip is None:
                names[pattern.host] = None
            else:
                addresses[ipaddress.ip_network(ip)] = None
        excluded_names: dict[str, None] = {}
        excluded_addresses: dict[IPNetwork, None] = {}
        for host in excluded_hosts:
            name, ip = normalize_host(host)
            if ip is None:
                excluded_names[name] = None
            else:
                excluded_addresses[ipaddress.ip_network(ip)] = None
        return cls(tuple(names), tuple(addresses), tuple(excluded_names), tuple(excluded_addresses), every_name)

    def permits(self, host: str, ip: IPAddress | None) -> bool:
        """Whether a certificate for ``host`` (normalised; ``ip`` its address when it is a literal) is
        within the constraints. Exclusions win, as in RFC 5280."""
        if ip is not None:
            return not any(ip in net for net in self.excluded_addresses) and any(ip in n for n in self.addresses)
        return not any(_below(host, base) for base in self.excluded_names) and (self.every_name or any(
            _below(host, base) for base in self.names))

    def constraints(self) -> x509.NameConstraints:
        """Without a permitted DNS subtree (``every_name``), names are limited by the exclusions only; the
        excluded addresses are never empty, so neither list is."""
        permitted: list[x509.GeneralName] = [] if self.every_name else [
            x509.DNSName(n) for n in self.names or (NOTHING,)]
        permitted += [x509.IPAddress(net) for net in self.addresses]
        excluded: list[x509.GeneralName] = [x509.DNSName(n) for n in self.excluded_names]
        excluded += [x509.IPAddress(net) for net in (self.excluded_addresses if self.addresses else _ALL_ADDRESSES)]
        return x509.NameConstraints(permitted_subtrees=permitted or None, excluded_subtrees=excluded or None)


def _ip(host: str) -> IPAddress | None:
    with contextlib.suppress(ValueError):
        return ipaddress.ip_address(host)
    return None


def _below(host: str, base: str) -> bool:
    return host == base or host.endswith("." + base)


class RunCA:
    """A CA whose private key never leaves this object. Make one with ``RunCA.generate``.

    ``context_for(host)`` is what TLS termination calls; ``certificate_pem`` and ``certificate_der`` (announced at
    start: gate/ready.py) are the public parts. The object refuses to be pickled or copied, and its ``repr`` names
    only the certificate."""

    def __init__(self, key: ec.EllipticCurvePrivateKey, certificate: x509.Certificate, scope: NameScope,
                 max_hosts: int = MAX_HOSTS, clock: Callable[[], float] = time.time) -> None:
        if max_hosts < 1:
            raise ValueError(f"max_hosts must be at least 1, not {max_hosts}")
        self._key = key
        self.certificate = certificate
        self.scope = scope
        self.max_hosts = max_hosts
        self._clock = clock
        self._contexts: OrderedDict[str, tuple[ssl.SSLContext, float]] = OrderedDict()
        self.minted = 0  # leaves minted so far (a renewal counts)

    @classmethod
    def generate(cls, patterns: Iterable[HostPattern] = (), excluded_hosts: Iterable[str] = (),
                 max_hosts: int = MAX_HOSTS, clock: Callable[[], float] = time.time,
                 every_name: bool = False) -> RunCA:
        """A new CA limited to the names of allowlist ``patterns`` (``every_name``: to every name, for learn
        mode), never for ``excluded_hosts``."""
        scope = NameScope.of(patterns, excluded_hosts, every_name)
        key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.fromtimestamp(clock(), dt.UTC)
        name = x509.Name([
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "claude-bottle"),
            x509.NameAttribute(NameOID.COMMON_NAME, f"claude-bottle gate CA {os.urandom(4).hex()}"),
        ])
        identifier = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
        certificate = (
            x509.CertificateBuilder()
            .subject_name(name).issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - BACKDATE).not_valid_after(now + CA_LIFETIME)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                         crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(scope.constraints(), critical=True)
            .add_extension(identifier, critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(identifier), critical=False)
            .sign(key, hashes.SHA256())
        )
        return cls(key, certificate, scope, max_hosts, clock)

    # -- the public parts -------------------------------------------------------------------------------

    @property
    def certificate_pem(self) -> bytes:
        return self.certificate.public_bytes(serialization.Encoding.PEM)

    @property
    def certificate_der(self) -> bytes:
        """The certificate as the gate announces it at start (``gate.ready``)."""
        return self.certificate.public_bytes(serialization.Encoding.DER)

    def __repr__(self) -> str:
        return f"RunCA({self.certificate.subject.rfc4514_string()!r}, {len(self._contexts)} hosts)"

    def __reduce__(self) -> tuple[object, ...]:
        raise TypeError("the run CA holds a private key that never leaves the gate's memory")

    def __copy__(self) -> RunCA:
        raise TypeError("the run CA holds a private key that never leaves the gate's memory")

    def __deepcopy__(self, memo: object) -> RunCA:
        raise TypeError("the run CA holds a private key that never leaves the gate's memory")

    # -- leaves -----------------------------------------------------------------------------------------

    def context_for(self, host: str) -> ssl.SSLContext:
        """A server-side TLS context presenting a leaf for ``host`` (a name or an IP literal, normalised
        here), TLS 1.2 or later, ALPN http/1.1. Cached per host; minted again when half its life is gone.

        Raises ``HostNotPermitted`` for a host outside the CA's names, and ``InvalidHost`` for one that is
        not a host at all."""
        name, ip = normalize_host(host)
        now = self._clock()
        cached = self._contexts.get(name)
        if cached is not None and now < cached[1]:
            self._contexts.move_to_end(name)
            return cached[0]
        if not self.scope.permits(name, ip):
            raise HostNotPermitted(f"{name} is not among the names this gate's CA may certify (the allowlist "
                                   "when the gate started, less the API upstream)")
        context = self._server_context(name, ip, now)
        self._contexts[name] = (context, now + LEAF_RENEW_AFTER.total_seconds())
        self._contexts.move_to_end(name)
        while len(self._contexts) > self.max_hosts:
            self._contexts.popitem(last=False)
        return context

    def cached_hosts(self) -> list[str]:
        """The hosts with a cached context, least recently used first."""
        return list(self._contexts)

    def issue(self, host: str) -> bytes:
        """A leaf for ``host`` and its private key, as one PEM file, for a server this CA's clients must trust
        that is not the gate (``verify``'s HTTPS stand-ins). The gate never calls it: its own leaves' keys
        stay in memory. Raises ``HostNotPermitted`` outside the CA's names."""
        name, ip = normalize_host(host)
        if not self.scope.permits(name, ip):
            raise HostNotPermitted(f"{name} is not among the names this CA may certify")
        leaf, key = self._mint(name, ip, self._clock())
        return leaf.public_bytes(serialization.Encoding.PEM) + self.certificate_pem + key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())

    def _mint(self, name: str, ip: IPAddress | None, now: float) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
        """A leaf for ``name``, whatever the scope says (``context_for`` checks it first; tests do not)."""
        key = ec.generate_private_key(ec.SECP256R1())
        start = dt.datetime.fromtimestamp(now, dt.UTC)
        alt: x509.GeneralName = x509.IPAddress(ip) if ip is not None else x509.DNSName(name)
        ca_identifier = self.certificate.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
        leaf = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "claude-bottle gate")]))
            .issuer_name(self.certificate.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(start - BACKDATE)
            .not_valid_after(min(start + LEAF_LIFETIME, self.certificate.not_valid_after_utc))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False, key_cert_sign=False,
                                         crl_sign=False, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.SubjectAlternativeName([alt]), critical=False)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_identifier),
                           critical=False)
            .sign(self._key, hashes.SHA256())
        )
        self.minted += 1
        return leaf, key

    def _server_context(self, name: str, ip: IPAddress | None, now: float) -> ssl.SSLContext:
        leaf, key = self._mint(name, ip, now)
        chain = leaf.public_bytes(serialization.Encoding.PEM) + self.certificate_pem
        key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                    serialization.NoEncryption())
        return server_context(chain, key_pem)


def server_context(chain_pem: bytes, key_pem: bytes) -> ssl.SSLContext:
    """A server context for a certificate chain and its key, given as bytes: ``ssl`` loads them only from
    paths, so each goes through a pipe (``/dev/fd/N``), never a file."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_alpn_protocols(ALPN)
    with _piped(chain_pem) as chain_path, _piped(key_pem) as key_path:
        context.load_cert_chain(chain_path, key_path)
    return context


@contextlib.contextmanager
def _piped(data: bytes) -> Iterator[str]:
    """A path that reads ``data`` once: the read end of a pipe already holding it all (a pipe holds at least
    16 KiB; a chain and a key are a few hundred bytes)."""
    if len(data) > 16 * 1024:
        raise ValueError(f"{len(data)} bytes do not fit a pipe's buffer")
    read, write = os.pipe()
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(write, view):]
        os.close(write)
        write = -1
        yield f"/dev/fd/{read}"
    finally:
        os.close(read)
        if write >= 0:
            os.close(write)


__all__ = ["HostNotPermitted", "InvalidHost", "NameScope", "RunCA", "server_context"]
