"""Credential routes beyond Anthropic: a secret the gate holds for some hosts, and the bottle's sentinel for it.

A route binds exact hosts (``github.com``, ``registry.npmjs.org:443``). On a request the gate reads (terminated
TLS) to a bound host, every credential the client sent is removed and the route's own is added, so a hijacked
agent can neither learn the secret nor use a token of its own there. The bottle holds only the route's
sentinel, a per-run value that grants nothing: DLP refuses it, and every held secret, anywhere else. A bound
host is never reached uninspected: an opaque tunnel or plain HTTP to it is refused (``bound_refusal``).

On a bound host the client's credentials are recognised whatever their spelling: header names in any case
and with ``_`` for ``-`` (``X_Auth_Token``: servers behind CGI-style stacks read both as one), and a
credential in the query (``access_token``, ``private_token``, ...), which refuses the request: the gate
cannot tell what else in a URL the server reads, so it does not rewrite one.

What crosses to the gate: the route's spec on its command line (``--credential-route``, no secret in it) and
the secret on its standard input after the Anthropic token, one line per route in the order of the flags.
"""

from __future__ import annotations

import base64
import enum
import re
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from urllib.parse import unquote_plus

from claude_bottle.policy.hosts import InvalidHost, Target, normalize_host, parse_port, split_host_port

MIN_SECRET = 16  # DLP matches held secrets in every encoding; shorter values occur in ordinary traffic
MAX_SECRET = 4096
_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,39}")
_SECRET = re.compile(r"[\x21-\x7e]+")  # printable ASCII, no spaces: a header value and a line on stdin
_USERNAME = re.compile(r"[A-Za-z0-9_.@+-]{1,100}")


# Every header a client can present a credential in, by its canonical name (lower case, '-' for '_').
CLIENT_CREDENTIAL_HEADERS = frozenset({b"authorization", b"x-api-key", b"proxy-authorization", b"cookie",
                                       b"private-token", b"x-auth-token", b"job-token", b"x-access-token",
                                       b"x-gitlab-token", b"x-github-token", b"x-npm-token", b"api-key",
                                       b"deploy-token", b"x-jfrog-art-api", b"x-api-token"})
# Query parameters that carry a credential on the APIs routes serve (GitHub, GitLab, package registries);
# compared with '-' read as '_' and in any case.
CREDENTIAL_QUERY_PARAMETERS = frozenset({"access_token", "private_token", "job_token", "oauth_token",
                                         "auth_token", "token", "api_key", "apikey", "client_secret",
                                         "refresh_token", "id_token", "password"})


def _underscored(name: bytes) -> set[bytes]:
    """``name`` with each of its '-' written as '-' or as '_'."""
    first, dash, rest = name.partition(b"-")
    if not dash:
        return {name}
    return {first + sep + tail for sep in (b"-", b"_") for tail in _underscored(rest)}


# Every spelling of those names in lower case, '_' for any '-': a filter compares a lower-cased name with one set
# lookup (the API route removes them from every request).
CLIENT_CREDENTIAL_SPELLINGS = frozenset(s for name in CLIENT_CREDENTIAL_HEADERS for s in _underscored(name))


def is_client_credential(name: bytes) -> bool:
    """Whether header ``name`` (as received) is one a client can present a credential in, in any spelling."""
    return name.lower() in CLIENT_CREDENTIAL_SPELLINGS


def query_credential(target: bytes) -> str | None:
    """The first parameter of ``target``'s query that carries a credential (its canonical name), or None."""
    _, _, query = target.partition(b"?")
    for pair in query.split(b"#", 1)[0].replace(b";", b"&").split(b"&"):
        name = unquote_plus(pair.split(b"=", 1)[0].decode("latin-1")).strip().lower().replace("-", "_")
        if name in CREDENTIAL_QUERY_PARAMETERS:
            return name
    return None


class InvalidRoute(ValueError):
    """A route, its value or its flag that cannot be used; the message says how to fix it."""


class Scheme(enum.Enum):
    """How the secret goes in the ``Authorization`` header."""

    BEARER = "bearer"  # Bearer SECRET (npm, most APIs)
    TOKEN = "token"  # token SECRET (GitHub's older form)
    BASIC = "basic"  # Basic base64(USERNAME:SECRET) (git over HTTPS, PyPI uploads, package indexes)


@dataclass(frozen=True)
class RouteSpec:
    """A route as the gate's command line carries it: nothing secret (the sentinel is in the bottle anyway)."""

    name: str
    hosts: tuple[tuple[str, int], ...]  # normalised host names with their port
    scheme: Scheme
    username: str  # for Basic; "" otherwise
    sentinel: str

    def binds(self, target: Target) -> bool:
        return (target.host, target.port) in self.hosts

    def flag(self) -> str:
        """``--credential-route`` text, read back by ``parse_route_flag``."""
        hosts = ",".join(f"{host}:{port}" for host, port in self.hosts)
        return f"{self.name} {self.scheme.value} {self.username or '-'} {self.sentinel} {hosts}"


@dataclass(frozen=True)
class CredentialRoute:
    """A route with its secret. The secret is only in this object; its repr never shows it."""

    spec: RouteSpec
    secret: str = field(repr=False)

    def __repr__(self) -> str:
        return f"CredentialRoute(spec={self.spec!r}, secret=<redacted>)"

    def header(self) -> tuple[bytes, bytes]:
        """The one header that carries the route's own credential to a bound host."""
        if self.spec.scheme is Scheme.BASIC:
            pair = f"{self.spec.username}:{self.secret}".encode()
            return b"authorization", b"Basic " + base64.b64encode(pair)
        word = b"Bearer " if self.spec.scheme is Scheme.BEARER else b"token "
        return b"authorization", word + self.secret.encode()

    def sent(self) -> tuple[str, ...]:
        """What of the secret goes upstream as is: the secret, and for Basic the header's encoded pair too
        (a server echoing the request's headers would reflect that, not the secret)."""
        value = self.header()[1].decode().split(" ", 1)[1]
        return (self.secret,) if value == self.secret else (self.secret, value)


def new_sentinel(name: str) -> str:
    """A per-run stand-in for route ``name``'s secret: unique, long enough for DLP, like no real token."""
    return f"claude-bottle-sentinel-{name}-{secrets.token_hex(16)}"


def check_name(name: str) -> str:
    if not _NAME.fullmatch(name):
        raise InvalidRoute(f"credential name {name!r}: use lower-case letters, digits, '-' and '_' (at most 40)")
    return name


def check_secret(text: str, source: str) -> str:
    """The value of a route as read from ``source``: one line of printable ASCII, 16 to 4096 characters."""
    value = text.strip()
    if not value:
        raise InvalidRoute(f"{source} is empty")
    if not _SECRET.fullmatch(value):
        raise InvalidRoute(f"{source} holds spaces, several lines or non-ASCII characters; a credential is one "
                           "token of printable characters")
    if not MIN_SECRET <= len(value) <= MAX_SECRET:
        raise InvalidRoute(f"{source} is {len(value)} characters long; a credential the gate can hold is "
                           f"{MIN_SECRET} to {MAX_SECRET} (shorter values would be found in ordinary traffic)")
    return value


def check_username(username: str) -> str:
    if not _USERNAME.fullmatch(username):
        raise InvalidRoute(f"username {username!r}: letters, digits and . _ @ + - only (it goes in a Basic header)")
    return username


def parse_bound_host(text: str) -> tuple[str, int]:
    """``host`` or ``host:port`` (443 by default): an exact name or address, never a wildcard."""
    try:
        host, port = split_host_port(text.strip())
        if "*" in host:
            raise InvalidHost("a credential is bound to exact hosts, not wildcards")
        name, _ = normalize_host(host)
        return name, parse_port(port, "host") if port else 443
    except InvalidHost as exc:
        raise InvalidRoute(f"host {text!r}: {exc}") from None


def parse_route_flag(text: str) -> RouteSpec:
    """``--credential-route 'NAME SCHEME USERNAME|- SENTINEL HOST[:PORT][,HOST[:PORT]...]'``."""
    words = text.split()
    example = "'github basic x-access-token SENTINEL github.com,api.github.com'"
    if len(words) != 5:
        raise InvalidRoute(f"--credential-route {text!r}: write NAME SCHEME USERNAME|- SENTINEL HOSTS, as in {example}")
    name, scheme_text, username, sentinel, hosts = words
    try:
        scheme = Scheme(scheme_text)
    except ValueError:
        raise InvalidRoute(f"--credential-route {text!r}: scheme {scheme_text!r} is not one of "
                           f"{', '.join(s.value for s in Scheme)}") from None
    try:
        check_name(name)
        check_secret(sentinel, "the sentinel")
        username = "" if username == "-" else check_username(username)
        bound = tuple(dict.fromkeys(parse_bound_host(h) for h in hosts.split(",")))
    except InvalidRoute as exc:
        raise InvalidRoute(f"--credential-route {text!r}: {exc}") from None
    if (scheme is Scheme.BASIC) != bool(username):
        raise InvalidRoute(f"--credential-route {text!r}: a username goes with basic, and only with it")
    return RouteSpec(name, bound, scheme, username, sentinel)


def check_routes(routes: Sequence[RouteSpec]) -> None:
    """No two routes share a name or a host: which credential a host gets must be unambiguous."""
    owners: dict[tuple[str, int], str] = {}
    names: set[str] = set()
    for route in routes:
        if route.name in names:
            raise InvalidRoute(f"credential route {route.name} is given twice; keep one")
        names.add(route.name)
        for host in route.hosts:
            if host in owners:
                raise InvalidRoute(f"{host[0]}:{host[1]} is bound to both {owners[host]} and {route.name}; "
                                   "bind each host to one credential")
            owners[host] = route.name


def route_for(routes: Sequence[CredentialRoute], target: Target) -> CredentialRoute | None:
    for route in routes:
        if route.spec.binds(target):
            return route
    return None


def bound_elsewhere(routes: Sequence[CredentialRoute], target: Target) -> CredentialRoute | None:
    """The route that binds ``target``'s host on other ports than its own, if any: on that port the host is
    never reached (plain HTTP to port 80 of a host bound on 443 would carry the client's own credential, not
    stripped, and no rule of the route would apply)."""
    if route_for(routes, target) is not None:
        return None
    for route in routes:
        if any(host == target.host for host, _ in route.spec.hosts):
            return route
    return None
