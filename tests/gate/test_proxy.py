"""The proxy listener on loopback: allowlist, address guard, rebinding, the API host, forwarding, limits.

Targets live on 127.0.0.2 and up: the stub upstream holds 127.0.0.1, which the gate protects as its
credential route's host.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import socket

import pytest

from claude_bottle.gate.resolver import StaticResolver
from claude_bottle.stub import StubUpstream
from tests.conftest import GateFactory
from tests.helpers import EchoServer, connect_via, eventually, exchange, parse_head, read_all

pytestmark = pytest.mark.asyncio
LOOPBACK = ("127.0.0.0/8",)


def ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    return ipaddress.ip_address(text)


async def test_connect_to_an_allowlisted_host_tunnels_bytes_both_ways(make_gate: GateFactory) -> None:
    async with EchoServer() as echo, make_gate(allow_tcp=(f"127.0.0.2:{echo.port}",), allow_private=LOOPBACK) as gate:
        status, _, reader, writer = await connect_via(gate.proxy, f"127.0.0.2:{echo.port}")
        assert status == 200
        writer.write(b"ping through the tunnel")
        assert await reader.readexactly(23) == b"ping through the tunnel"
        writer.close()
        await eventually(gate.records, what="the audit record")
        (record,) = gate.records()
    assert record["decision"] == "allow" and record["bytes_up"] == 23 and record["bytes_down"] == 23
    assert "matches allow-tcp pattern" in record["reason"] and "raw TCP allowed" in record["reason"]


async def test_bytes_sent_with_the_connect_head_are_not_lost(make_gate: GateFactory) -> None:
    async with EchoServer() as echo, make_gate(allow_tcp=(f"127.0.0.2:{echo.port}",), allow_private=LOOPBACK) as gate:
        reader, writer = await asyncio.open_connection(gate.proxy.host, gate.proxy.port)
        target = f"127.0.0.2:{echo.port}"
        writer.write(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\nearly-bytes".encode())
        head = await reader.readuntil(b"\r\n\r\n")
        assert parse_head(head)[0] == 200
        assert await asyncio.wait_for(reader.readexactly(11), 3) == b"early-bytes"
        writer.close()


async def test_unlisted_host_refused_with_a_reason_and_never_dialled(make_gate: GateFactory) -> None:
    async with EchoServer() as echo, make_gate(allow=("example.com",), allow_private=LOOPBACK) as gate:
        status, headers, _, writer = await connect_via(gate.proxy, f"127.0.0.2:{echo.port}")
        writer.close()
        response = await exchange(gate.proxy, f"GET http://127.0.0.2:{echo.port}/ HTTP/1.1\r\n"
                                              f"Host: 127.0.0.2:{echo.port}\r\nConnection: close\r\n\r\n".encode(), 2)
    assert status == 403 and "not in the allowlist" in headers["x-deny-reason"]
    assert parse_head(response)[0] == 403
    assert echo.peers == []


@pytest.mark.parametrize("spelling", ["127.0.0.2", "0x7f000002", "2130706434", "0177.0.0.2", "127.2",
                                      "0x7f.0.0.2", "[::ffff:127.0.0.2]", "[::ffff:7f00:2]"])
async def test_loopback_in_every_spelling_refused_by_the_address_guard(make_gate: GateFactory, spelling: str) -> None:
    async with EchoServer() as echo:
        allow = (f"127.0.0.2:{echo.port}", f"[::ffff:7f00:2]:{echo.port}")  # listed, so the guard must stop it
        async with make_gate(allow=allow) as gate:
            status, headers, _, writer = await connect_via(gate.proxy, f"{spelling}:{echo.port}")
            writer.close()
    assert status == 403
    assert "loopback" in headers["x-deny-reason"] or "IPv4-mapped" in headers["x-deny-reason"]
    assert echo.peers == []


@pytest.mark.parametrize(("address", "words"), [
    ("127.0.0.2", "loopback"), ("10.1.2.3", "RFC 1918"), ("100.64.0.1", "CGNAT"),
    ("169.254.169.254", "metadata"), ("169.254.1.1", "link-local"), ("0.0.0.0", "unspecified"),
    ("::1", "loopback"), ("fd00::1", "unique local"), ("fe80::1", "link-local"), ("::ffff:10.0.0.1", "mapped"),
    ("64:ff9b::a00:1", "NAT64"), ("2002:a00:1::", "6to4"), ("2001:0:a00:1::1", "Teredo"),
])
async def test_allowlisted_name_resolving_to_a_private_address_is_refused(
    make_gate: GateFactory, address: str, words: str
) -> None:
    resolver = StaticResolver({"internal.example.com": [ip(address)]})
    async with make_gate(allow=("internal.example.com",), resolver=resolver) as gate:
        status, headers, _, writer = await connect_via(gate.proxy, "internal.example.com:443")
        writer.close()
        assert gate.records()[-1]["decision"] == "deny"
    assert status == 403 and words in headers["x-deny-reason"]


async def test_allow_private_opens_exactly_the_listed_network(make_gate: GateFactory) -> None:
    async with EchoServer() as echo:
        resolver = StaticResolver({"svc.internal.test": [ip("127.0.0.2")], "other.internal.test": [ip("127.0.0.3")]})
        allow = (f"svc.internal.test:{echo.port}", f"other.internal.test:{echo.port}")
        async with make_gate(allow=allow, allow_private=("127.0.0.2/32",), resolver=resolver) as gate:
            ok, _, _, w1 = await connect_via(gate.proxy, f"svc.internal.test:{echo.port}")
            refused, headers, _, w2 = await connect_via(gate.proxy, f"other.internal.test:{echo.port}")
            w1.close()
            w2.close()
    assert ok == 200
    assert refused == 403 and "loopback" in headers["x-deny-reason"]


async def test_an_unlisted_name_is_refused_without_being_looked_up(make_gate: GateFactory) -> None:
    """The lookup alone would carry the name to its domain's DNS server: a bottle that names
    ``<data>.attacker.example`` would exfiltrate through the refusal."""
    resolver = StaticResolver({"exfil-6a7b.example.net": [ip("127.0.0.2")]})
    async with make_gate(allow=("example.com",), allow_private=LOOPBACK, resolver=resolver) as gate:
        status, headers, _, writer = await connect_via(gate.proxy, "exfil-6a7b.example.net:443")
        writer.close()
        response = await exchange(gate.proxy, b"GET http://exfil-6a7b.example.net/ HTTP/1.1\r\n"
                                              b"Host: exfil-6a7b.example.net\r\nConnection: close\r\n\r\n", 2)
    assert status == 403 and "not in the allowlist" in headers["x-deny-reason"]
    assert parse_head(response)[0] == 403
    assert resolver.calls == []


async def test_gate_dials_the_address_it_vetted_and_resolves_once(make_gate: GateFactory) -> None:
    """A name with a refused and an allowed address: only the allowed one is ever connected to, and the
    name is not resolved again between the check and the dial (DNS rebinding)."""
    async with EchoServer("127.0.0.2") as vetted, EchoServer("127.0.0.3", vetted.port) as forbidden:
        resolver = StaticResolver({"rebind.example.com": [ip("127.0.0.3"), ip("127.0.0.2")]})
        async with make_gate(allow_tcp=(f"rebind.example.com:{vetted.port}",), allow_private=("127.0.0.2/32",),
                             resolver=resolver) as gate:
            status, _, reader, writer = await connect_via(gate.proxy, f"rebind.example.com:{vetted.port}")
            writer.write(b"x")
            assert await reader.readexactly(1) == b"x"
            writer.close()
    assert status == 200
    assert len(vetted.peers) == 1 and forbidden.peers == []
    assert resolver.calls.count("rebind.example.com") == 1


async def test_api_upstream_never_reachable_through_the_proxy(make_gate: GateFactory, stub: StubUpstream) -> None:
    """Even allowlisted, by name, by address, or by another name that resolves to it: an agent with its own
    key could otherwise talk to the API past the gate's credential route."""
    resolver = StaticResolver({"alias.example.com": [ip("127.0.0.1")]})
    allow = (f"127.0.0.1:{stub.port}", f"alias.example.com:{stub.port}", "localhost")
    async with make_gate(allow=allow, allow_private=LOOPBACK, resolver=resolver) as gate:
        by_name, h1, _, w1 = await connect_via(gate.proxy, f"127.0.0.1:{stub.port}")
        by_alias, h2, _, w2 = await connect_via(gate.proxy, f"alias.example.com:{stub.port}")
        forward = await exchange(gate.proxy, f"GET http://127.0.0.1:{stub.port}/v1/messages HTTP/1.1\r\n"
                                             f"Host: 127.0.0.1:{stub.port}\r\nx-api-key: sk-ant-api03-attackers-own\r\n\r\n".encode(), 1)
        w1.close()
        w2.close()
    assert by_name == 403 and "credential route" in h1["x-deny-reason"]
    assert by_alias == 403 and "credential upstream" in h2["x-deny-reason"]
    assert parse_head(forward)[0] == 403
    assert stub.requests == []


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.mark.parametrize("listener", ["api", "proxy"])
async def test_proxy_pointed_at_the_gate_itself_is_refused(make_gate: GateFactory, listener: str) -> None:
    api_port, proxy_port = free_port(), free_port()
    port = api_port if listener == "api" else proxy_port
    resolver = StaticResolver({"localhost": [ip("127.0.0.1")], "self.example.com": [ip("127.0.0.1")]})
    async with StubUpstream("localhost") as named_stub, make_gate(
        upstream=named_stub.url, allow=(f"self.example.com:{port}",), allow_private=LOOPBACK, resolver=resolver,
        api_port=api_port, proxy_port=proxy_port,
    ) as gate:
        status, headers, _, writer = await connect_via(gate.proxy, f"self.example.com:{port}")
        writer.close()
    assert status == 403 and "gate itself" in headers["x-deny-reason"]


async def test_plain_http_is_forwarded_without_any_gate_credential(make_gate: GateFactory) -> None:
    async with StubUpstream("127.0.0.2") as origin, make_gate(allow=(f"127.0.0.2:{origin.port}",),
                                                              allow_private=LOOPBACK) as gate:
        body = b'{"model": "m"}'
        response = await exchange(gate.proxy, (
            f"POST http://127.0.0.2:{origin.port}/v1/messages?x=1 HTTP/1.1\r\nHost: 127.0.0.2:{origin.port}\r\n"
            "Authorization: Bearer users-own-registry-token\r\nProxy-Authorization: Basic c2VjcmV0\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        ).encode() + body, 3)
        (seen,) = origin.requests
        record = gate.records()[-1]
    assert parse_head(response)[0] == 200 and b"Hello from the stub" in response
    assert seen.target == "/v1/messages?x=1"
    assert seen.header("host") == [f"127.0.0.2:{origin.port}"]
    assert seen.header("authorization") == ["Bearer users-own-registry-token"], "the client's own, untouched"
    assert seen.header("proxy-authorization") == []
    assert gate.token not in str(seen.headers) and gate.token.encode() not in seen.body
    assert record["bytes_up"] == len(body) and record["status"] == 200


async def test_no_credential_is_added_to_tunnelled_bytes(make_gate: GateFactory) -> None:
    async with EchoServer() as echo, make_gate(allow_tcp=(f"127.0.0.2:{echo.port}",), allow_private=LOOPBACK) as gate:
        status, _, reader, writer = await connect_via(gate.proxy, f"127.0.0.2:{echo.port}")
        request = b"GET / HTTP/1.1\r\nHost: 127.0.0.2\r\n\r\n"
        writer.write(request)
        echoed = await reader.readexactly(len(request))
        writer.write_eof()
        rest = await read_all(reader, 2)
        writer.close()
    assert status == 200 and echoed == request and rest == b""


@pytest.mark.parametrize(("request_line", "words"), [
    ("GET https://example.com/ HTTP/1.1", "use CONNECT"),
    ("GET /relative HTTP/1.1", "forward proxy"),
    ("CONNECT example.com HTTP/1.1", "needs a port"),
    ("GET http://user:pw@example.com/ HTTP/1.1", "credentials in the URL"),
    ("CONNECT [::1 HTTP/1.1", "bracket"),
])
async def test_malformed_proxy_requests_get_400(make_gate: GateFactory, request_line: str, words: str) -> None:
    async with make_gate(allow=("example.com",)) as gate:
        response = await exchange(gate.proxy, f"{request_line}\r\nHost: x\r\nConnection: close\r\n\r\n".encode(), 2)
    status, headers = parse_head(response)
    assert status == 400 and words in headers["x-deny-reason"]


async def test_dns_failure_gives_502(make_gate: GateFactory) -> None:
    async with make_gate(allow=("nowhere.example.com",), resolver=StaticResolver({})) as gate:
        status, headers, _, writer = await connect_via(gate.proxy, "nowhere.example.com:443")
        writer.close()
    assert status == 502 and "DNS" in headers["x-deny-reason"]


async def test_connection_refused_gives_502(make_gate: GateFactory) -> None:
    with socket.socket() as probe:  # a port with nothing behind it
        probe.bind(("127.0.0.2", 0))
        port = probe.getsockname()[1]
    async with make_gate(allow=(f"127.0.0.2:{port}",), allow_private=LOOPBACK) as gate:
        status, headers, _, writer = await connect_via(gate.proxy, f"127.0.0.2:{port}")
        writer.close()
    assert status == 502 and "connect" in headers["x-deny-reason"]


async def test_connect_timeout_gives_504(make_gate: GateFactory) -> None:
    """A listener whose accept queue is full drops new SYNs, so connecting to it hangs."""
    with socket.socket() as full:
        full.bind(("127.0.0.2", 0))
        full.listen(0)
        port = full.getsockname()[1]
        fillers = []
        for _ in range(4):
            s = socket.socket()
            s.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                s.connect(("127.0.0.2", port))
            fillers.append(s)
        try:
            async with make_gate(allow=(f"127.0.0.2:{port}",), allow_private=LOOPBACK, connect_timeout=0.5) as gate:
                status, headers, _, writer = await connect_via(gate.proxy, f"127.0.0.2:{port}")
                writer.close()
        finally:
            for s in fillers:
                s.close()
    assert status == 504 and "timed out" in headers["x-deny-reason"]


async def test_concurrent_tunnels_are_capped(make_gate: GateFactory) -> None:
    async with EchoServer() as echo, make_gate(allow=(f"127.0.0.2:{echo.port}",), allow_private=LOOPBACK,
                                               max_tunnels=2) as gate:
        open_tunnels = [await connect_via(gate.proxy, f"127.0.0.2:{echo.port}") for _ in range(2)]
        third, headers, _, writer = await connect_via(gate.proxy, f"127.0.0.2:{echo.port}")
        writer.close()
        assert [t[0] for t in open_tunnels] == [200, 200]
        assert third == 503 and "limit 2" in headers["x-deny-reason"]
        for *_, w in open_tunnels:
            w.close()
        await eventually(lambda: len(gate.records()) == 3, what="the two tunnels' lines: closed")
        again, _, _, writer = await connect_via(gate.proxy, f"127.0.0.2:{echo.port}")
        writer.close()
    assert again == 200


async def test_idle_tunnel_is_closed(make_gate: GateFactory) -> None:
    async with EchoServer() as echo, make_gate(allow_tcp=(f"127.0.0.2:{echo.port}",), allow_private=LOOPBACK,
                                               idle_timeout=0.3) as gate:
        status, _, reader, writer = await connect_via(gate.proxy, f"127.0.0.2:{echo.port}")
        assert status == 200
        assert await read_all(reader, 8) == b""  # closed by the gate well before 8 s
        writer.close()
        await eventually(gate.records, what="the audit record")
    assert "idle" in gate.records()[0]["reason"]


@pytest.mark.parametrize(("host", "forwarded"), [
    ("127.0.0.2:{port}", True),
    ("127.000.000.002:{port}", True),  # the same address, spelled otherwise
    ("other.example", False),
    ("other.example:{port}", False),
    ("127.0.0.2", False),  # port 80, not the URL's
    ("127.0.0.2:{port}\r\nHost: other.example", False),
])
async def test_plain_http_host_header_must_name_the_urls_host(make_gate: GateFactory, host: str,
                                                               forwarded: bool) -> None:
    async with StubUpstream("127.0.0.2") as origin, make_gate(allow=(f"127.0.0.2:{origin.port}",),
                                                              allow_private=LOOPBACK) as gate:
        response = await exchange(gate.proxy, (
            f"GET http://127.0.0.2:{origin.port}/v1/models HTTP/1.1\r\nHost: {host.format(port=origin.port)}\r\n"
            "Connection: close\r\n\r\n").encode(), 2)
        status, headers = parse_head(response)
    if forwarded:
        assert status == 200 and len(origin.requests) == 1
    else:
        assert status == 400 and origin.requests == []
        assert "Host" in headers["x-deny-reason"]


async def test_plain_http_host_header_compares_as_host_names_do(make_gate: GateFactory) -> None:
    resolver = StaticResolver({"svc.example.test": [ip("127.0.0.2")]})
    async with StubUpstream("127.0.0.2") as origin, make_gate(allow=(f"svc.example.test:{origin.port}",),
                                                              allow_private=LOOPBACK, resolver=resolver) as gate:
        response = await exchange(gate.proxy, (
            f"GET http://svc.example.test:{origin.port}/v1/models HTTP/1.1\r\nHost: SVC.Example.Test.:{origin.port}\r\n"
            "Connection: close\r\n\r\n").encode(), 2)
    assert parse_head(response)[0] == 200 and len(origin.requests) == 1


@pytest.mark.parametrize("request_line", [
    "GET http://[::1/ HTTP/1.1",
    "GET http://[::1]x/ HTTP/1.1",
    "GET http://[fe80::1%25eth0]/ HTTP/1.1",
    "GET http://example.com:99999/ HTTP/1.1",
    "GET http://example.com:0/ HTTP/1.1",
    "GET http://example.com:8o/ HTTP/1.1",
    "GET http://:80/ HTTP/1.1",
    "GET http:///path HTTP/1.1",
    "GET http://ex%61mple.com/ HTTP/1.1",
    "GET http://example.com/#fragment HTTP/1.1",
    "GET http://a..b/ HTTP/1.1",
    "GET http://-a.example/ HTTP/1.1",
    "GET http://xn--zz.example/ HTTP/1.1",
    "GET http://1.2.3.4.5/ HTTP/1.1",
    "GET http://" + "a" * 300 + ".example/ HTTP/1.1",
    "GET http://ex\xe4mple.com/ HTTP/1.1",
    "CONNECT :443 HTTP/1.1",
    "CONNECT example.com: HTTP/1.1",
    "CONNECT example.com:0 HTTP/1.1",
    "CONNECT example.com:443:1 HTTP/1.1",
    "CONNECT [::1]443 HTTP/1.1",
    "CONNECT http://example.com:443 HTTP/1.1",
    "CONNECT ex\xe4mple.com:443 HTTP/1.1",
])
async def test_every_unparsable_target_is_answered_400_and_audited(make_gate: GateFactory, request_line: str) -> None:
    resolver = StaticResolver({})
    async with make_gate(allow=("example.com",), resolver=resolver) as gate:
        response = await exchange(gate.proxy, request_line.encode("latin-1") + b"\r\nHost: example.com\r\n"
                                  b"Connection: close\r\n\r\n", 2)
        status, headers = parse_head(response)
        (record,) = gate.records()
    assert status == 400 and headers["x-deny-reason"]
    assert record["decision"] == "deny" and record["status"] == 400 and record["reason"]
    assert resolver.calls == [], "nothing unparsed goes further"


@pytest.mark.parametrize("framing", ["Content-Length: 5\r\n", "Transfer-Encoding: chunked\r\n"])
async def test_a_connect_declaring_a_body_is_answered_400_and_never_dialled(make_gate: GateFactory,
                                                                             framing: str) -> None:
    async with EchoServer() as echo, make_gate(allow_tcp=(f"127.0.0.2:{echo.port}",), allow_private=LOOPBACK) as gate:
        response = await exchange(gate.proxy, f"CONNECT 127.0.0.2:{echo.port} HTTP/1.1\r\nHost: x\r\n{framing}\r\n"
                                              "hello".encode(), 2)
        status, headers = parse_head(response)
    assert status == 400 and "declares a body" in headers["x-deny-reason"]
    assert echo.peers == []


async def test_a_connect_with_an_empty_content_length_is_a_tunnel(make_gate: GateFactory) -> None:
    async with EchoServer() as echo, make_gate(allow_tcp=(f"127.0.0.2:{echo.port}",), allow_private=LOOPBACK) as gate:
        reader, writer = await asyncio.open_connection(gate.proxy.host, gate.proxy.port)
        writer.write(f"CONNECT 127.0.0.2:{echo.port} HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\nping".encode())
        assert parse_head(await reader.readuntil(b"\r\n\r\n"))[0] == 200
        assert await asyncio.wait_for(reader.readexactly(4), 3) == b"ping"
        writer.close()
