"""TLS termination on the proxy listener: the gate completes the client's handshake with a leaf from the
run's CA, verifies the real upstream itself, and serves each request through the forward path."""

from __future__ import annotations

import asyncio
import ipaddress
import ssl
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import trustme

from claude_bottle.gate.resolver import StaticResolver
from claude_bottle.stub import StubUpstream
from tests.conftest import GateFactory, RunningGate
from tests.helpers import connect_via, eventually, messages_request, parse_head, read_all

pytestmark = pytest.mark.asyncio

HOST = "api.example.test"
LOOPBACK = ("127.0.0.0/8",)


@dataclass
class StandInCA:
    """Stands in for the run's CA: a trustme CA minting a leaf per host, as ``context_for`` promises."""

    ca: trustme.CA = field(default_factory=trustme.CA)
    hosts: list[str] = field(default_factory=list)

    def context_for(self, host: str) -> ssl.SSLContext:
        self.hosts.append(host)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.set_alpn_protocols(["http/1.1"])
        self.ca.issue_cert(host).configure_cert(context)
        return context

    def client_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context()
        self.ca.configure_trust(context)
        context.set_alpn_protocols(["http/1.1"])
        return context


@dataclass
class Upstream:
    stub: StubUpstream
    ca_file: Path
    ca: trustme.CA

    @property
    def target(self) -> str:
        return f"{HOST}:{self.stub.port}"


@pytest.fixture
async def upstream(tmp_path: Path) -> AsyncIterator[Upstream]:
    """An HTTPS server for HOST behind a private CA (given to the gate with --extra-ca)."""
    ca = trustme.CA()
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert(HOST).configure_cert(context)
    ca_file = tmp_path / "upstream-ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    async with StubUpstream("127.0.0.2", tls=context) as stub:
        yield Upstream(stub, ca_file, ca)


def gate_for(make_gate: GateFactory, upstream: Upstream, ca: StandInCA | None, trusted: bool = True, **limits: float):
    resolver = StaticResolver({HOST: [ipaddress.ip_address("127.0.0.2")]})
    return make_gate(allow=(upstream.target,), allow_private=LOOPBACK, resolver=resolver, ca=ca,
                     extra_ca=(str(upstream.ca_file),) if trusted else (), **limits)


async def tls_via(gate: RunningGate, target: str, client: ssl.SSLContext) -> tuple[
        asyncio.StreamReader, asyncio.StreamWriter]:
    status, _, reader, writer = await connect_via(gate.proxy, target)
    assert status == 200
    await writer.start_tls(client, server_hostname=target.split(":")[0])
    return reader, writer


def get(path: str, host: str, extra: str = "") -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: {host}\r\n{extra}\r\n".encode()


async def response(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    async with asyncio.timeout(5):
        head = await reader.readuntil(b"\r\n\r\n")
        status, headers = parse_head(head)
        if "content-length" in headers:
            body = await reader.readexactly(int(headers["content-length"]))
        else:
            body = b""
            while (size := int((await reader.readline()).strip(), 16)) > 0:
                body += await reader.readexactly(size)
                await reader.readline()
            await reader.readline()
    return status, headers, body


async def test_requests_in_a_tunnel_are_served_by_the_gate_each_audited(make_gate: GateFactory,
                                                                        upstream: Upstream) -> None:
    ca = StandInCA()
    async with gate_for(make_gate, upstream, ca) as gate:
        reader, writer = await tls_via(gate, upstream.target, ca.client_context())
        writer.write(get("/v1/models?limit=5", upstream.target))
        first = await response(reader)
        writer.write(messages_request({"model": "m"}, host=upstream.target, keep_alive=True))
        second = await response(reader)
        writer.close()
        await read_all(reader, 1)
        await eventually(lambda: any(r["method"] == "CONNECT" for r in gate.records()), what="the tunnel's line")
        records = gate.records()
    assert ca.hosts == [HOST], "the client (trusting only the run's CA) was answered with the gate's leaf"
    assert first[0] == 200 and b"stub-model" in first[2]
    assert second[0] == 200
    assert [(r.method, r.target) for r in upstream.stub.requests] == [("GET", "/v1/models?limit=5"),
                                                                      ("POST", "/v1/messages")]
    assert len({r.peer for r in upstream.stub.requests}) == 1, "one upstream connection, kept alive"
    assert upstream.stub.requests[0].header("host") == [upstream.target]
    inner = [r for r in records if r["method"] != "CONNECT"]
    assert [(r["method"], r["path"], r["decision"], r["status"]) for r in inner] == [
        ("GET", "/v1/models", "allow", 200), ("POST", "/v1/messages", "allow", 200)]
    assert all(r["target"] == upstream.target and r["reason"] for r in inner)
    (tunnel,) = [r for r in records if r["method"] == "CONNECT"]
    assert "TLS terminated" in tunnel["reason"] and tunnel["bytes_up"] > 0
    assert tunnel["decision"] == "allow", tunnel["reason"]


async def test_a_host_header_naming_another_site_is_refused_inside_the_tunnel(make_gate: GateFactory,
                                                                             upstream: Upstream) -> None:
    """Domain fronting: the TLS session is for the allowed host, the request asks the front for another."""
    ca = StandInCA()
    async with gate_for(make_gate, upstream, ca) as gate:
        reader, writer = await tls_via(gate, upstream.target, ca.client_context())
        writer.write(get("/v1/models", "forbidden.example.org"))
        status, headers, _ = await response(reader)
        writer.write(f"GET https://forbidden.example.org/ HTTP/1.1\r\nHost: {upstream.target}\r\n\r\n".encode())
        absolute = await response(reader)
        writer.close()
        records = gate.records()
    assert status == 421 and "does not match the tunnel's host" in headers["x-deny-reason"]
    assert absolute[0] == 421 and "origin-form" in absolute[1]["x-deny-reason"]
    assert upstream.stub.requests == []
    assert [r["decision"] for r in records if r["method"] == "GET"] == ["deny", "deny"]


async def test_sse_streams_through_a_terminated_tunnel_as_sent(make_gate: GateFactory, upstream: Upstream) -> None:
    events, interval = 4, 0.3
    payload = {"model": "m", "stream": True, "stub": {"events": events, "interval": interval}}
    ca = StandInCA()
    async with gate_for(make_gate, upstream, ca) as gate:
        reader, writer = await tls_via(gate, upstream.target, ca.client_context())
        writer.write(messages_request(payload, host=upstream.target))
        async with asyncio.timeout(10):
            await reader.readuntil(b"\r\n\r\n")
            delays: list[float] = []
            while len(delays) < events:
                line = await reader.readline()
                if line.startswith(b": sent_ns="):
                    delays.append((time.time_ns() - int(line.split(b"=")[1])) / 1e9)
        writer.close()
    assert max(delays) < interval / 2, f"events were held back: delays {delays}"


async def test_an_upstream_the_gate_cannot_verify_is_refused_before_the_tunnel_opens(
        make_gate: GateFactory, upstream: Upstream) -> None:
    ca = StandInCA()
    async with gate_for(make_gate, upstream, ca, trusted=False) as gate:
        status, headers, _reader, writer = await connect_via(gate.proxy, upstream.target)
        writer.close()
        record = gate.records()[-1]
    assert status == 502 and "TLS failure with upstream" in headers["x-deny-reason"]
    assert "--extra-ca" in record["reason"] and record["decision"] == "error"
    assert upstream.stub.requests == []


async def test_a_client_that_pins_the_real_certificate_fails_the_handshake_and_nothing_passes(
        make_gate: GateFactory, upstream: Upstream) -> None:
    """A terminated tunnel presents the gate's leaf: a client pinning the upstream's gets nothing through
    (hosts that need that are opted out of inspection)."""
    ca = StandInCA()
    pinning = ssl.create_default_context()
    upstream.ca.configure_trust(pinning)
    async with gate_for(make_gate, upstream, ca) as gate:
        with pytest.raises(ssl.SSLCertVerificationError):
            await tls_via(gate, upstream.target, pinning)
        await eventually(lambda: gate.records(), what="the tunnel's line")
        record = gate.records()[-1]
    assert "TLS handshake with the client failed" in record["reason"]
    assert upstream.stub.requests == []


async def test_without_a_ca_the_tunnel_stays_opaque(make_gate: GateFactory, upstream: Upstream) -> None:
    direct = ssl.create_default_context()
    upstream.ca.configure_trust(direct)
    async with gate_for(make_gate, upstream, None) as gate:
        reader, writer = await tls_via(gate, upstream.target, direct)
        writer.write(get("/v1/models", upstream.target, "Connection: close\r\n"))
        status, _, _ = await response(reader)
        writer.close()
    assert status == 200 and len(upstream.stub.requests) == 1


async def test_a_client_stalling_mid_upload_in_a_tunnel_gets_408(make_gate: GateFactory, upstream: Upstream) -> None:
    ca = StandInCA()
    async with gate_for(make_gate, upstream, ca, idle_timeout=0.5) as gate:
        reader, writer = await tls_via(gate, upstream.target, ca.client_context())
        writer.write(f"POST /v1/messages HTTP/1.1\r\nHost: {upstream.target}\r\nContent-Length: 50\r\n\r\n{{".encode())
        status, headers, _ = await response(reader)
        writer.close()
        post = [r for r in gate.records() if r["method"] == "POST"]
    assert status == 408 and "client idle" in headers["x-deny-reason"]
    assert post[0]["status"] == 408 and "upstream" not in post[0]["reason"]


def abort_as_python_3_11_2(self: asyncio.sslproto._SSLProtocolTransport) -> None:
    """``_SSLProtocolTransport.abort`` of the gate image's Python (Debian bookworm's 3.11.2): a transport
    closed twice has dropped its protocol, and aborting it then raises AttributeError (later versions check)."""
    self._closed = True
    self._ssl_protocol._abort()  # type: ignore[union-attr]


@pytest.mark.parametrize("leave", ["close", "reset"])
async def test_a_tunnel_the_client_ends_is_audited_as_allowed(make_gate: GateFactory, upstream: Upstream,
                                                              leave: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """However the client leaves after its last response (TLS close_notify then FIN, or a reset), the tunnel's
    line is the allowed tunnel's, not a gate error from aborting a TLS transport already closed."""
    monkeypatch.setattr(asyncio.sslproto._SSLProtocolTransport, "abort", abort_as_python_3_11_2)
    ca = StandInCA()
    async with gate_for(make_gate, upstream, ca) as gate:
        reader, writer = await tls_via(gate, upstream.target, ca.client_context())
        writer.write(get("/v1/models", upstream.target))
        assert (await response(reader))[0] == 200
        if leave == "close":
            writer.close()
        else:
            writer.transport.abort()
        await read_all(reader, 1)
        await eventually(lambda: any(r["method"] == "CONNECT" for r in gate.records()), what="the tunnel's line")
        (tunnel,) = [r for r in gate.records() if r["method"] == "CONNECT"]
    assert (tunnel["decision"], tunnel["status"]) == ("allow", 200), tunnel["reason"]
    assert "gate error" not in tunnel["reason"] and tunnel["bytes_down"] > 0, tunnel["reason"]
