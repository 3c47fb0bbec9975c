"""The host-to-gate contract: options -> the gate's arguments and standard input -> the same options, through
the ``gate`` command's own parser, for generated values of every field; secrets on standard input only."""

from __future__ import annotations

import dataclasses
import io
import random
import tomllib
from pathlib import Path
from typing import Any

import click
import pytest

from claude_bottle.agent.schema import parse_agent
from claude_bottle.cli import gate as gate_command
from claude_bottle.credentials import Credential
from claude_bottle.errors import ConfigError
from claude_bottle.gate.dlp import BUILTIN_NAMES
from claude_bottle.gate.options import GateOptions, compose_allowlist, flags
from claude_bottle.gate.routes import CredentialRoute, RouteSpec, Scheme, new_sentinel
from claude_bottle.gate.settings import (
    Endpoint,
    Limits,
    parse_dlp,
    parse_egress_rules,
    parse_extra_api_paths,
    parse_listen,
    parse_networks,
    parse_upstream,
)
from claude_bottle.gate.upstream_proxy import UpstreamProxy
from claude_bottle.launch import Launch, run_spec
from claude_bottle.policy.hosts import Allowlist, parse_pattern
from claude_bottle.policy.mcp import parse_mcp_flag
from claude_bottle.policy.messages import SERVER_TOOL_FAMILIES
from claude_bottle.runtime.gate import gate_options
from claude_bottle.runtime.spec import API_PORT, PROXY_PORT
from tests.helpers import make_token

CASES = 300


def parsed(args: list[str], stdin: bytes, monkeypatch: pytest.MonkeyPatch) -> GateOptions:
    """What the ``gate`` command makes of ``args`` and ``stdin``: its click parser, then ``from_flags``."""
    context = gate_command.make_context("gate", list(args))
    monkeypatch.setattr("sys.stdin", io.StringIO(stdin.decode()))
    return GateOptions.from_flags(context.params)


def some(rng: random.Random, make: Any, most: int = 3) -> tuple[Any, ...]:
    return tuple(dict.fromkeys(make(i) for i in range(rng.randint(0, most))))


def generated(rng: random.Random) -> GateOptions:
    """Options with a random, valid value in every field (defaults among them, and empty tuples)."""
    def host(i: int) -> str:
        return rng.choice([f"h{i}.example.com", f"*.w{i}.example.org", f"h{i}.example.net:8443", f"10.0.0.{i + 1}",
                           f"[2001:db8::{i + 1}]:443"])

    rules = some(rng, lambda i: f"r{i}.example.com {rng.choice(['allow', 'deny'])} "
                                f"{rng.choice(['GET', 'POST', '*'])} /p{rng.randint(0, 9)}/**")
    opaque = some(rng, lambda i: f"o{i}.example.com")
    routes = tuple(CredentialRoute(RouteSpec(f"route{i}", ((f"c{i}.example.com", rng.choice([443, 8443])),),
                                             scheme := rng.choice(list(Scheme)),
                                             "user" if scheme is Scheme.BASIC else "", new_sentinel(f"route{i}")),
                                   "v" * 16 + make_token()[-rng.randint(1, 40):])
                   for i in range(rng.randint(0, 3)))
    number = rng.choice([None, 1, rng.randint(1, 100_000)])
    return GateOptions(  # each value parsed from the text its flag carries
        api_listen=parse_listen(rng.choice(["127.0.0.1:8080", "gate:8080", "[::1]:0", "10.89.0.2:8080"]), "api"),
        proxy_listen=parse_listen(rng.choice(["127.0.0.1:3128", "gate:3128", "[::1]:0"]), "proxy"),
        credential=Credential.parse(make_token(rng.choice(["oat", "api"])), "generated"),
        upstream=parse_upstream(rng.choice(["https://api.anthropic.com", "http://127.0.0.1:9",
                                            "https://llm.example.com/anthropic", "https://[2001:db8::1]:8443/"])),
        allow=Allowlist.parse(some(rng, host)),
        allow_tcp=Allowlist.parse(some(rng, lambda i: f"git{i}.example.com:22")),
        allow_private=parse_networks(some(rng, lambda i: rng.choice([f"10.{i}.0.0/16", f"fd{i:02x}::/16"]))),
        allow_api_path=parse_extra_api_paths(some(rng, lambda i: rng.choice([f"/v1/x{i}", f"GET /v1/y{i}"]))),
        allow_server_tool=some(rng, lambda i: rng.choice(sorted(SERVER_TOOL_FAMILIES))),
        request_policy=parse_egress_rules(rules, opaque),
        dlp=parse_dlp(some(rng, lambda i: f"extra{i} itk{i}_[a-z0-9]{{32}}"),
                      some(rng, lambda i: rng.choice(BUILTIN_NAMES))),
        routes=routes,
        mcp_servers=tuple(parse_mcp_flag(f"m{i} mcp{i}.example.com:{rng.choice([443, 8443])}"
                                         f"{rng.choice(['', ' tools=search_*,get_issue'])}"
                                         f"{rng.choice(['', ' deny_tools=delete_*'])}")
                          for i in range(rng.randint(0, 2))),
        upstream_proxy=rng.choice([None, UpstreamProxy.parse("http://proxy.corp:3128", "p"),
                                   UpstreamProxy.parse(f"http://u%40corp:pw{rng.randint(0, 9)}:x@[fd00::1]:8080", "p",
                                                       ",".join(some(rng, host)))]),
        extra_ca=some(rng, lambda i: Path(f"/opt/gate/upstream-ca/{i}.pem")),
        audit_log=rng.choice([None, "-", "/tmp/audit.jsonl"]),
        ca_cert_out=rng.choice([None, Path("/tmp/ca.pem")]),
        max_tunnels=number or Limits.max_tunnels,
        max_connections=rng.choice([Limits.max_connections, rng.randint(1, 1_000_000)]),
        idle_timeout=rng.choice([Limits.idle_timeout, rng.uniform(1, 86_400)]),
        drain_seconds=rng.choice([Limits.drain_seconds, 0.0, rng.uniform(0, 3600)]),
        learn=rng.random() < 0.5,
        ask=rng.random() < 0.5,
        ask_timeout=rng.choice([60.0, 1.0, rng.uniform(1, 600)]),
        ask_limit=rng.choice([16, 1, rng.randint(1, 1000)]),
        control_socket=rng.choice([None, Path("/tmp/claude-bottle-control.sock")]),
        exit_with_stdin=rng.random() < 0.5,
        stdin_heartbeat=rng.choice([0.0, 5.0, rng.uniform(0, 3600)]),
    )


def test_options_survive_the_command_line_and_standard_input(monkeypatch: pytest.MonkeyPatch) -> None:
    for seed in range(CASES):
        options = generated(random.Random(seed))
        assert parsed(options.args(), options.stdin(), monkeypatch) == options, f"seed {seed}"
        options.settings()  # and the one loader takes them


def test_secrets_go_on_standard_input_never_in_the_arguments() -> None:
    for seed in range(CASES):
        options = generated(random.Random(seed))
        argv = " ".join(options.args())
        proxy = options.upstream_proxy
        secrets = [options.credential.secret, *(route.secret for route in options.routes),
                   *([proxy.password] if proxy is not None and proxy.username else [])]
        assert not [secret for secret in secrets if secret in argv], f"seed {seed}"
        assert options.stdin().decode().splitlines() == secrets, f"seed {seed}"
        assert options.args()[options.args().index("--token-file") + 1] == "-"
        assert options.credential.secret not in repr(options)


def test_every_field_crosses(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each field, changed alone from a minimal value, changes what crosses and comes back changed: no field
    is left out of ``args``/``stdin`` or of the command."""
    rng = random.Random(7)
    base = GateOptions(api_listen=Endpoint("127.0.0.1", 1), proxy_listen=Endpoint("127.0.0.1", 2),
                       credential=Credential.parse(make_token(), "base"))
    fields = [item.name for item in dataclasses.fields(GateOptions)]
    changed = set()
    for _ in range(200):
        other = generated(rng)
        for name in fields:
            one = dataclasses.replace(base, **{name: getattr(other, name)})
            if one != base:
                assert (one.args(), one.stdin()) != (base.args(), base.stdin()), name
                assert parsed(one.args(), one.stdin(), monkeypatch) == one, name
                changed.add(name)
    assert changed == set(fields)


def test_the_command_has_a_flag_for_each_field_and_nothing_else() -> None:
    declared = {flag.name for _, flag, _ in flags()}
    context = click.Context(gate_command)
    offered = {option for param in gate_command.get_params(context) for option in param.opts
               if option.startswith("--")}
    assert offered - {"--help"} == declared
    assert {name for name, _, _ in flags()} == {item.name for item in dataclasses.fields(GateOptions)}


def test_the_runs_options_survive_the_command_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What the runtime builds from a full agent crosses as it is."""
    agent = parse_agent("a", tomllib.loads(
        'version = 1\nallow = ["x.example"]\nallow_tcp = ["git.example.com:22"]\nallow_private = ["10.0.0.0/8"]\n'
        'presets = ["npm-read"]\n[api]\nserver_tools = ["web_fetch"]\n'
        '[[egress]]\nhost = "api.example.com"\nallow = ["GET /v1/**"]\ndeny = ["GET /v1/admin"]\n'
        '[[egress]]\nhost = "pinned.example.com"\ninspect = false\n[[egress]]\nhost = "open.example.com"\n'
        '[dlp]\ndisable = ["jwt"]\n[dlp.rules]\nitk = "itk_[a-z0-9]{32}"\n'
        '[credentials.github]\nenv = "T"\n'), "a.toml")
    routes = tuple(CredentialRoute(c.spec(new_sentinel(c.name)), "v" * 40) for c in agent.credentials)
    launch = Launch(agent, tmp_path, Credential.parse(make_token(), "t"), routes=routes, learn=True)
    options = gate_options(run_spec(launch, "bottle", "gate", "1000:1000"))
    assert parsed(options.args(), options.stdin(), monkeypatch) == options
    assert options.settings().allowlist == agent.egress_allowlist


def test_the_allowlist_is_composed_once() -> None:
    policy = parse_egress_rules(["api.github.com allow GET /**"], ["pinned.example.net"])
    allowlist = compose_allowlist(Allowlist.parse(["x.example", "api.github.com"]).patterns, policy,
                                  [("github.com", 443), ("::1", 8443)], implied=[parse_pattern("mcp.example.com:8443")])
    assert allowlist.texts() == ("x.example", "api.github.com", "pinned.example.net", "mcp.example.com:8443",
                                 "github.com:443", "[::1]:8443")


def test_a_bad_value_is_named_by_its_flag_when_parsed(monkeypatch: pytest.MonkeyPatch) -> None:
    options = GateOptions(api_listen=Endpoint("127.0.0.1", 1), proxy_listen=Endpoint("127.0.0.1", 2),
                          credential=Credential.parse(make_token(), "t"))
    args, stdin = options.args(), options.stdin()
    with pytest.raises(ConfigError, match="--api-listen"):
        parsed([*args, "--api-listen", "0.0.0.0:1"], stdin, monkeypatch)
    with pytest.raises(ConfigError, match="--allow-tcp"):
        parsed([*args, "--allow-tcp", "*"], stdin, monkeypatch)
    with pytest.raises(ConfigError, match="--upstream"):
        parsed([*args, "--upstream", "ftp://x.example"], stdin, monkeypatch)
    with pytest.raises(ConfigError, match="--allow-private"):
        parsed([*args, "--allow-private", "10.0.0.1/8"], stdin, monkeypatch)


def test_the_runtime_hands_the_agents_parsed_values_over_as_they_are(tmp_path: Path) -> None:
    """No text between the agent's config and the gate's options: the same values, typed."""
    agent = parse_agent("a", {"version": 1, "allow": ["x.example"], "allow_tcp": ["git.example.com:22"],
                              "allow_private": ["10.0.0.0/8"], "upstream": "https://llm.example.com/v"}, "a.toml")
    spec = run_spec(Launch(agent, tmp_path, Credential.parse(make_token(), "t")), "b", "g",
                    "1000:1000")
    options = gate_options(spec, "10.89.0.2")
    assert (options.allow, options.allow_tcp, options.allow_private, options.upstream) == (
        spec.allow, spec.allow_tcp, spec.allow_private, spec.upstream)
    assert (options.api_listen, options.proxy_listen) == (Endpoint("10.89.0.2", API_PORT),
                                                          Endpoint("10.89.0.2", PROXY_PORT))


def test_the_upstream_proxys_password_crosses_on_standard_input_only(monkeypatch: pytest.MonkeyPatch) -> None:
    proxy = UpstreamProxy.parse("http://me:hunter2@proxy.corp:3128", "test", "localhost,.corp")
    options = GateOptions(api_listen=Endpoint("127.0.0.1", 1), proxy_listen=Endpoint("127.0.0.1", 2),
                          credential=Credential.parse(make_token(), "t"), upstream_proxy=proxy, exit_with_stdin=True)
    assert "hunter2" not in " ".join(options.args()) and "hunter2" not in repr(options)
    assert options.stdin().decode().splitlines()[-1] == "hunter2"
    back = parsed(options.args(), options.stdin(), monkeypatch)
    assert back.upstream_proxy == proxy and back.settings().upstream_proxy == proxy


@pytest.mark.parametrize(("flags_given", "words"), [
    (["--upstream-proxy", "http://me:hunter2@proxy:3128"], "password does not go in the arguments"),
    (["--upstream-proxy", "http://a:1", "--upstream-proxy", "http://b:2"], "more than once"),
    (["--upstream-no-proxy", "localhost"], "without --upstream-proxy"),
    (["--upstream-proxy", "socks5://proxy:1080"], "not an http:// proxy URL"),
])
def test_a_bad_upstream_proxy_flag_is_named(flags_given: list[str], words: str,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    options = GateOptions(api_listen=Endpoint("127.0.0.1", 1), proxy_listen=Endpoint("127.0.0.1", 2),
                          credential=Credential.parse(make_token(), "t"))
    with pytest.raises(ConfigError, match=words) as caught:
        parsed([*options.args(), *flags_given], options.stdin(), monkeypatch)
    assert "hunter2" not in str(caught.value)


def test_a_runs_upstream_proxy_reaches_its_gate_with_the_password_on_standard_input(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    agent = parse_agent("a", {"version": 1}, "a.toml")
    proxy = UpstreamProxy.parse("http://me:hunter2@proxy.corp:3128", "test", "localhost")
    launch = Launch(agent, tmp_path, Credential.parse(make_token(), "t"), upstream_proxy=proxy)
    options = gate_options(run_spec(launch, "bottle", "gate", "1000:1000"))
    assert "hunter2" not in " ".join(options.args())
    assert options.stdin().decode().splitlines()[-1] == "hunter2"
    assert parsed(options.args(), options.stdin(), monkeypatch).upstream_proxy == proxy


@pytest.mark.parametrize(("changes", "words"), [
    ({"ask": True, "learn": True}, "--ask and --learn"),
    ({"ask": True}, "--ask needs --control-socket"),
])
def test_ask_mode_refuses_options_that_would_not_make_it_work(changes: dict[str, object], words: str) -> None:
    options = GateOptions(api_listen=Endpoint("127.0.0.1", 1), proxy_listen=Endpoint("127.0.0.1", 2),
                          credential=Credential.parse(make_token(), "base"), **changes)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=words):
        options.check()
    dataclasses.replace(options, learn=False, control_socket=Path("/tmp/c.sock")).check()
