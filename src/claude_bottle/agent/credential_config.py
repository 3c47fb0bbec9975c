"""``[credentials.NAME]``: credentials beyond Anthropic's, each bound to its hosts, parsed into
``CredentialConfig`` values (no value here: it is read at start)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from claude_bottle.agent.fields import Fields
from claude_bottle.agent.presets import CREDENTIAL_PRESETS
from claude_bottle.errors import ConfigError
from claude_bottle.gate.routes import (
    InvalidRoute,
    RouteSpec,
    Scheme,
    check_name,
    check_routes,
    check_username,
    parse_bound_host,
)
from claude_bottle.policy.hosts import Allowlist, Target, normalize_host, parse_pattern
from claude_bottle.policy.rules import HostRules, InvalidRule, RequestPolicy, Verdict, parse_rule

_VARIABLE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# What a bottle's tools read a credential from may be more than a variable name (npm's per-registry keys).
_BOTTLE_VARIABLE = re.compile(r"[A-Za-z_][A-Za-z0-9_./:-]{0,200}")

COMMAND_TIMEOUT = 30.0  # seconds a host command (`gh auth token`) may take at start


@dataclass(frozen=True)
class CredentialConfig:
    """``[credentials.NAME]``: where the value comes from (``env``, ``command``, else the store that
    ``claude-bottle login NAME`` fills), the hosts it is bound to and how it is sent there, and where the bottle
    finds the run's sentinel for it. No value here: it is read at start (``tokens.route_value``)."""

    name: str
    hosts: tuple[tuple[str, int], ...]
    scheme: Scheme
    username: str = ""
    env: str = ""  # a host environment variable holding the value
    command: tuple[str, ...] = ()  # a host command printing the value, run at start
    bottle_env: tuple[str, ...] = ()  # variables in the bottle set to the sentinel
    git: bool = False  # a git credential helper in the bottle answering the sentinel for the hosts
    origin: str = ""  # "FILE: credentials.NAME", for messages

    def spec(self, sentinel: str) -> RouteSpec:
        return RouteSpec(self.name, self.hosts, self.scheme, self.username, sentinel)


def parse_credentials(fields: Fields) -> list[tuple[CredentialConfig, HostRules | None]]:
    """``[credentials.NAME]`` tables, each with the ``[[egress]]``-like entry of its rules (one per bound host,
    when it has rules). A preset's name fills in what the table leaves out."""
    found: list[tuple[CredentialConfig, HostRules | None]] = []
    for name, table in fields.data.items():
        entry = Fields(table if isinstance(table, dict) else {}, fields.source, f"credentials.{name}.")
        if not isinstance(table, dict):
            raise fields.fail(name, f"must be a table ([credentials.{name}])")
        try:
            check_name(name)
        except InvalidRoute as exc:
            raise fields.fail(name, str(exc)) from None
        if name == "proxy":  # `claude-bottle login proxy` stores the upstream proxy's password (tokens.py)
            raise fields.fail(name, "is reserved for the upstream proxy's password (`claude-bottle login proxy`)")
        entry.check_keys({"hosts", "scheme", "username", "env", "command", "bottle_env", "git", "allow", "deny"})
        preset = CREDENTIAL_PRESETS.get(name)
        host_texts = entry.strings("hosts") or (preset.hosts if preset else ())
        if not host_texts:
            raise entry.fail("hosts", f"is required (the hosts this credential is sent to), unless the name is a "
                                      f"preset ({', '.join(CREDENTIAL_PRESETS)})")
        try:
            hosts = tuple(dict.fromkeys(parse_bound_host(h) for h in host_texts))
        except InvalidRoute as exc:
            raise entry.fail("hosts", str(exc)) from None
        scheme_text = entry.string("scheme", preset.scheme.value if preset else "")
        try:
            scheme = Scheme(scheme_text)
        except ValueError:
            raise entry.fail("scheme", f"{scheme_text!r} is not one of {', '.join(s.value for s in Scheme)} "
                                       "(how the value goes in the Authorization header)") from None
        username = entry.string("username", preset.username if preset and scheme is preset.scheme else "")
        if scheme is Scheme.BASIC and not username:
            raise entry.fail("username", 'is required with scheme = "basic" (x-access-token for GitHub, __token__ '
                                         "for PyPI)")
        if scheme is not Scheme.BASIC and username:
            raise entry.fail("username", f'goes with scheme = "basic" only, not {scheme.value!r}')
        if username:
            try:
                check_username(username)
            except InvalidRoute as exc:
                raise entry.fail("username", str(exc)) from None
        env, command = entry.string("env"), entry.strings("command")
        if env and command:
            raise entry.fail("command", "give env or command, not both (neither: `claude-bottle login NAME`)")
        if env and not _VARIABLE.fullmatch(env):
            raise entry.fail("env", f"{env!r} is not a variable name")
        bottle_env = entry.strings("bottle_env") if "bottle_env" in table else (preset.bottle_env if preset else ())
        for variable in bottle_env:
            if not _BOTTLE_VARIABLE.fullmatch(variable):
                raise entry.fail("bottle_env", f"{variable!r} is not a variable name")
        git = table.get("git", preset.git if preset else False)
        if not isinstance(git, bool):
            raise entry.fail("git", "must be true or false")
        rules = {}
        for verdict in Verdict:
            try:
                rules[verdict] = tuple(parse_rule(verdict, text) for text in entry.strings(verdict))
            except InvalidRule as exc:
                raise entry.fail(verdict, str(exc)) from None
        config = CredentialConfig(name, hosts, scheme, username, env, command, bottle_env, git,
                                  f"{fields.source}: credentials.{name}")
        if rules[Verdict.ALLOW] or rules[Verdict.DENY]:
            # The host as [[egress]] would write it (no port for 443), so an entry of its own there clashes.
            found.extend((config, HostRules(parse_pattern(host if port == 443 else f"{host}:{port}"),
                                            rules[Verdict.ALLOW], rules[Verdict.DENY])) for host, port in hosts)
        else:
            found.append((config, None))
    unique = list(dict.fromkeys(config for config, _ in found))
    try:
        check_routes([c.spec("-") for c in unique])
    except InvalidRoute as exc:
        raise ConfigError(f"{fields.source}: credentials: {exc}") from None
    return found


def check_bound_hosts(credentials: tuple[CredentialConfig, ...], egress: RequestPolicy, allow_tcp: Allowlist) -> None:
    """A host bound to a credential is always inspected: not ``inspect = false``, not raw TCP."""
    for credential in credentials:
        for host, port in credential.hosts:
            target = Target(host, port, normalize_host(host)[1])
            if not egress.inspects(target):
                raise ConfigError(f"{credential.origin}: {host}:{port} has an [[egress]] entry with inspect = false, "
                                  "but the gate must read every request to a host bound to a credential (it replaces "
                                  "the client's credentials there); drop inspect = false")
            if allow_tcp.match(target) is not None:
                raise ConfigError(f"{credential.origin}: {host}:{port} is in allow_tcp, whose tunnels the gate does "
                                  "not read, but a host bound to a credential must be inspected; remove it from "
                                  "allow_tcp")
