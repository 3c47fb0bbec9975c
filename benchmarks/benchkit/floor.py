"""The least an API-route proxy written in Python costs: a floor for the gate's API latency, measured in the
same run. Not a proxy to deploy: one client at a time, whole messages only (no streaming), no errors handled.

It is built the cheapest way Python allows: uvloop and llhttp (httptools) protocol callbacks, the request
forwarded from the parser's last callback, one kept-alive upstream connection, the credential injected.
With ``--checks`` it also runs the gate's own checks, called directly: the Messages policy on the body, DLP
over the target, headers and body, and on the way back the encoding check and the reflection scan. The gate
runs the same checks inside its forward path (coroutines, per-route filters, pooled upstreams, streaming,
timeouts, the audit record), so floor -> checks is what the checks cost, checks -> gate what the structure costs.

    python benchkit/floor.py HOST UPSTREAM_PORT TOKEN_FILE [--checks]      (prints "floor on PORT")

It runs as a script, on this package and the gate's own dependencies only: so in the gate image too.
"""

from __future__ import annotations

import asyncio
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import httptools
import uvloop

from claude_bottle.gate.decode import reflected_forms
from claude_bottle.gate.dlp import DlpPolicy
from claude_bottle.gate.routes import CLIENT_CREDENTIAL_SPELLINGS
from claude_bottle.gate.scan import SecretForms
from claude_bottle.policy.messages import MessagesPolicy

if TYPE_CHECKING:
    from .core import Child, Children

# Dropped from the client's request (then set by the proxy) or from the upstream's response (then framed anew).
DROPPED = CLIENT_CREDENTIAL_SPELLINGS | {b"host", b"accept-encoding", b"content-length", b"connection",
                                        b"transfer-encoding", b"keep-alive"}


class Upstream(asyncio.Protocol):
    """The one upstream connection; the response goes to the client that sent the request."""

    def __init__(self, proxy: Proxy) -> None:
        self.proxy = proxy

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport: asyncio.Transport = transport  # type: ignore[assignment]

    def expect(self, client: Client) -> None:
        self.client, self.headers, self.body = client, list[tuple[bytes, bytes]](), list[bytes]()
        self.parser = httptools.HttpResponseParser(self)

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.lower(), value))

    def on_body(self, chunk: bytes) -> None:
        self.body.append(chunk)

    def on_message_complete(self) -> None:
        body = b"".join(self.body)
        if self.proxy.checks:
            if any(n == b"content-encoding" and v != b"identity" for n, v in self.headers):
                raise ValueError("an encoded response")
            if self.proxy.reflected.in_message(self.headers, body):
                raise ValueError("the response carries the credential")
        head = [b"HTTP/1.1 %d OK\r\n" % self.parser.get_status_code()]
        head += [n + b": " + v + b"\r\n" for n, v in self.headers if n not in DROPPED]
        head.append(b"content-length: %d\r\n\r\n" % len(body))
        self.client.transport.write(b"".join(head) + body)


class Client(asyncio.Protocol):
    def __init__(self, proxy: Proxy) -> None:
        self.proxy, self.parser = proxy, httptools.HttpRequestParser(self)
        self.url, self.headers, self.body = b"", list[tuple[bytes, bytes]](), list[bytes]()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport: asyncio.Transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.lower(), value))

    def on_body(self, chunk: bytes) -> None:
        self.body.append(chunk)

    def on_message_complete(self) -> None:
        proxy, url, body = self.proxy, self.url, b"".join(self.body)
        headers = [(n, v) for n, v in self.headers if n not in DROPPED]
        self.url, self.headers, self.body = b"", [], []
        if proxy.checks:
            verdict = proxy.policy.decide(body)
            if not verdict.allow:
                raise ValueError(verdict.reason)
            scanner = proxy.matcher.scanner()
            scanner.check_head(url, headers)
            scanner.finish(body)
        head = [self.parser.get_method() + b" " + url + b" HTTP/1.1\r\n", proxy.set_headers]
        head += [n + b": " + v + b"\r\n" for n, v in headers]
        head.append(b"content-length: %d\r\n\r\n" % len(body))
        proxy.upstream.expect(self)
        proxy.upstream.transport.write(b"".join(head) + body)


class Proxy:
    def __init__(self, host: str, upstream_port: int, token: bytes, checks: bool) -> None:
        self.host, self.upstream_port, self.checks = host, upstream_port, checks
        self.policy, self.matcher = MessagesPolicy(), DlpPolicy().matcher([token])
        self.reflected = SecretForms(reflected_forms(token))  # every form a server may send the token back in
        self.set_headers = (b"host: %s:%d\r\nauthorization: Bearer %s\r\naccept-encoding: identity\r\n"
                            % (host.encode(), upstream_port, token))

    async def serve(self) -> None:
        loop = asyncio.get_running_loop()
        _, self.upstream = await loop.create_connection(lambda: Upstream(self), self.host, self.upstream_port)
        server = await loop.create_server(lambda: Client(self), self.host, 0)
        print(f"floor on {server.sockets[0].getsockname()[1]}", flush=True)
        await server.serve_forever()


def start(children: Children, name: str, upstream_port: int, token_file: Path, checks: bool,
          image: str | None = None) -> tuple[Child, tuple[str, int]]:
    """The floor as a child, on this Python or with ``image`` in the gate image (``Children.start_in_image``)."""
    from .core import HERE, LOOPBACK

    args = [str(Path(__file__).resolve()), LOOPBACK, str(upstream_port), str(token_file), *(["--checks"] * checks)]
    child = (children.start(name, [sys.executable, *args], cwd=HERE) if image is None
             else children.start_in_image(name, image, args, mounts=(Path(__file__).resolve().parent, token_file)))
    return child, (LOOPBACK, int(child.wait_for_line(re.compile(r"floor on (\d+)"), 20)[1]))


if __name__ == "__main__":
    token = Path(sys.argv[3]).read_text().strip().encode()
    uvloop.run(Proxy(sys.argv[1], int(sys.argv[2]), token, "--checks" in sys.argv[4:]).serve())
