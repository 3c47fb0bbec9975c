"""The upstream proxy setting: its URL parsed strictly, its password never shown, NO_PROXY matched as curl does."""

from __future__ import annotations

import pytest

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
