"""The HTTP proxy the gate's own connections go through when the host must use one (a corporate proxy).

``UpstreamProxy`` is the parsed setting: where the proxy listens, its Basic credentials (held by the gate
alone: they reach it on standard input, never in its arguments) and the ``NO_PROXY`` entries dialled directly.
``open_tunnel`` opens a socket to a destination through the proxy with CONNECT, ready for TLS or for bytes;
``gate/upstream.py`` is the one caller. Plain-HTTP requests go to the proxy in absolute form instead
(``gate/proxy.py``), carrying ``authorization``.

The address guard through a proxy: the gate decides every destination exactly as without one (allowlist,
rules, then it resolves the name itself and vets every address) before any byte goes to the proxy, and then
asks the proxy for the NAME, not the vetted address: corporate proxies filter and inspect by name, and many
refuse CONNECT to a bare address. The residual risk is the proxy's own resolution: a name that resolves to
public addresses for the gate but to an internal one for the proxy (split-horizon DNS, a rebinding answer)
reaches what the proxy's policy lets it reach, as any other client of that proxy could.
"""

from __future__ import annotations

import asyncio
import base64
import ipaddress
import socket
from dataclasses import dataclass, field
from urllib.parse import SplitResult, quote, unquote, urlsplit

from claude_bottle.errors import ConfigError
from claude_bottle.gate.dlp_rules import MIN_SECRET_BYTES
from claude_bottle.gate.failures import UpstreamSide

MAX_ANSWER_BYTES = 16 * 1024  # a CONNECT answer's head; a proxy sending more is broken
NONE = "none"  # the setting that ignores the environment's proxy variables


@dataclass(frozen=True)
class UpstreamProxy:
    """An HTTP proxy at ``host``:``port``. ``username`` empty: no credentials. ``no_proxy``: the entries of
    ``NO_PROXY`` (``*``, a domain and its subdomains, an address, a CIDR), whose hosts are dialled directly."""

    host: str
    port: int
    username: str = ""
    password: str = field(default="", repr=False)
    no_proxy: tuple[str, ...] = ()

    @classmethod
    def parse(cls, url: str, what: str, no_proxy: str = "") -> UpstreamProxy:
        """``http://[USER[:PASSWORD]@]HOST[:PORT]`` (the port defaults to 80; user and password
        percent-encoded). A ConfigError names ``what`` (the flag, key or variable) and never the password."""
        try:
            parts = urlsplit(url.strip())
        except ValueError:
            raise ConfigError(f"{what}: not a URL") from None
        shown = _without_password(parts)
        if parts.scheme.lower() != "http":
            raise ConfigError(f"{what}: {shown!r} is not an http:// proxy URL (only HTTP proxies are supported)")
        try:
            port = parts.port or 80
        except ValueError:
            raise ConfigError(f"{what}: {shown!r} has an invalid port") from None
        if not parts.hostname or (parts.path not in ("", "/")) or parts.query or parts.fragment:
            raise ConfigError(f"{what}: {shown!r} must be http://[USER[:PASSWORD]@]HOST[:PORT] and nothing more")
        entries = tuple(e.strip().lower() for e in no_proxy.split(",") if e.strip())
        return cls(parts.hostname.lower(), port, unquote(parts.username or ""), unquote(parts.password or ""),
                   entries)

    @property
    def url(self) -> str:
        """The proxy's URL without its password: the gate's argument, and what the host shows."""
        user = f"{quote(self.username, safe='')}@" if self.username else ""
        return f"http://{user}{_bracketed(self.host)}:{self.port}"

    @property
    def address(self) -> str:
        """The proxy's URL without its credentials: what failures name, for they reach the bottle too (the user
        name is half of the credentials, and often a person's login)."""
        return f"http://{_bracketed(self.host)}:{self.port}"

    def environment(self) -> dict[str, str]:
        """The proxy variables (both spellings) that curl, apt, npm and pip read, WITH the password: only for
        the image builds' RUN steps (runtime/images.py keeps them out of the images), never for a container."""
        user = ""
        if self.username:
            user = quote(self.username, safe="") + (f":{quote(self.password, safe='')}" if self.password else "") + "@"
        url = f"http://{user}{_bracketed(self.host)}:{self.port}"
        variables = {"http_proxy": url, "https_proxy": url}
        if self.no_proxy:
            variables["no_proxy"] = ",".join(self.no_proxy)
        return {**variables, **{name.upper(): value for name, value in variables.items()}}

    def args(self) -> list[str]:
        """The gate command's flags for this proxy; never the password (it goes on standard input)."""
        bypass = (arg for entry in self.no_proxy for arg in ("--upstream-no-proxy", entry))
        return ["--upstream-proxy", self.url, *bypass]

    @property
    def authorization(self) -> bytes | None:
        """The ``Proxy-Authorization`` value (Basic), or None without credentials."""
        if not self.username:
            return None
        return b"Basic " + base64.b64encode(f"{self.username}:{self.password}".encode())

    def sent(self) -> tuple[str, ...]:
        """What of the credentials a proxy or server echoing a plain-HTTP request's headers would hand back: the
        encoded pair as sent, the pair decoded (a page that shows what it was sent decodes it), and the password.
        Only values of at least ``MIN_SECRET_BYTES``: the answers are searched for them, and a shorter one would
        be found in ordinary answers by chance."""
        if self.authorization is None:
            return ()
        pair = f"{self.username}:{self.password}" if self.password else ""
        values = (self.authorization.decode().split(" ", 1)[1], pair, self.password)
        return tuple(value for value in values if len(value.encode()) >= MIN_SECRET_BYTES)

    def bypasses(self, host: str) -> bool:
        """Whether ``host`` (a normalized name or address literal) is dialled directly, per ``NO_PROXY``."""
        address = _address(host)
        for entry in self.no_proxy:
            if entry == "*":
                return True
            if address is not None and "/" in entry:
                try:
                    if address in ipaddress.ip_network(entry, strict=False):
                        return True
                except ValueError:
                    continue
            domain = entry.removeprefix("*").removeprefix(".").strip("[]")
            if host == domain or (address is None and host.endswith("." + domain)):
                return True
        return False


async def open_tunnel(proxy: UpstreamProxy, host: str, port: int) -> socket.socket:
    """A connected socket to ``host``:``port`` through ``proxy`` (CONNECT), nothing read past the proxy's
    answer: the destination's first bytes are still in the socket. Raises UpstreamSide naming the proxy: it
    cannot be reached, wants (other) credentials (407), or refuses the CONNECT by its own policy."""
    try:
        sock = await _connect(proxy.host, proxy.port)
    except OSError as exc:
        raise unreachable(proxy, exc) from None
    try:
        authority = f"{_bracketed(host)}:{port}"
        head = f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n".encode()
        if proxy.authorization is not None:
            head += b"Proxy-Authorization: " + proxy.authorization + b"\r\n"
        loop = asyncio.get_running_loop()
        await loop.sock_sendall(sock, head + b"\r\n")
        status, reason = _status(await _answer(loop, sock, proxy), proxy)
        if not 200 <= status < 300:
            raise refusal(proxy, status, reason, f"CONNECT {authority}")
        return sock
    except OSError as exc:
        sock.close()
        raise UpstreamSide(502, f"the upstream proxy {proxy.address} dropped the connection: {exc.strerror or exc}"
                           ) from None
    except BaseException:
        sock.close()
        raise


def unreachable(proxy: UpstreamProxy, exc: OSError) -> UpstreamSide:
    """No connection to the proxy itself."""
    address = _address(proxy.host)
    hint = ("; a proxy on the host's loopback is not reachable from the gate's container: give an address the "
            "containers reach, or --upstream-proxy none") if proxy.host == "localhost" or (
                address is not None and address.is_loopback) else ""
    return UpstreamSide(502, f"cannot reach the upstream proxy {proxy.address}: {exc.strerror or exc}{hint}")


def refusal(proxy: UpstreamProxy, status: int, reason: str, request: str) -> UpstreamSide:
    """The proxy answered ``request`` with a non-success ``status``: what the user must know."""
    if status == 407:
        given = "refused the credentials" if proxy.username else "requires credentials and none were given"
        return UpstreamSide(502, f"the upstream proxy {proxy.address} {given} (407 Proxy Authentication Required): "
                                 "set USER:PASSWORD in its URL, or USER in it and the password with "
                                 "`claude-bottle login proxy`")
    return UpstreamSide(502, f"the upstream proxy {proxy.address} refused {request}: {status} {reason}".rstrip())


async def _connect(host: str, port: int) -> socket.socket:
    """A non-blocking socket connected to the first address of ``host`` that answers."""
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
    last: OSError = OSError(f"{host} has no addresses")
    for family, kind, proto, _, address in infos:
        sock = socket.socket(family, kind, proto)
        sock.setblocking(False)
        try:
            await loop.sock_connect(sock, address)
            return sock
        except OSError as exc:
            sock.close()
            last = exc
        except BaseException:
            sock.close()
            raise
    raise last


async def _answer(loop: asyncio.AbstractEventLoop, sock: socket.socket, proxy: UpstreamProxy) -> bytes:
    # One byte at a time: what follows the head is the destination's (a server that speaks first) and must
    # stay in the socket for the stream or TLS layered on it. A head is ~100 bytes, once per connection.
    head = bytearray()
    while not head.endswith(b"\r\n\r\n"):
        if len(head) >= MAX_ANSWER_BYTES:
            raise UpstreamSide(502, f"the upstream proxy {proxy.address} sent an overlong answer to CONNECT")
        byte = await loop.sock_recv(sock, 1)
        if not byte:
            raise UpstreamSide(502, f"the upstream proxy {proxy.address} closed the connection before answering "
                                    "CONNECT")
        head += byte
    return bytes(head)


def _status(head: bytes, proxy: UpstreamProxy) -> tuple[int, str]:
    line = head.split(b"\r\n", 1)[0].decode("latin-1")
    version, _, rest = line.partition(" ")
    code, _, reason = rest.partition(" ")
    if not version.startswith("HTTP/1.") or len(code) != 3 or not code.isdigit():
        raise UpstreamSide(502, f"the upstream proxy {proxy.address} answered CONNECT with {line[:80]!r}")
    return int(code), reason.strip()


def _address(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None


def _bracketed(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _without_password(parts: SplitResult) -> str:
    if parts.password is None:
        return parts.geturl()
    return parts._replace(netloc=parts.netloc.replace(f":{parts.password}@", ":***@", 1)).geturl()
