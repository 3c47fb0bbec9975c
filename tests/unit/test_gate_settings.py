"""gate/settings.py: the gate's flag values parsed into its settings; and the end-to-end header filter."""

from __future__ import annotations

import ipaddress
import ssl
from pathlib import Path

import pytest

from claude_bottle.credentials import Credential
from claude_bottle.errors import ConfigError
from claude_bottle.gate.http1 import HOP_BY_HOP, end_to_end, hop_free
from claude_bottle.gate.settings import (
    Endpoint,
    GateSettings,
    Upstream,
    parse_allowlist,
    parse_api_paths,
    parse_listen,
    parse_networks,
    parse_upstream,
)
from claude_bottle.policy.decide import CLAUDE_CODE_API_PATHS
from claude_bottle.policy.hosts import HostPattern

LISTEN_VALID = [
    ("127.0.0.1:8080", Endpoint("127.0.0.1", 8080), "127.0.0.1:8080"),
    ("[::1]:0", Endpoint("::1", 0), "[::1]:0"),
    ("localhost:1", Endpoint("localhost", 1), "localhost:1"),
    (" LOCALHOST:65535 ", Endpoint("localhost", 65535), "localhost:65535"),
    ("127.1:80", Endpoint("127.0.0.1", 80), "127.0.0.1:80"),
    ("10.0.0.5:0", Endpoint("10.0.0.5", 0), "10.0.0.5:0"),
]


@pytest.mark.parametrize(("text", "endpoint", "shown"), LISTEN_VALID, ids=[c[0] for c in LISTEN_VALID])
def test_parse_listen(text: str, endpoint: Endpoint, shown: str) -> None:
    parsed = parse_listen(text, "--api-listen")
    assert parsed == endpoint
    assert str(parsed) == shown


LISTEN_INVALID = [
    ("[::ffff:0.0.0.0]:80", "refusing to listen on every interface"),
    ("0.0.0.0:80", "refusing to listen on every interface"),
    ("[::]:80", "refusing to listen on every interface"),
    ("0:80", "refusing to listen on every interface"),
    ("127.0.0.1", "a port is required"),
    ("[::1]", "a port is required"),
    ("x:99999", "listen port '99999' is not a number from 1 to 65535"),
    ("x:00", "listen port '00'"),
    ("x:", "listen port ''"),
    ("a..b:80", "not a valid host name"),
    ("[::1:80", "unbalanced brackets"),
    ("127.0.0.1:\u00b2", "is not a number from 1 to 65535"),  # superscript two: str.isdigit() but not a port
]


@pytest.mark.parametrize(("text", "words"), LISTEN_INVALID, ids=[repr(c[0]) for c in LISTEN_INVALID])
def test_parse_listen_invalid(text: str, words: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_listen(text, "--proxy-listen")
    message = str(info.value)
    assert message.startswith(f"--proxy-listen {text!r}: ")
    assert words in message


UPSTREAM_VALID = [
    ("https://api.anthropic.com", Upstream("https", "api.anthropic.com", 443, ""), b"api.anthropic.com"),
    ("  https://API.Anthropic.COM./ ", Upstream("https", "api.anthropic.com", 443, ""), b"api.anthropic.com"),
    ("http://127.0.0.1:9", Upstream("http", "127.0.0.1", 9, ""), b"127.0.0.1:9"),
    ("http://localhost", Upstream("http", "localhost", 80, ""), b"localhost"),
    ("http://localhost:80", Upstream("http", "localhost", 80, ""), b"localhost"),
    ("https://gw.example/anthropic/", Upstream("https", "gw.example", 443, "/anthropic"), b"gw.example"),
    ("https://gw.example/a/b", Upstream("https", "gw.example", 443, "/a/b"), b"gw.example"),
    ("https://gw.example:8443/a", Upstream("https", "gw.example", 8443, "/a"), b"gw.example:8443"),
    ("https://[::1]:8443", Upstream("https", "::1", 8443, ""), b"[::1]:8443"),
    ("https://[::1]", Upstream("https", "::1", 443, ""), b"[::1]"),
    ("https://gw.example:80", Upstream("https", "gw.example", 80, ""), b"gw.example:80"),
]


@pytest.mark.parametrize(("text", "upstream", "authority"), UPSTREAM_VALID, ids=[c[0] for c in UPSTREAM_VALID])
def test_parse_upstream(text: str, upstream: Upstream, authority: bytes) -> None:
    parsed = parse_upstream(text)
    assert parsed == upstream
    assert parsed.authority == authority


UPSTREAM_INVALID = [
    ("https://x.example/a b", "the path must be plain"),
    ("https://x.example/a/../b", "the path must be plain"),
    ("ftp://api.anthropic.com", "expected an http(s) URL"),
    ("api.anthropic.com", "expected an http(s) URL"),
    ("https://", "expected an http(s) URL"),
    ("wss://x.example", "expected an http(s) URL"),
    ("https://user:pass@x.example", "credentials, query and fragment are not allowed"),
    ("https://user@x.example", "credentials, query and fragment are not allowed"),
    ("https://x.example/?a=1", "credentials, query and fragment are not allowed"),
    ("https://x.example/#frag", "credentials, query and fragment are not allowed"),
    ("https://x.example:99999", "Port out of range"),
    ("https://x.example:abc", "Port could not be cast"),
    ("https://a..b", "not a valid host name"),
    ("https://x.example:0", ""),  # port 0 is not a port one can connect to
]


@pytest.mark.parametrize(("text", "words"), UPSTREAM_INVALID, ids=[c[0] for c in UPSTREAM_INVALID])
def test_parse_upstream_invalid(text: str, words: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_upstream(text)
    message = str(info.value)
    assert message.startswith(f"--upstream {text!r}: ")
    assert words in message


API_PATH_CASES = [
    ([], set()),
    (["/v1/models"], {("GET", "/v1/models"), ("POST", "/v1/models")}),
    (["GET /v1/x"], {("GET", "/v1/x")}),
    (["get /v1/x"], {("GET", "/v1/x")}),
    (["  DELETE   /v1/files/abc  "], {("DELETE", "/v1/files/abc")}),
    (["/v1/models", "PUT /v1/y"], {("GET", "/v1/models"), ("POST", "/v1/models"), ("PUT", "/v1/y")}),
    (["POST /v1/messages"], set()),  # already a default
]


@pytest.mark.parametrize(("texts", "added"), API_PATH_CASES, ids=[repr(c[0]) for c in API_PATH_CASES])
def test_parse_api_paths(texts: list[str], added: set[tuple[str, str]]) -> None:
    policy = parse_api_paths(texts)
    assert policy.allowed == CLAUDE_CODE_API_PATHS | added
    for method, path in added:
        assert policy.decide(method, path).allow is True


API_PATH_INVALID = ["v1/models", "GET v1/models", "/v1/x?a=1", "GET /a /b", "GET", "", "   "]


@pytest.mark.parametrize("text", API_PATH_INVALID, ids=[repr(t) for t in API_PATH_INVALID])
def test_parse_api_paths_invalid(text: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_api_paths(["/v1/ok", text])
    message = str(info.value)
    assert message.startswith(f"--allow-api-path {text!r}: ")
    assert "expected /path or 'METHOD /path'" in message


def test_parse_networks() -> None:
    assert parse_networks(["10.0.0.0/8", "fd00::/8"]) == (
        ipaddress.ip_network("10.0.0.0/8"), ipaddress.ip_network("fd00::/8")
    )
    assert parse_networks([]) == ()


@pytest.mark.parametrize(
    ("texts", "words"),
    [(["10.0.0.1/8"], ["'10.0.0.1/8'", "host bits set"]), (["10.0.0.0/8", "bogus"], ["'bogus'"])],
    ids=["host-bits", "second-bad"],
)
def test_parse_networks_invalid(texts: list[str], words: list[str]) -> None:
    with pytest.raises(ConfigError) as info:
        parse_networks(texts)
    message = str(info.value)
    assert message.startswith("--allow-private: ")
    assert "not a network in CIDR form" in message
    for word in words:
        assert word in message


def test_parse_allowlist() -> None:
    allowlist = parse_allowlist(["Example.com", "*.github.com:8443"])
    assert allowlist.patterns == (HostPattern("example.com", False, None), HostPattern("github.com", True, 8443))


@pytest.mark.parametrize(
    ("texts", "words"),
    [(["*.com"], "public suffix"), (["ok.example", "http://x"], "not a URL"), (["*"], "matches every host"),
     (["example.com:0"], "from 1 to 65535"), (["example.com:\u00b2"], "from 1 to 65535")],
    ids=["public-suffix", "url", "star", "port-zero", "superscript-port"],
)
def test_parse_allowlist_invalid(texts: list[str], words: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_allowlist(texts)
    message = str(info.value)
    assert message.startswith("--allow: allow pattern ")
    assert words in message


END_TO_END_CASES = [
    (
        "hop-by-hop-dropped",
        [(b"Host", b"x"), (b"Connection", b"keep-alive"), (b"Keep-Alive", b"timeout=5"), (b"TE", b"trailers"),
         (b"Transfer-Encoding", b"chunked"), (b"Upgrade", b"websocket"), (b"Trailer", b"x-t"),
         (b"Proxy-Connection", b"close"), (b"Proxy-Authorization", b"Basic eA=="),
         (b"Proxy-Authenticate", b"Basic"), (b"Content-Type", b"application/json")],
        [(b"Host", b"x"), (b"Content-Type", b"application/json")],
    ),
    (
        "connection-listed-dropped-case-insensitive",
        [(b"a", b"1"), (b"Connection", b"X-Foo, x-BAR ,  close"), (b"X-FOO", b"2"), (b"b", b"3"),
         (b"x-bar", b"4"), (b"x-foo", b"5"), (b"c", b"6")],
        [(b"a", b"1"), (b"b", b"3"), (b"c", b"6")],
    ),
    (
        "several-connection-headers",
        [(b"connection", b"x-one"), (b"CONNECTION", b"X-Two"), (b"x-one", b"1"), (b"x-two", b"2"), (b"x-three", b"3")],
        [(b"x-three", b"3")],
    ),
    (
        "order-and-duplicates-kept",
        [(b"z", b"1"), (b"a", b"2"), (b"z", b"3"), (b"Accept", b"*/*"), (b"a", b"4")],
        [(b"z", b"1"), (b"a", b"2"), (b"z", b"3"), (b"Accept", b"*/*"), (b"a", b"4")],
    ),
    (
        "connection-can-drop-end-to-end-names",
        [(b"Connection", b"authorization"), (b"Authorization", b"Bearer x"), (b"x-api-key", b"k")],
        [(b"x-api-key", b"k")],
    ),
    (
        "empty-tokens-harmless",
        [(b"Connection", b", ,"), (b"a", b"1")],
        [(b"a", b"1")],
    ),
    ("empty", [], []),
]


@pytest.mark.parametrize(("headers", "expected"), [c[1:] for c in END_TO_END_CASES], ids=[c[0] for c in END_TO_END_CASES])
def test_end_to_end(headers: list[tuple[bytes, bytes]], expected: list[tuple[bytes, bytes]]) -> None:
    assert end_to_end(headers) == expected
    assert end_to_end(iter(headers)) == expected  # any iterable, consumed once
    # The parser's headers have their names in lower case: hop_free drops the same ones without lowering them.
    lowered = [(n.lower(), v) for n, v in headers]
    assert hop_free(lowered) == [(n.lower(), v) for n, v in expected]


def test_hop_free_drops_more_names_when_asked() -> None:
    headers = [(b"content-length", b"2"), (b"connection", b"x-one"), (b"x-one", b"1"), (b"expect", b"100-continue"),
               (b"x-two", b"2")]
    assert hop_free(headers, HOP_BY_HOP | {b"content-length", b"expect"}) == [(b"x-two", b"2")]


def test_hop_by_hop_set() -> None:
    assert frozenset({
        b"connection", b"keep-alive", b"proxy-connection", b"te", b"trailer", b"transfer-encoding", b"upgrade",
        b"proxy-authenticate", b"proxy-authorization",
    }) == HOP_BY_HOP


def test_egress_rules_and_no_inspect_become_the_request_policy_and_join_the_allowlist() -> None:
    from claude_bottle.gate.options import compose_allowlist
    from claude_bottle.gate.settings import parse_egress_rules
    from claude_bottle.policy.hosts import Target

    policy = parse_egress_rules(["api.github.com allow GET /repos/**", "api.github.com deny POST /gists",
                                 "*.example.com:8443 allow * /**"], ["pinned.example.net"])
    assert [str(e.host) for e in policy.hosts] == ["api.github.com", "*.example.com:8443", "pinned.example.net"]
    assert policy.decide("GET", "api.github.com", 443, "/repos/a").allow
    assert not policy.decide("POST", "api.github.com", 443, "/gists").allow
    assert not policy.inspects(Target("pinned.example.net", 443))
    allowlist = compose_allowlist(parse_allowlist(["api.github.com", "registry.npmjs.org"]).patterns, policy, ())
    assert [str(p) for p in allowlist.patterns] == ["api.github.com", "registry.npmjs.org", "*.example.com:8443",
                                                    "pinned.example.net"]


@pytest.mark.parametrize(("rules", "opaque", "words"), [
    (["api.github.com allow"], [], "--egress-rule 'api.github.com allow': write HOST allow|deny METHOD PATH"),
    (["api.github.com allow GET repos"], [], "--egress-rule 'api.github.com allow GET repos': rule 'GET repos'"),
    ([], ["*"], "--no-inspect '*': allow pattern '*' matches every host"),
])
def test_egress_flag_errors_name_the_flag(rules: list[str], opaque: list[str], words: str) -> None:
    from claude_bottle.gate.settings import parse_egress_rules

    with pytest.raises(ConfigError) as caught:
        parse_egress_rules(rules, opaque)
    assert str(caught.value).startswith(words)


def test_dlp_flags() -> None:
    from claude_bottle.gate.settings import parse_dlp

    policy = parse_dlp(["internal-token itk_[a-z0-9]{32}"], ["jwt"])
    assert policy.disabled == {"jwt"} and [r.name for r in policy.extra] == ["internal-token"]
    with pytest.raises(ConfigError, match=r"^--dlp-rule 'x itk_\[a-z\]\+': rule x: .*bound every repetition"):
        parse_dlp(["x itk_[a-z]+"], [])
    with pytest.raises(ConfigError, match=r"^--dlp-off 'aws' is not a built-in DLP rule"):
        parse_dlp([], ["aws"])


def test_the_gate_command_parses_its_rule_flags(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The flags reach GateSettings: the run is replaced by a recorder of the settings it is given."""
    from click.testing import CliRunner

    from claude_bottle.cli import cli
    from claude_bottle.gate import server

    seen = []

    async def record(config: object, audit: object, **options: object) -> None:
        seen.append(config)

    monkeypatch.setattr(server, "run", record)
    token = tmp_path / "token"
    token.write_text("sk-ant-oat01-" + "a" * 80 + "AA")
    token.chmod(0o600)
    result = CliRunner().invoke(cli, [
        "gate", "--api-listen", "127.0.0.1:0", "--proxy-listen", "127.0.0.1:0", "--token-file", str(token),
        "--egress-rule", "api.github.com allow GET /repos/**", "--no-inspect", "pinned.example.net",
        "--dlp-rule", "internal-token itk_[a-z0-9]{32}", "--dlp-off", "jwt"])
    assert result.exit_code == 0, result.output
    config = seen[0]
    assert [str(p) for p in config.allowlist.patterns] == ["api.github.com", "pinned.example.net"]  # type: ignore[attr-defined]
    assert config.request_policy.decide("GET", "api.github.com", 443, "/repos/x").allow  # type: ignore[attr-defined]
    assert config.dlp.disabled == {"jwt"}  # type: ignore[attr-defined]
    bad = CliRunner().invoke(cli, [
        "gate", "--api-listen", "127.0.0.1:0", "--proxy-listen", "127.0.0.1:0", "--token-file", str(token),
        "--egress-rule", "api.github.com allow get /"])
    assert isinstance(bad.exception, ConfigError) and "--egress-rule 'api.github.com allow get /'" in str(bad.exception)


def test_one_upstream_tls_context_per_gate(tmp_path: Path) -> None:
    """Loading the system trust store takes tens of milliseconds of the gate's start: it is done once."""
    config = GateSettings(Endpoint("127.0.0.1", 0), Endpoint("127.0.0.1", 0),
                        Credential.parse("sk-ant-oat01-" + "A" * 60, "test"), Upstream("https", "api.example", 443, ""))
    context = config.ssl_context()
    assert config.ssl_context() is context
    assert context.verify_mode is ssl.CERT_REQUIRED and context.check_hostname


def test_an_extra_ca_that_cannot_be_loaded_is_a_config_error(tmp_path: Path) -> None:
    bad = tmp_path / "ca.pem"
    bad.write_text("not a certificate\n")
    config = GateSettings(Endpoint("127.0.0.1", 0), Endpoint("127.0.0.1", 0),
                        Credential.parse("sk-ant-oat01-" + "A" * 60, "test"), Upstream("https", "api.example", 443, ""),
                        extra_ca_files=(bad,))
    with pytest.raises(ConfigError, match="--extra-ca"):
        config.ssl_context()
