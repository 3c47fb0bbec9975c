"""The upstream proxy setting: its URL parsed strictly, its password never shown, NO_PROXY matched as curl does."""

from __future__ import annotations

import pytest

from claude_bottle.agent.schema import parse_agent
from claude_bottle.agent.upstream_proxy import choose_upstream_proxy
from claude_bottle.errors import ConfigError
from claude_bottle.gate.upstream_proxy import UpstreamProxy


def test_a_url_with_credentials_parses_and_shows_no_password() -> None:
    proxy = UpstreamProxy.parse("http://me%40corp:p%3Ass@Proxy.Corp:3128", "--upstream-proxy")
    assert (proxy.host, proxy.port, proxy.username, proxy.password) == ("proxy.corp", 3128, "me@corp", "p:ss")
    assert proxy.url == "http://me%40corp@proxy.corp:3128" and "p:ss" not in repr(proxy)
    assert proxy.authorization == b"Basic bWVAY29ycDpwOnNz"


def test_without_credentials_no_authorization_and_port_80_by_default() -> None:
    proxy = UpstreamProxy.parse("http://[::1]", "HTTPS_PROXY")
    assert (proxy.host, proxy.port, proxy.authorization, proxy.url) == ("::1", 80, None, "http://[::1]:80")


@pytest.mark.parametrize(("url", "sent"), [
    ("http://jsmith:a-long-proxy-password@proxy", ("anNtaXRoOmEtbG9uZy1wcm94eS1wYXNzd29yZA==",
                                                   "jsmith:a-long-proxy-password", "a-long-proxy-password")),
    ("http://jsmith:Winter2026!@proxy", ("anNtaXRoOldpbnRlcjIwMjYh", "jsmith:Winter2026!")),  # the password: too short
    ("http://a:b@proxy", ()), ("http://proxy", ()),
    ("http://a-long-user-name-only@proxy", ("YS1sb25nLXVzZXItbmFtZS1vbmx5Og==",)),  # no password: no pair
])
def test_the_values_answers_are_searched_for_are_those_long_enough(url: str, sent: tuple[str, ...]) -> None:
    """What a plain-HTTP answer through the proxy must not carry (gate/proxy.py), and the audit never shows."""
    assert UpstreamProxy.parse(url, "test").sent() == sent


@pytest.mark.parametrize("url", ["https://proxy:3128", "socks5://proxy:1080", "proxy:3128", "http://proxy:99999",
                                 "http://proxy:3128/path", "http://:3128"])
def test_anything_else_is_refused_naming_the_setting_and_never_the_password(url: str) -> None:
    with pytest.raises(ConfigError, match="--upstream-proxy") as caught:
        UpstreamProxy.parse(url.replace("//", "//u:hunter2@", 1) if "//" in url else url, "--upstream-proxy")
    assert "hunter2" not in str(caught.value)


@pytest.mark.parametrize(("no_proxy", "host", "bypassed"), [
    ("*", "api.anthropic.com", True),
    ("example.com", "example.com", True),
    ("example.com", "api.example.com", True),
    (".example.com", "api.example.com", True),
    ("*.example.com", "example.com", True),
    ("example.com", "badexample.com", False),
    ("10.0.0.0/8", "10.2.3.4", True),
    ("10.0.0.0/8", "11.2.3.4", False),
    ("::1", "::1", True),
    ("[::1]", "::1", True),
    ("", "example.com", False),
    ("localhost, .internal", "git.internal", True),
])
def test_no_proxy_entries(no_proxy: str, host: str, bypassed: bool) -> None:
    assert UpstreamProxy.parse("http://proxy:3128", "x", no_proxy).bypasses(host) is bypassed


# -- which proxy a run's gate uses: the option, else the agent's, else the host's variables ---------------------

ENVIRON = {"HTTPS_PROXY": "http://env-https:3128", "http_proxy": "http://env-http:8080", "NO_PROXY": "internal"}


@pytest.mark.parametrize(("option", "agent", "environ", "chosen"), [
    (None, "", {}, None),
    (None, "", ENVIRON, "env-https"),
    (None, "", {"http_proxy": "http://env-http:8080"}, "env-http"),
    (None, "", {"https_proxy": "http://lower:1", "HTTPS_PROXY": "http://upper:1"}, "lower"),
    (None, "http://agent:3128", ENVIRON, "agent"),
    ("http://option:3128", "http://agent:3128", ENVIRON, "option"),
    ("none", "http://agent:3128", ENVIRON, None),
    (None, "NONE", ENVIRON, None),
])
def test_the_option_then_the_agent_then_the_environment(option: str | None, agent: str, environ: dict[str, str],
                                                        chosen: str | None) -> None:
    proxy = choose_upstream_proxy(option, agent, environ)
    assert (proxy.host if proxy is not None else None) == chosen


def test_no_proxy_from_the_environment_applies_to_the_chosen_proxy() -> None:
    proxy = choose_upstream_proxy("http://option:3128", "", {"no_proxy": "git.internal"})
    assert proxy is not None and proxy.bypasses("git.internal") and not proxy.bypasses("api.anthropic.com")


def test_a_bad_value_names_where_it_came_from() -> None:
    with pytest.raises(ConfigError, match=r"\$HTTPS_PROXY"):
        choose_upstream_proxy(None, "", {"HTTPS_PROXY": "socks5://x:1"})
    with pytest.raises(ConfigError, match="--upstream-proxy"):
        choose_upstream_proxy("proxy.corp", "", {})


def test_an_agent_names_its_proxy_and_a_bad_one_fails_when_parsed() -> None:
    agent = parse_agent("a", {"version": 1, "upstream_proxy": "http://u:pw@proxy.corp:3128"}, "a.toml")
    assert agent.upstream_proxy == "http://u:pw@proxy.corp:3128" and "pw" not in repr(agent)
    assert parse_agent("a", {"version": 1, "upstream_proxy": "none"}, "a.toml").upstream_proxy == "none"
    with pytest.raises(ConfigError, match=r"a\.toml: upstream_proxy"):
        parse_agent("a", {"version": 1, "upstream_proxy": "https://proxy.corp"}, "a.toml")


def test_doctor_names_the_proxy_and_whether_the_api_answers_through_it() -> None:
    import socket
    import threading

    from claude_bottle.commands.doctor import upstream_proxy_check

    assert upstream_proxy_check({}) == (True, "upstream proxy: none (the gate connects out directly)")
    assert upstream_proxy_check({"HTTPS_PROXY": "http://127.0.0.1:1", "NO_PROXY": "*"})[0]
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    ok, line = upstream_proxy_check({"HTTPS_PROXY": f"http://u:secret@127.0.0.1:{port}"}, timeout=3)
    assert not ok and f"upstream proxy: http://u@127.0.0.1:{port}: cannot reach the upstream proxy http://127.0.0.1:{port}" in line and "secret" not in line
    assert "a proxy on the host's loopback is not reachable from the gate's container" in line

    server = socket.create_server(("127.0.0.1", 0))
    asked: list[bytes] = []

    def answer() -> None:
        conn, _ = server.accept()
        with conn:
            asked.append(conn.recv(4096))
            conn.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    try:
        ok, line = upstream_proxy_check({"https_proxy": f"http://127.0.0.1:{server.getsockname()[1]}"}, timeout=3)
    finally:
        thread.join(5)
        server.close()
    assert ok and "api.anthropic.com:443 answers through it" in line
    assert asked[0].startswith(b"CONNECT api.anthropic.com:443 HTTP/1.1\r\n")


def test_the_build_environment_has_both_spellings_with_the_password_percent_encoded() -> None:
    proxy = UpstreamProxy.parse("http://me%40corp:p%3Ass@proxy.corp:3128", "test", "localhost, .corp")
    assert proxy.environment() == {
        name: value for names, value in ((("http_proxy", "https_proxy"), "http://me%40corp:p%3Ass@proxy.corp:3128"),
                                         (("no_proxy",), "localhost,.corp"))
        for spelling in names for name in (spelling, spelling.upper())}
    assert UpstreamProxy.parse("http://[::1]:8080", "test").environment()["HTTP_PROXY"] == "http://[::1]:8080"


def test_a_user_without_a_password_takes_the_stored_one_and_only_then() -> None:
    stored = lambda: "from-the-store"  # noqa: E731
    with_user = choose_upstream_proxy("http://me@proxy:3128", "", {}, stored)
    assert with_user is not None and with_user.password == "from-the-store"
    given = choose_upstream_proxy(None, "", {"HTTPS_PROXY": "http://me:own@proxy:3128"}, stored)
    assert given is not None and given.password == "own"
    anonymous = choose_upstream_proxy("http://proxy:3128", "", {}, stored)
    assert anonymous is not None and (anonymous.username, anonymous.password) == ("", "")
    nothing = choose_upstream_proxy("http://me@proxy:3128", "", {}, lambda: None)
    assert nothing is not None and nothing.password == ""
    assert choose_upstream_proxy("none", "", {"HTTPS_PROXY": "http://me@proxy:3128"}, stored) is None


def test_proxy_is_not_a_credential_routes_name() -> None:
    with pytest.raises(ConfigError, match="reserved for the upstream proxy's password"):
        parse_agent("a", {"version": 1, "credentials": {"proxy": {"hosts": ["example.com"], "env": "X"}}}, "test")
