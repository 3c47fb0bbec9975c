"""[credentials.NAME]: parsed into routes with clear errors, values read from where the config says, and what
reaches the gate and the bottle (the value only on the gate's stdin, the sentinel in the bottle)."""

from __future__ import annotations

import itertools
import os
import re
import sys
import tomllib
from pathlib import Path

import keyring
import keyring.errors
import pytest

from claude_bottle import tokens
from claude_bottle.agent.credential_config import CredentialConfig
from claude_bottle.agent.schema import AgentConfig, parse_agent
from claude_bottle.credentials import Credential
from claude_bottle.errors import ConfigError, CredentialError
from claude_bottle.gate import settings as gc
from claude_bottle.gate.routes import CLIENT_CREDENTIAL_HEADERS, Scheme, is_client_credential, parse_route_flag
from claude_bottle.launch import Launch, run_spec
from claude_bottle.runtime.files import git_credentials
from claude_bottle.runtime.gate import gate_options
from claude_bottle.runtime.run import Run
from tests.fake_engine import FakeEngine
from tests.helpers import make_token

VALUE = "ghp_" + "V" * 36


def agent(body: str) -> AgentConfig:
    return parse_agent("a", tomllib.loads("version = 1\n" + body), "a.toml")


def test_a_preset_fills_in_hosts_scheme_and_the_bottles_places() -> None:
    parsed = agent('[credentials.github]\ncommand = ["gh", "auth", "token"]\n'
                   '[credentials.npm]\nenv = "NPM_TOKEN"\n[credentials.pypi]\n')
    github, npm, pypi = parsed.credentials
    assert github == CredentialConfig("github", (("github.com", 443), ("api.github.com", 443)), Scheme.BASIC,
                                      "x-access-token", "", ("gh", "auth", "token"), ("GH_TOKEN", "GITHUB_TOKEN"),
                                      True, "a.toml: credentials.github")
    assert npm.scheme is Scheme.BEARER and npm.env == "NPM_TOKEN"
    assert npm.bottle_env == ("npm_config_//registry.npmjs.org/:_authToken",)
    assert pypi.hosts == (("upload.pypi.org", 443),) and pypi.username == "__token__"
    assert {"github.com:443", "api.github.com:443", "registry.npmjs.org:443"} <= set(parsed.egress_allowlist.texts())


def test_a_custom_route_with_rules_becomes_egress_entries_of_its_hosts() -> None:
    parsed = agent('[credentials.git]\nhosts = ["git.internal.example:8443"]\nscheme = "basic"\nusername = "ci"\n'
                   'git = true\nallow = ["GET /**", "POST /team/app.git/git-receive-pack"]\n')
    (route,) = parsed.credentials
    assert route.hosts == (("git.internal.example", 8443),) and route.git
    decide = parsed.egress.decide
    assert decide("POST", "git.internal.example", 8443, "/team/app.git/git-receive-pack").allow
    assert not decide("POST", "git.internal.example", 8443, "/attacker/x.git/git-receive-pack").allow


@pytest.mark.parametrize("body, error", [
    ('[credentials.internal]\nenv = "X"\n', r"credentials\.internal\.hosts: is required"),
    ('[credentials.x]\nhosts = ["*.example.com"]\nscheme = "bearer"\n', r"credentials\.x\.hosts: .*exact hosts"),
    ('[credentials.x]\nhosts = ["a.example"]\nscheme = "digest"\n', r"credentials\.x\.scheme: 'digest' is not one"),
    ('[credentials.x]\nhosts = ["a.example"]\nscheme = "basic"\n', r"credentials\.x\.username: is required"),
    ('[credentials.x]\nhosts = ["a.example"]\nscheme = "bearer"\nusername = "u"\n', r"username: goes with"),
    ('[credentials.github]\nenv = "A"\ncommand = ["b"]\n', r"credentials\.github\.command: give env or command"),
    ('[credentials.github]\ntoken = "ghp_x"\n', r"credentials\.github\.token: unknown key"),
    ('[credentials.Bad]\n', r"credentials\.Bad: credential name"),
    ('[credentials.a]\nhosts = ["x.example"]\nscheme = "bearer"\n[credentials.b]\nhosts = ["x.example"]\n'
     'scheme = "bearer"\n', r"x\.example:443 is bound to both a and b"),
    ('[credentials.github]\n[[egress]]\nhost = "github.com"\ninspect = false\n',
     r"credentials\.github: github\.com:443 has an \[\[egress\]\] entry with inspect = false"),
    ('allow_tcp = ["github.com:443"]\n[credentials.github]\n', r"github\.com:443 is in allow_tcp"),
    ('[credentials.github]\nallow = ["GET /**"]\n[[egress]]\nhost = "github.com"\n', r"github\.com has an entry"),
])
def test_mistakes_are_named(body: str, error: str) -> None:
    with pytest.raises(ConfigError, match=error):
        agent(body)


def test_values_come_from_env_command_or_the_store(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    monkeypatch.setattr(keyring, "get_password", lambda *a: None)
    monkeypatch.setattr(keyring, "set_password", lambda *a: (_ for _ in ()).throw(
        keyring.errors.NoKeyringError()))
    config = CredentialConfig("github", (("github.com", 443),), Scheme.BASIC, "x-access-token", origin="a.toml")
    assert tokens.route_value(CredentialConfig(**{**config.__dict__, "env": "T"}), {"T": VALUE}) == VALUE
    with pytest.raises(CredentialError, match=r"\$T is not set"):
        tokens.route_value(CredentialConfig(**{**config.__dict__, "env": "T"}), {})
    command = (sys.executable, "-c", f"print('{VALUE}')")
    assert tokens.route_value(CredentialConfig(**{**config.__dict__, "command": command})) == VALUE
    failing = (sys.executable, "-c", "import sys; sys.exit('gh: not logged in')")
    with pytest.raises(CredentialError, match=r"failed \(exit 1\): gh: not logged in"):
        tokens.route_value(CredentialConfig(**{**config.__dict__, "command": failing}))
    with pytest.raises(CredentialError, match=r"claude-bottle login github"):
        tokens.route_value(config)
    where = tokens.store_route("github", VALUE + "\n")
    assert where == str(tmp_path / "claude-bottle" / "credentials" / "github")
    assert os.stat(where).st_mode & 0o777 == 0o600 and tokens.route_value(config) == VALUE
    os.chmod(where, 0o644)
    with pytest.raises(CredentialError, match="chmod 600"):
        tokens.route_value(config)
    with pytest.raises(CredentialError, match="16 to 4096"):
        tokens.store_route("github", "short")


def test_the_value_goes_to_the_gates_stdin_and_the_sentinel_to_the_bottle(tmp_path: Path) -> None:
    parsed = agent('[credentials.github]\nenv = "T"\n')
    routes = tuple(tokens.CredentialRoute(c.spec(tokens.new_sentinel(c.name)), VALUE) for c in parsed.credentials)
    spec = run_spec(Launch(parsed, tmp_path, Credential.parse(make_token(), "t"), routes=routes), "b", "g", "1:1")
    command, sentinel = gate_options(spec).args(), routes[0].spec.sentinel
    assert VALUE not in " ".join(command)
    flags = [v for k, v in itertools.pairwise(command) if k == "--credential-route"]
    assert [parse_route_flag(f) for f in flags] == [routes[0].spec]
    assert gate_options(spec).stdin() == f"{spec.credential.secret}\n{VALUE}\n".encode()
    run = Run(spec, FakeEngine())
    environment = run.bottle_environment()
    assert environment["GH_TOKEN"] == environment["GITHUB_TOKEN"] == sentinel
    assert VALUE not in repr(environment) and VALUE not in repr(spec) and VALUE not in repr(routes)
    helper = git_credentials(spec.git_routes).decode()
    assert '[credential "https://github.com"]' in helper and f"password={sentinel}" in helper and VALUE not in helper


def test_the_gate_reads_each_routes_value_after_the_token(monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    spec = parse_route_flag("github basic x-access-token claude-bottle-sentinel-github-0123456789abcdef github.com")
    token = make_token()
    monkeypatch.setattr(sys, "stdin", io.StringIO(f"{token}\n{VALUE}\n"))
    credential, (route,), _ = gc.read_secrets("-", (spec,))
    assert credential.secret == token and route.secret == VALUE and route.spec == spec
    monkeypatch.setattr(sys, "stdin", io.StringIO(f"{token}\n"))
    with pytest.raises(ConfigError, match=re.escape("expected the token, then one value per")):
        gc.read_secrets("-", (spec,))


def test_a_gate_bound_to_its_stdin_reads_only_the_secrets_lines(monkeypatch: pytest.MonkeyPatch) -> None:
    """``--exit-with-stdin``: the stream stays open after the secrets (what follows is not read as one)."""
    import io

    spec = parse_route_flag("github basic x-access-token claude-bottle-sentinel-github-0123456789abcdef github.com")
    token = make_token()
    stdin = io.StringIO(f"{token}\n{VALUE}\nmore\n")
    monkeypatch.setattr(sys, "stdin", stdin)
    credential, (route,), _ = gc.read_secrets("-", (spec,), to_end=False)
    assert credential.secret == token and route.secret == VALUE and stdin.read() == "more\n"
    stdin = io.StringIO(f"{token}\nmore\n")
    monkeypatch.setattr(sys, "stdin", stdin)
    assert gc.read_secrets("-", (), to_end=False) == (Credential.parse(token, "t"), (), "")
    assert stdin.read() == "more\n"
    monkeypatch.setattr(sys, "stdin", io.StringIO(f"{token}\n"))
    with pytest.raises(ConfigError, match=re.escape("expected the token, then one value per")):
        gc.read_secrets("-", (spec,), to_end=False)


def test_a_credential_header_is_known_in_every_spelling() -> None:
    """Any case, '_' for any '-': the names a server reading '_' as '-' takes for a credential header."""
    spelled = [b"X_Api_Key", b"x-API_key", b"PROXY_AUTHORIZATION", b"Private_Token", b"x_gitlab-TOKEN", b"Cookie"]
    assert all(is_client_credential(name) for name in spelled)
    others = [b"x-api-keys", b"x--api-key", b"xapi-key", b"cookie2", b"authorization_", b"x-api\x00key", b"set-cookie"]
    assert not any(is_client_credential(name) for name in others)
    for name in CLIENT_CREDENTIAL_HEADERS:
        for pattern in itertools.product((b"-", b"_"), repeat=name.count(b"-")):
            parts = name.split(b"-")
            variant = parts[0] + b"".join(sep + part for sep, part in zip(pattern, parts[1:], strict=True))
            assert is_client_credential(variant.upper()) and is_client_credential(variant), variant


def test_a_credentials_command_runs_in_the_home_folder_not_in_the_workspace_it_was_started_in(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """``start`` runs in a workspace, which bottles write: ``python -m keyring``, ``uv run`` or ``npx`` there
    would run what one left (a ``keyring.py``, a ``pyproject.toml``) on the host, at every start."""
    workspace, home = tmp_path / "project", tmp_path / "home"
    workspace.mkdir()
    home.mkdir()
    (workspace / "planted_value.py").write_text(f"print('{VALUE}')\n")  # what a bottle may leave behind
    monkeypatch.chdir(workspace)
    monkeypatch.setenv("HOME", str(home))
    config = CredentialConfig("github", (("github.com", 443),), Scheme.BASIC, "x-access-token", origin="a.toml",
                              command=(sys.executable, "-m", "planted_value"))
    with pytest.raises(CredentialError, match="No module named planted_value"):
        tokens.route_value(config)
