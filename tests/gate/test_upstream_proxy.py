"""The gate's own connections through an upstream HTTP proxy, on loopback: the API route, tunnels and plain HTTP go
through it with its Basic credentials; refused destinations never reach it; its failures name it.

``FakeProxy`` stands in for a corporate proxy (squid in the bottle tests): it requires credentials, resolves
names by its own table and logs every request line, as squid's access log does.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import gzip
import re
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from ipaddress import ip_address
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import trustme

from claude_bottle.errors import GateError
from claude_bottle.gate.resolver import StaticResolver
from claude_bottle.gate.upstream_proxy import UpstreamProxy
from claude_bottle.policy.addresses import parse_ip_literal
from claude_bottle.stub import StubUpstream
from tests.conftest import GateFactory
from tests.gate.test_inspection import HOST, StandInCA, response, tls_via
from tests.helpers import EchoServer, connect_via, eventually, exchange, messages_request, parse_head

pytestmark = pytest.mark.asyncio
LOOPBACK = ("127.0.0.0/8",)
USER, PASSWORD = "jdoe-corp", "s3cret-proxy-password"


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError):
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()


@dataclass
class FakeProxy:
    """An HTTP proxy on 127.0.0.3 requiring ``USER``:``PASSWORD``; ``log`` holds each request line received."""

    names: dict[str, str] = field(default_factory=dict)  # the proxy's own DNS
    refuse: set[str] = field(default_factory=set)  # hosts its policy refuses
    password: str | None = PASSWORD  # the one it accepts; None: it asks for no credentials
    log: list[str] = field(default_factory=list)
    authorizations: list[str] = field(default_factory=list)
    heads: list[dict[str, str]] = field(default_factory=list)  # each request's headers, names in lower case
    # Plain HTTP answered by the proxy itself with the request it received, as a TRACE's answer or a debugging
    # error page would: "received" as is, "gzip" the same compressed, "decoded" with the Basic pair decoded,
    # "decoded only" the pair decoded in place of the header's value.
    echo: str = ""
    port: int = 0
    _server: asyncio.Server | None = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
            line, *rest = head.split("\r\n")
            self.log.append(line)
            headers = dict(h.split(": ", 1) for h in rest if h)
            self.heads.append({k.lower(): v for k, v in headers.items()})
            given = self.heads[-1].get("proxy-authorization", "")
            self.authorizations.append(given)
            if self.password is not None and \
                    given != "Basic " + base64.b64encode(f"{USER}:{self.password}".encode()).decode():
                writer.write(b"HTTP/1.1 407 Proxy Authentication Required\r\nProxy-Authenticate: Basic realm=x\r\n"
                             b"Content-Length: 0\r\nConnection: close\r\n\r\n")
                return
            method, target, _ = line.split(" ")
            if method == "CONNECT" and target.rsplit(":", 1)[0] in self.refuse:
                writer.write(b"HTTP/1.1 403 Forbidden by policy\r\nContent-Length: 0\r\n\r\n")
                return
            if method != "CONNECT" and self.echo:
                writer.write(_echoed(head, self.echo))
                return
            if method == "CONNECT":
                host, port = target.rsplit(":", 1)
                up_reader, up_writer = await asyncio.open_connection(self.names.get(host, host), int(port))
                writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            else:
                url = urlsplit(target)
                up_reader, up_writer = await asyncio.open_connection(self.names.get(url.hostname or "", ""),
                                                                     url.port or 80)
                kept = "".join(f"{k}: {v}\r\n" for k, v in headers.items() if k.lower() != "proxy-authorization")
                up_writer.write(f"{method} {url.path or '/'} HTTP/1.1\r\n{kept}\r\n".encode())
            async with asyncio.TaskGroup() as tasks:
                tasks.create_task(_pump(reader, up_writer))
                tasks.create_task(_pump(up_reader, writer))
            up_writer.close()
        finally:
            writer.close()

    async def __aenter__(self) -> FakeProxy:
        self._server = await asyncio.start_server(self._serve, "127.0.0.3", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()

    def setting(self, password: str = PASSWORD, no_proxy: str = "") -> UpstreamProxy:
        return UpstreamProxy.parse(f"http://{USER}:{password}@127.0.0.3:{self.port}", "test", no_proxy)


def _echoed(head: str, how: str) -> bytes:
    """A proxy's own answer holding the request head it received (see ``FakeProxy.echo``)."""
    if how in ("decoded", "decoded only"):
        encoded = re.search(r"(?i)\r\nproxy-authorization: basic ([^\r]+)", head)[1]  # type: ignore[index]
        if how == "decoded only":
            head = head.replace(encoded, "(hidden)")
        head += f"(as user:password: {base64.b64decode(encoded).decode()})"
    body, coding = head.encode(), ""
    if how == "gzip":
        body, coding = gzip.compress(body), "Content-Encoding: gzip\r\n"
    return (f"HTTP/1.1 200 OK\r\nContent-Type: message/http\r\n{coding}Content-Length: {len(body)}\r\n"
            f"Connection: close\r\n\r\n").encode() + body


def asked(proxy: FakeProxy) -> list[str]:
    """What the proxy was asked after the gate's check at start (a tunnel to the API upstream)."""
    assert proxy.log[0].startswith("CONNECT 127.0.0.1:"), proxy.log
    return proxy.log[1:]


def resolver() -> StaticResolver:
    return StaticResolver({"allowed.test": [parse_ip_literal("127.0.0.2")],  # type: ignore[list-item]
                           "private.test": [parse_ip_literal("10.1.2.3")]})  # type: ignore[list-item]


@pytest.fixture
async def proxy() -> AsyncIterator[FakeProxy]:
    async with FakeProxy({"allowed.test": "127.0.0.2"}) as server:
        yield server


async def test_the_api_route_reaches_the_upstream_through_a_connect_tunnel(
        make_gate: GateFactory, stub: StubUpstream, proxy: FakeProxy) -> None:
    async with make_gate(upstream_proxy=proxy.setting()) as gate:
        response = await exchange(gate.api, messages_request({"model": "m"}), timeout=3)
    assert parse_head(response)[0] == 200
    assert proxy.log == [f"CONNECT 127.0.0.1:{stub.port} HTTP/1.1"] * 2  # the check at start, then the request
    (seen,) = stub.requests
    assert seen.header("authorization") == [f"Bearer {gate.token}"]
    assert seen.header("proxy-authorization") == []  # the proxy's credentials stay with the proxy


async def test_a_tunnel_to_an_allowed_host_goes_through_the_proxy_by_name(
        make_gate: GateFactory, proxy: FakeProxy) -> None:
    async with EchoServer() as echo, make_gate(allow_tcp=(f"allowed.test:{echo.port}",), allow_private=LOOPBACK,
                                               resolver=resolver(), upstream_proxy=proxy.setting()) as gate:
        status, _, reader, writer = await connect_via(gate.proxy, f"allowed.test:{echo.port}")
        assert status == 200
        writer.write(b"through two proxies")
        assert await asyncio.wait_for(reader.readexactly(19), 3) == b"through two proxies"
        writer.close()
        await eventually(gate.records, what="the audit record")
    assert asked(proxy) == [f"CONNECT allowed.test:{echo.port} HTTP/1.1"]
    assert PASSWORD not in "".join(str(r) for r in gate.records())


async def test_plain_http_goes_to_the_proxy_in_absolute_form(make_gate: GateFactory, proxy: FakeProxy) -> None:
    async def origin(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(origin, "127.0.0.2", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        async with make_gate(allow=(f"allowed.test:{port}",), allow_private=LOOPBACK, resolver=resolver(),
                             upstream_proxy=proxy.setting()) as gate:
            response = await exchange(gate.proxy, f"GET http://allowed.test:{port}/page HTTP/1.1\r\n"
                                                  f"Host: allowed.test:{port}\r\n\r\n".encode(), 3)
    finally:
        server.close()
    assert parse_head(response)[0] == 200 and response.endswith(b"hello")
    assert asked(proxy) == [f"GET http://allowed.test:{port}/page HTTP/1.1"]


@pytest.mark.parametrize(("echo", "password"), [("received", PASSWORD), ("gzip", PASSWORD), ("decoded", PASSWORD),
                                                ("decoded only", "Winter2026!")])
async def test_a_proxy_echoing_its_credentials_never_hands_them_to_the_client(
        make_gate: GateFactory, proxy: FakeProxy, echo: str, password: str) -> None:
    """The proxy answers a plain-HTTP request with the request it received, its Proxy-Authorization included:
    the answer is refused, whether the credentials come as sent, compressed, or decoded (a password too short
    to be searched for alone is found with its user name)."""
    proxy.echo, proxy.password = echo, password
    pair = base64.b64encode(f"{USER}:{password}".encode())
    async with make_gate(allow=("allowed.test:8080",), allow_private=LOOPBACK, resolver=resolver(),
                         upstream_proxy=proxy.setting(password)) as gate:
        response = await exchange(gate.proxy, b"GET http://allowed.test:8080/ HTTP/1.1\r\nHost: allowed.test:8080\r\n"
                                              b"Accept-Encoding: gzip, br\r\n\r\n", 3)
        await eventually(gate.records, what="the audit record")
    assert asked(proxy) == ["GET http://allowed.test:8080/ HTTP/1.1"]
    assert pair not in response and password.encode() not in response and b"Basic" not in response, response
    assert parse_head(response)[0] == 502, response
    assert proxy.heads[-1]["accept-encoding"] == "identity", "the client's codings were passed on"
    (record,) = gate.records()
    assert record["side"] == "upstream" and password not in str(record), record
    refusal = "an encoded body" if echo == "gzip" else "response carried a credential the gate injects"
    assert refusal in record["reason"], record  # refused for what it carried, not a proxy that failed


async def test_a_trace_never_carries_the_proxys_credentials(make_gate: GateFactory, proxy: FakeProxy) -> None:
    """A TRACE's answer is the request as received (RFC 9110 9.3.8): with the proxy's credentials added, the
    gate sends none; without credentials to add, it goes as any request does."""
    request = b"TRACE http://allowed.test:8080/ HTTP/1.1\r\nHost: allowed.test:8080\r\nMax-Forwards: 0\r\n\r\n"
    proxy.echo = "received"
    async with make_gate(allow=("allowed.test:8080",), allow_private=LOOPBACK, resolver=resolver(),
                         upstream_proxy=proxy.setting()) as gate:
        refused = await exchange(gate.proxy, request, 3)
    assert parse_head(refused)[0] == 405 and b"RFC 9110" in refused
    assert asked(proxy) == []
    async with FakeProxy(password=None, echo="received") as open_proxy, make_gate(
            allow=("allowed.test:8080",), allow_private=LOOPBACK, resolver=resolver(),
            upstream_proxy=UpstreamProxy.parse(f"http://127.0.0.3:{open_proxy.port}", "test")) as gate:
        passed = await exchange(gate.proxy, request, 3)
    assert parse_head(passed)[0] == 200 and b"TRACE http://allowed.test:8080/ HTTP/1.1" in passed


@pytest.mark.parametrize("target", ["unlisted.test:443", "private.test:443"])
async def test_a_refused_destination_is_never_requested_from_the_proxy(
        make_gate: GateFactory, proxy: FakeProxy, target: str) -> None:
    async with make_gate(allow=("private.test",), resolver=resolver(), upstream_proxy=proxy.setting()) as gate:
        status, _, _, writer = await connect_via(gate.proxy, target)
        writer.close()
    assert status == 403
    assert asked(proxy) == []


async def test_no_proxy_hosts_are_dialled_directly(make_gate: GateFactory, proxy: FakeProxy) -> None:
    async with EchoServer() as echo, make_gate(allow_tcp=(f"allowed.test:{echo.port}",), allow_private=LOOPBACK,
                                               resolver=resolver(),
                                               upstream_proxy=proxy.setting(no_proxy="localhost,.test")) as gate:
        status, _, reader, writer = await connect_via(gate.proxy, f"allowed.test:{echo.port}")
        writer.write(b"direct")
        assert status == 200 and await asyncio.wait_for(reader.readexactly(6), 3) == b"direct"
        writer.close()
    assert asked(proxy) == [] and echo.peers


async def test_a_wrong_password_stops_the_gate_at_start_naming_the_proxy(
        make_gate: GateFactory, proxy: FakeProxy, stub: StubUpstream) -> None:
    with pytest.raises(GateError) as caught:
        async with make_gate(upstream_proxy=proxy.setting(password="wrong")):
            pass
    assert f"cannot reach the API upstream 127.0.0.1:{stub.port}" in str(caught.value)
    assert f"upstream proxy http://127.0.0.3:{proxy.port} refused the credentials (407" in str(caught.value)
    assert "wrong" not in str(caught.value).replace("refused", "")


async def test_an_unreachable_proxy_stops_the_gate_at_start(make_gate: GateFactory) -> None:
    async with FakeProxy() as gone:
        setting = gone.setting()
    with pytest.raises(GateError, match=f"cannot reach the upstream proxy http://127.0.0.3:{setting.port}"):
        async with make_gate(upstream_proxy=setting):
            pass


async def test_a_wrong_password_later_is_an_upstream_failure_naming_the_proxy(
        make_gate: GateFactory, proxy: FakeProxy) -> None:
    async with make_gate(upstream_proxy=proxy.setting()) as gate:
        proxy.password = "changed"
        response = await exchange(gate.api, messages_request({"model": "m"}), timeout=3)
        await eventually(gate.records, what="the audit record")
    status, _ = parse_head(response)
    (record,) = gate.records()
    assert status == 502 and record["side"] == "upstream"
    assert f"upstream proxy http://127.0.0.3:{proxy.port}" in record["reason"] and "407" in record["reason"]
    assert PASSWORD not in str(record) and PASSWORD.encode() not in response
    assert USER.encode() not in response  # half of the credentials, and a person's login


async def test_plain_http_with_a_wrong_password_is_a_failure_not_the_proxys_407(
        make_gate: GateFactory, proxy: FakeProxy) -> None:
    async with make_gate(allow=("allowed.test:8080",), allow_private=LOOPBACK, resolver=resolver(),
                         upstream_proxy=proxy.setting()) as gate:
        proxy.password = "changed"
        response = await exchange(gate.proxy, b"GET http://allowed.test:8080/ HTTP/1.1\r\n"
                                              b"Host: allowed.test:8080\r\n\r\n", 3)
    assert parse_head(response)[0] == 502 and b"407" in response and USER.encode() not in response


async def test_a_proxy_gone_later_is_named(make_gate: GateFactory) -> None:
    async with contextlib.AsyncExitStack() as stack:
        proxy = await stack.enter_async_context(FakeProxy())
        gate = await stack.enter_async_context(make_gate(upstream_proxy=proxy.setting()))
        await proxy.__aexit__()
        response = await exchange(gate.api, messages_request({"model": "m"}), timeout=3)
        await eventually(gate.records, what="the audit record")
        (record,) = gate.records()
    assert parse_head(response)[0] == 502 and record["side"] == "upstream"
    assert f"cannot reach the upstream proxy http://127.0.0.3:{proxy.port}" in record["reason"]


async def test_a_connect_the_proxy_refuses_is_named_with_its_status(make_gate: GateFactory, proxy: FakeProxy) -> None:
    proxy.refuse.add("allowed.test")
    async with make_gate(allow_tcp=("allowed.test:22",), allow_private=LOOPBACK, resolver=resolver(),
                         upstream_proxy=proxy.setting()) as gate:
        status, _, _, writer = await connect_via(gate.proxy, "allowed.test:22")
        writer.close()
        await eventually(gate.records, what="the audit record")
    (record,) = gate.records()
    assert status == 502 and record["side"] == "upstream"
    assert "refused CONNECT allowed.test:22: 403 Forbidden by policy" in record["reason"]


async def test_a_terminated_tunnel_reaches_its_host_through_the_proxy_with_tls_and_the_name_check(
        make_gate: GateFactory, tmp_path: Path) -> None:
    upstream_ca = trustme.CA()
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    upstream_ca.issue_cert(HOST).configure_cert(server_tls)
    ca_file = tmp_path / "upstream-ca.pem"
    upstream_ca.cert_pem.write_to_path(str(ca_file))
    ca = StandInCA()
    async with StubUpstream("127.0.0.2", tls=server_tls) as origin, FakeProxy({HOST: "127.0.0.2"}) as proxy:
        target = f"{HOST}:{origin.port}"
        async with make_gate(allow=(target,), allow_private=LOOPBACK, ca=ca, extra_ca=(str(ca_file),),
                             resolver=StaticResolver({HOST: [ip_address("127.0.0.2")]}),
                             upstream_proxy=proxy.setting()) as gate:
            reader, writer = await tls_via(gate, target, ca.client_context())
            writer.write(f"GET /v1/models HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
            status, _, body = await response(reader)
            writer.close()
    assert status == 200 and b"stub-model" in body
    assert asked(proxy) == [f"CONNECT {target} HTTP/1.1"]
    assert [(r.method, r.target) for r in origin.requests] == [("GET", "/v1/models")]
