"""Which HTTP proxy a run's gate connects out through: ``--upstream-proxy``, else the agent's ``upstream_proxy``,
else the host's own proxy variables. ``none`` at either level means no proxy, whatever the environment says.

From the environment: ``https_proxy`` / ``HTTPS_PROXY``, else ``http_proxy`` / ``HTTP_PROXY`` (the lower-case
name first, as curl and Python read them). ``no_proxy`` / ``NO_PROXY`` applies to whichever proxy is chosen.
The proxy's password stays in the chosen value; the gate gets it on standard input (gate/options.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

from claude_bottle.gate.upstream_proxy import NONE, UpstreamProxy

PROXY_VARIABLES = ("https_proxy", "HTTPS_PROXY", "http_proxy", "HTTP_PROXY")
NO_PROXY_VARIABLES = ("no_proxy", "NO_PROXY")


def check_setting(value: str, what: str) -> str:
    """``value`` if it is ``none`` or a proxy URL (a ConfigError naming ``what`` otherwise), for parsing a
    config once and failing there."""
    if value.strip().lower() != NONE:
        UpstreamProxy.parse(value, what)
    return value.strip()


def choose_upstream_proxy(option: str | None, agent_setting: str, environ: Mapping[str, str],
                          stored_password: Callable[[], str | None] | None = None) -> UpstreamProxy | None:
    """The proxy the gate uses: ``option`` (``--upstream-proxy``; None when not given), else ``agent_setting``
    (the agent's ``upstream_proxy``; empty when unset), else ``environ``'s proxy variables. None: dialled
    directly. A ConfigError names the setting a bad value came from. A URL with a user and no password gets
    the one ``claude-bottle login proxy`` stored (``stored_password``, by default the store's), if any."""
    no_proxy = next((environ[name] for name in NO_PROXY_VARIABLES if environ.get(name)), "")
    chosen = None
    for value, what in ((option, "--upstream-proxy"), (agent_setting, "upstream_proxy")):
        if value:
            chosen = NONE if value.strip().lower() == NONE else UpstreamProxy.parse(value, what, no_proxy)
            break
    else:
        name = next((name for name in PROXY_VARIABLES if environ.get(name)), None)
        chosen = UpstreamProxy.parse(environ[name], f"${name}", no_proxy) if name else None
    if not isinstance(chosen, UpstreamProxy):
        return None
    if chosen.username and not chosen.password:
        if stored_password is None:
            from claude_bottle import tokens  # the keyring's import is slow: only for a proxy that needs it

            stored_password = tokens.proxy_password
        password = stored_password()
        if password:
            return dataclasses.replace(chosen, password=password)
    return chosen
