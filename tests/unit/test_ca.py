"""The gate's run CA: leaves that real TLS clients accept for their host and nothing else, name constraints
that clients enforce even on a leaf minted past the gate's own check, the cache, and a key that nothing the
gate writes contains."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import io
import os
import pickle
import socket
import ssl
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from claude_bottle.credentials import Credential
from claude_bottle.gate import ca as ca_module
from claude_bottle.gate import server
from claude_bottle.gate.audit import AuditLog
from claude_bottle.gate.ca import LEAF_RENEW_AFTER, HostNotPermitted, InvalidHost, RunCA, server_context
from claude_bottle.gate.ready import Ready, older_gate_said, parse_ready, ready_said
from claude_bottle.gate.settings import Endpoint, GateSettings, Upstream, parse_allowlist
from claude_bottle.policy.hosts import Allowlist
from tests.helpers import connect_via, make_token
from tests.prerequisites import require


def run_ca(*patterns: str, upstream: str = "api.anthropic.com", **kwargs: object) -> RunCA:
    return RunCA.generate(Allowlist.parse(patterns).patterns, (upstream,), **kwargs)  # type: ignore[arg-type]


@contextlib.contextmanager
def tls_server(context: ssl.SSLContext, host: str = "127.0.0.1") -> Iterator[tuple[str, int]]:
    """A loopback server that completes one handshake with ``context`` and answers b"ok"; bounded to a few
    connections and seconds."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listener = socket.create_server((host, 0), family=family)
    listener.settimeout(5)

    def serve() -> None:
        for _ in range(1):  # one handshake per server
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with contextlib.suppress(OSError), conn:
                conn.settimeout(5)
                with context.wrap_socket(conn, server_side=True) as tls:
                    tls.sendall(b"ok")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield host, listener.getsockname()[1]
    finally:
        listener.close()
        thread.join(6)


def client_context(ca: RunCA) -> ssl.SSLContext:
    context = ssl.create_default_context(cadata=ca.certificate_pem.decode())
    context.verify_flags |= ssl.VERIFY_X509_STRICT  # what Python 3.13 clients do by default
    context.set_alpn_protocols(["h2", "http/1.1"])
    return context


def handshake(address: tuple[str, int], server_hostname: str, context: ssl.SSLContext) -> tuple[bytes, str | None]:
    with socket.create_connection(address, timeout=5) as raw, \
            context.wrap_socket(raw, server_hostname=server_hostname) as tls:
        return tls.recv(2), tls.selected_alpn_protocol()


def test_a_client_trusting_the_ca_accepts_the_leaf_for_its_host() -> None:
    ca = run_ca("registry.npmjs.org")
    with tls_server(ca.context_for("registry.npmjs.org")) as address:
        assert handshake(address, "registry.npmjs.org", client_context(ca)) == (b"ok", "http/1.1")


def test_a_client_that_does_not_trust_the_ca_refuses_the_leaf() -> None:
    ca = run_ca("registry.npmjs.org")
    with tls_server(ca.context_for("registry.npmjs.org")) as address, \
            pytest.raises(ssl.SSLCertVerificationError, match="certificate verify failed"):
        handshake(address, "registry.npmjs.org", ssl.create_default_context())


def test_the_leaf_is_refused_for_another_host() -> None:
    ca = run_ca("*.example.com")
    with tls_server(ca.context_for("a.example.com")) as address, \
            pytest.raises(ssl.SSLCertVerificationError, match="Hostname mismatch"):
        handshake(address, "b.example.com", client_context(ca))


def test_another_run_s_ca_does_not_vouch_for_this_one_s_leaves() -> None:
    ours, theirs = run_ca("example.com"), run_ca("example.com")
    with tls_server(ours.context_for("example.com")) as address, \
            pytest.raises(ssl.SSLCertVerificationError, match="certificate verify failed"):
        handshake(address, "example.com", client_context(theirs))


@pytest.mark.parametrize("host", ["127.0.0.1", "::1"])
def test_ip_hosts_get_an_address_certificate(host: str) -> None:
    require(host != "::1" or socket.has_ipv6, "no IPv6 on this machine")
    ca = run_ca(f"[{host}]:8443" if ":" in host else f"{host}:8443")
    with tls_server(ca.context_for(host), host) as address:
        assert handshake(address, host, client_context(ca))[0] == b"ok"
    leaf, _ = ca._mint(host, ca_module.normalize_host(host)[1], ca_module.time.time())
    assert [str(ip) for ip in leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
            .get_values_for_type(x509.IPAddress)] == [host]


def test_the_server_context_speaks_tls_1_2_and_later_only() -> None:
    ca = run_ca("example.com")
    old = client_context(ca)
    with warnings.catch_warnings():  # TLS 1.1 is deprecated: that is the point
        warnings.simplefilter("ignore", DeprecationWarning)
        old.minimum_version = old.maximum_version = ssl.TLSVersion.TLSv1_1
    with contextlib.suppress(ValueError, ssl.SSLError):  # a local OpenSSL may refuse TLS 1.1 on its own
        old.set_ciphers("DEFAULT:@SECLEVEL=0")
    with tls_server(ca.context_for("example.com")) as address, pytest.raises(ssl.SSLError):
        handshake(address, "example.com", old)
    context = ca.context_for("example.com")
    assert context.minimum_version == ssl.TLSVersion.TLSv1_2


def test_leaves_are_ecdsa_p256_short_lived_and_for_servers() -> None:
    ca = run_ca("example.com")
    leaf, key = ca._mint("example.com", None, 1_800_000_000.0)
    assert isinstance(key, ec.EllipticCurvePrivateKey) and key.curve.name == "secp256r1"
    assert (leaf.not_valid_after_utc - leaf.not_valid_before_utc).total_seconds() <= 24 * 3600 + 300
    assert leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
        x509.DNSName) == ["example.com"]
    assert not leaf.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert leaf.issuer == ca.certificate.subject


# -- name constraints: the gate's check, and the clients' own ------------------------------------------------


@pytest.mark.parametrize(("patterns", "host"), [
    (("example.com",), "example.org"),
    (("*.example.com",), "example.net"),
    (("example.com",), "10.0.0.1"),  # no address allowlisted: no address certificate
    (("10.0.0.1:443",), "10.0.0.2"),
    (("*.anthropic.com",), "api.anthropic.com"),  # the API upstream, never
    ((), "example.com"),
])
def test_hosts_outside_the_allowlist_get_no_leaf(patterns: tuple[str, ...], host: str) -> None:
    ca = run_ca(*patterns)
    with pytest.raises(HostNotPermitted, match=host):
        ca.context_for(host)
    assert ca.minted == 0


@pytest.mark.parametrize(("patterns", "host"), [
    (("example.com",), "evil.example"),
    (("*.example.com",), "bank.example"),
    (("example.com",), "127.0.0.1"),
    (("127.0.0.2:443",), "127.0.0.1"),
    (("*.anthropic.com",), "api.anthropic.com"),
    ((), "example.com"),
])
def test_clients_refuse_a_leaf_outside_the_constraints_even_if_minted(patterns: tuple[str, ...], host: str) -> None:
    """The attack: a leaf for a host outside the allowlist, minted past ``context_for``'s check (as a gate
    bug, or someone holding the key, would). The CA's name constraints make clients refuse it."""
    ca = run_ca(*patterns)
    name, ip = ca_module.normalize_host(host)
    leaf, key = ca._mint(name, ip, ca_module.time.time())
    chain = leaf.public_bytes(serialization.Encoding.PEM) + ca.certificate_pem
    context = server_context(chain, key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                      serialization.NoEncryption()))
    with tls_server(context) as address, pytest.raises(ssl.SSLCertVerificationError, match="violation"):
        handshake(address, host, client_context(ca))


def test_every_host_an_allowlist_allows_can_be_certified() -> None:
    ca = run_ca("example.com", "*.example.org", "api.github.com:443", "203.0.113.7:8443", "[2001:db8::7]:443")
    for host in ("example.com", "a.example.org", "a.b.example.org", "api.github.com", "203.0.113.7", "2001:db8::7",
                 "EXAMPLE.com."):
        ca.context_for(host)
    constraints = ca.certificate.extensions.get_extension_for_class(x509.NameConstraints)
    assert constraints.critical


def test_a_host_that_is_not_a_host_is_refused() -> None:
    with pytest.raises(InvalidHost):
        run_ca("example.com").context_for("exa mple.com")


# -- the cache -------------------------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


def test_a_host_s_context_is_minted_once_and_reused() -> None:
    ca = run_ca("*.example.com")
    first = ca.context_for("a.example.com")
    assert ca.context_for("A.example.com.") is first
    assert ca.minted == 1


def test_the_cache_keeps_the_most_recently_used_hosts_up_to_its_bound() -> None:
    ca = run_ca("*.example.com", max_hosts=3)
    for name in ("a", "b", "c"):
        ca.context_for(f"{name}.example.com")
    ca.context_for("a.example.com")  # a is now the most recent: b goes first
    ca.context_for("d.example.com")
    assert ca.cached_hosts() == ["c.example.com", "a.example.com", "d.example.com"]
    for n in range(20):
        ca.context_for(f"h{n}.example.com")
    assert len(ca.cached_hosts()) == 3 and ca.minted == 24


def test_a_leaf_is_minted_again_when_half_its_life_is_gone() -> None:
    clock = Clock()
    ca = run_ca("example.com", clock=clock)
    first = ca.context_for("example.com")
    clock.now += LEAF_RENEW_AFTER.total_seconds() - 1
    assert ca.context_for("example.com") is first
    clock.now += 2
    assert ca.context_for("example.com") is not first and ca.minted == 2


def test_a_cache_of_no_hosts_is_refused() -> None:
    with pytest.raises(ValueError, match="max_hosts"):
        run_ca("example.com", max_hosts=0)


# -- the announcement -----------------------------------------------------------------------------------------


def test_the_announcement_carries_the_certificate_and_nothing_else() -> None:
    ca = run_ca("example.com")
    line = Ready(Endpoint("127.0.0.1", 1), Endpoint("::1", 2), "https://api.example", ca.certificate_der).line()
    assert "\n" not in line and line.startswith("claude-bottle gate: ready {")
    ready = parse_ready(f"something first\n{line}\nsomething after\n")
    assert ready is not None and ready.ca_pem() == ca.certificate_pem
    assert (ready.api, ready.proxy, ready.upstream) == (Endpoint("127.0.0.1", 1), Endpoint("::1", 2),
                                                        "https://api.example")
    assert ready_said(f"{line}\n".encode()) and not ready_said(line.encode())  # whole lines only
    assert parse_ready("claude-bottle gate: ready {\"api\": \"gate:8080\"}\n") is None
    assert parse_ready("claude-bottle gate: ready not json\n") is None
    bad = Ready(Endpoint("gate", 1), Endpoint("gate", 2), "https://api.example", b"not a certificate").line()
    ready = parse_ready(bad + "\n")
    assert ready is not None and ready.ca_pem() is None  # base64, not a certificate


def test_an_older_gate_images_words_once_it_listens_are_told_apart_from_the_ready_line() -> None:
    older = "claude-bottle gate: API on gate:8080, proxy on gate:3128, upstream https://api.anthropic.com"
    assert older_gate_said(f"starting\n{older}\n".encode()) and not older_gate_said(older.encode())
    assert not ready_said(f"{older}\n".encode()) and parse_ready(f"{older}\n") is None
    line = Ready(Endpoint("gate", 1), Endpoint("gate", 2), "https://api.example", b"").line()
    assert not older_gate_said(f"{line}\n".encode())


# -- the key stays in the gate's memory ------------------------------------------------------------------------


def files_under(folder: Path) -> list[bytes]:
    return [path.read_bytes() for path in folder.rglob("*") if path.is_file()]


def spellings(key: ec.EllipticCurvePrivateKey) -> list[bytes]:
    """Ways a private key could be written out."""
    value = key.private_numbers().private_value
    raw = value.to_bytes(32, "big")
    forms = [key.private_bytes(serialization.Encoding.PEM, fmt, serialization.NoEncryption())
             for fmt in (serialization.PrivateFormat.PKCS8, serialization.PrivateFormat.TraditionalOpenSSL)]
    der = key.private_bytes(serialization.Encoding.DER, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    return [*forms, base64.b64encode(der), raw.hex().encode(), raw.hex().upper().encode(), str(value).encode(),
            base64.b64encode(raw)]


def test_the_ca_cannot_be_pickled_copied_or_printed_with_its_key() -> None:
    ca = run_ca("example.com")
    for attempt in (lambda: pickle.dumps(ca), lambda: copy.copy(ca), lambda: copy.deepcopy(ca)):
        with pytest.raises(TypeError, match="never leaves"):
            attempt()
    assert all(form.decode() not in repr(ca) for form in spellings(ca._key))


async def test_nothing_the_gate_writes_holds_the_ca_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A whole gate (``server.run``) with a CA certificate file, its announcements and audit: the key is in
    none of them, in no file under the gate's folders, in no environment variable, and no leaf is served
    with it."""
    made: list[RunCA] = []
    loaded_keys: list[bytes] = []
    real_generate, real_server_context = RunCA.generate, ca_module.server_context

    def generate(*args: object, **kwargs: object) -> RunCA:
        made.append(real_generate(*args, **kwargs))  # type: ignore[arg-type]
        return made[-1]

    def spy(chain: bytes, key: bytes) -> ssl.SSLContext:
        loaded_keys.append(key)
        return real_server_context(chain, key)

    monkeypatch.setattr(RunCA, "generate", generate)
    monkeypatch.setattr(ca_module, "server_context", spy)
    monkeypatch.chdir(tmp_path)
    secret = make_token()
    config = GateSettings(api_listen=Endpoint("127.0.0.1", 0), proxy_listen=Endpoint("127.0.0.1", 0),
                        credential=Credential.parse(secret, "test"), upstream=Upstream("http", "127.0.0.9", 9, ""),
                        allowlist=parse_allowlist(["*.example.com", "127.0.0.2:443"]))
    audit, said, ready = io.StringIO(), [], asyncio.Event()
    cert_out = tmp_path / "ca.pem"

    def announce(line: str) -> None:
        said.append(line)
        if parse_ready(line) is not None:
            ready.set()

    task = asyncio.create_task(server.run(config, AuditLog(audit, (secret,)), announce, cert_out))
    try:
        async with asyncio.timeout(10):
            await ready.wait()
        (ca,) = made
        for host in ("a.example.com", "b.example.com", "127.0.0.2"):
            ca.context_for(host)
        announced = parse_ready("\n".join(said))
        assert announced is not None
        status, _, _, writer = await connect_via(announced.proxy, "outside.example:443")
        writer.close()
        assert status == 403
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    written = [audit.getvalue().encode(), "\n".join(said).encode(), *files_under(tmp_path),
               "\n".join(f"{k}={v}" for k, v in os.environ.items()).encode()]
    assert audit.getvalue() and said and ca.certificate_pem in written
    for form in spellings(ca._key):
        assert not any(form in text for text in written), form[:40]
        assert not any(form in key for key in loaded_keys)
    assert len(loaded_keys) == 3


def test_a_stand_in_s_leaf_is_issued_for_its_host_and_nothing_else(tmp_path: Path) -> None:
    ca = run_ca("inspected", "registry")
    issued = tmp_path / "inspected.pem"
    issued.write_bytes(ca.issue("inspected"))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(issued)
    with tls_server(context) as address:
        assert handshake(address, "inspected", client_context(ca))[0] == b"ok"
    with tls_server(context) as address, pytest.raises(ssl.SSLCertVerificationError, match="Hostname mismatch"):
        handshake(address, "registry", client_context(ca))
    with pytest.raises(HostNotPermitted):
        ca.issue("api.anthropic.com")
