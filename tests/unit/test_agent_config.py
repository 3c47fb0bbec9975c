"""Agent configs: every key parsed, and every mistake named with its file and key."""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path

import pytest

from claude_bottle import trust
from claude_bottle.agent.load import load_agent
from claude_bottle.agent.presets import PRESETS
from claude_bottle.agent.project import read_project_file
from claude_bottle.agent.schema import AgentConfig, parse_agent
from claude_bottle.errors import ConfigError
from claude_bottle.gate.settings import Upstream, parse_upstream
from claude_bottle.policy.hosts import Allowlist

FULL = """
version = 1
allow = ["api.example.com", "*.internal.example.com:8443"]
presets = ["npm", "github"]
allow_tcp = ["git.example.com:22"]
allow_private = ["10.20.0.0/16"]
upstream = "https://llm.example.com/anthropic"
extra_packages = ["python3"]
[env]
NODE_ENV = "development"
[claude]
version = "2.1.126"
model = "claude-sonnet-4-5"
args = ["--verbose"]
[resources]
memory = "2g"
cpus = 1.5
pids = 256
[[mounts]]
source = "{data}"
target = "/data"
[[mounts]]
source = "{data}"
target = "/scratch"
mode = "rw"
[mcp.servers.files]
command = ["npx", "server-filesystem", "/workspace"]
[mcp.servers.docs]
url = "https://mcp.example.com/mcp"
[mcp.servers.tickets]
url = "http://Tickets.Example.com:8080/mcp?team=a"
[api]
server_tools = ["web_fetch", "code_execution"]
"""


def parse(text: str, tmp_path: Path) -> AgentConfig:
    import tomllib

    return parse_agent("a", tomllib.loads(text.replace("{data}", str(tmp_path))), "agent.toml")


def test_every_key_is_parsed(tmp_path: Path) -> None:
    agent = parse(FULL, tmp_path)
    assert agent.allow.texts()[:2] == ("api.example.com", "*.internal.example.com:8443")
    assert set(PRESETS["npm"] + PRESETS["github"]) <= set(agent.allow.texts())
    assert agent.allow_private == (ipaddress.ip_network("10.20.0.0/16"),)
    assert agent.allow_tcp.texts() == ("git.example.com:22",)
    assert agent.upstream == Upstream("https", "llm.example.com", 443, "/anthropic")
    assert str(agent.upstream) == "https://llm.example.com/anthropic"
    assert agent.env == {"NODE_ENV": "development"}
    assert (agent.claude_version, agent.model, agent.claude_args) == ("2.1.126", "claude-sonnet-4-5", ("--verbose",))
    assert (agent.resources.memory, agent.resources.cpus, agent.resources.pids) == ("2g", 1.5, 256)
    assert [(m.target, m.read_only) for m in agent.mounts] == [("/data", True), ("/scratch", False)]
    assert [s.name for s in agent.mcp_servers] == ["files", "docs", "tickets"]
    assert agent.egress_allowlist.texts()[-2:] == ("mcp.example.com", "tickets.example.com:8080"), \
        "a remote MCP server's host (and port, unless the default) joins the allowlist"
    assert agent.server_tools == ("web_fetch", "code_execution")
    assert agent.extra_packages == ("python3",)


@pytest.mark.parametrize("url", ["https://api.anthropic.com", "https://llm.example.com:8443/anthropic",
                                 "http://[fd00::1]:8000", "http://stub:8000/v1/base"])
def test_the_upstream_is_kept_parsed_and_written_back_as_the_gate_reads_it(tmp_path: Path, url: str) -> None:
    agent = parse(f'version = 1\nupstream = "{url}/"\n', tmp_path)
    assert str(agent.upstream) == url
    assert parse_upstream(str(agent.upstream)) == agent.upstream


def test_the_defaults_are_parsed_values_too() -> None:
    agent = AgentConfig()
    assert str(agent.upstream) == "https://api.anthropic.com" and agent.egress_allowlist == Allowlist()
    assert (agent.allow, agent.allow_tcp, agent.allow_private) == (Allowlist(), Allowlist(), ())


@pytest.mark.parametrize(("text", "words"), [
    ("allow = []", "version: must be 1"),
    ("version = 2", "version: must be 1"),
    ("version = 1\nallowed = []", "allowed: unknown key"),
    ('version = 1\nallow = "x.com"', "allow: must be a list of strings"),
    ('version = 1\nallow = ["*.com"]', "allow: allow pattern '*.com'"),
    ('version = 1\nallow_tcp = ["*:22"]', "allow_tcp: allow pattern '*:22' matches every host"),
    ('version = 1\nallow_tcp = ["ssh://git.example.com"]', "allow_tcp: allow pattern 'ssh://git.example.com'"),
    ('version = 1\nallow_tcp = "git.example.com:22"', "allow_tcp: must be a list of strings"),
    ('version = 1\npresets = ["maven"]', "presets: unknown preset 'maven'"),
    ('version = 1\nallow_private = ["10.0.0.1/8"]', "allow_private:"),
    ('version = 1\nupstream = "ftp://x"', "upstream:"),
    ('version = 1\n[env]\n"BAD-NAME" = "x"', "env.BAD-NAME:"),
    ('version = 1\n[env]\nX = 1', "env.X:"),
    ('version = 1\n[claude]\nversion = "newest"', "claude.version: 'newest' is not a Claude Code version"),
    ('version = 1\nruntime = "run sc"', "runtime: 'run sc' is not an OCI runtime name"),
    ('version = 1\nask_command = []', "ask_command: a command and its arguments"),
    ('version = 1\nask_command = "hook"', "ask_command: must be a list of strings"),
    ('version = 1\n[claude]\nmodle = "x"', "claude.modle: unknown key"),
    ('version = 1\n[resources]\nmemory = "lots"', "resources.memory:"),
    ('version = 1\n[resources]\ncpus = 0', "resources.cpus:"),
    ('version = 1\n[resources]\npids = 1', "resources.pids:"),
    ('version = 1\n[[mounts]]\nsource = "/nonexistent-path"\ntarget = "/data"', "mounts[0].source: /nonexistent-path does not exist"),
    ('version = 1\n[[mounts]]\nsource = "{data}"\ntarget = "/workspace"', "mounts[0].target:"),
    ('version = 1\n[[mounts]]\nsource = "{data}"\ntarget = "data"', "mounts[0].target:"),
    ('version = 1\n[[mounts]]\nsource = "{data}"\ntarget = "/d"\nmode = "w"', "mounts[0].mode:"),
    ('version = 1\n[mcp.servers.x]\ncommand = ["a"]\nurl = "https://x"', "mcp.servers.x.command: give either"),
    ('version = 1\n[mcp.servers.x]\nurl = "file:///etc/passwd"', "mcp.servers.x.url:"),
    ('version = 1\n[mcp.servers.x]\nurl = "https://user:pw@mcp.example.com/"', "mcp.servers.x.url: 'https://user:pw@mcp.example.com/' carries credentials"),
    ('version = 1\n[mcp.servers.x]\nurl = "https://token@mcp.example.com/"', "mcp.servers.x.url: 'https://token@mcp.example.com/' carries credentials"),
    ('version = 1\n[mcp.servers.x]\nurl = "https://*.example.com/mcp"', "mcp.servers.x.url: 'https://*.example.com/mcp': a wildcard"),
    ('version = 1\n[mcp.servers.x]\nurl = "https://mcp.example.com:0/"', "mcp.servers.x.url: 'https://mcp.example.com:0/': the port '0'"),
    ('version = 1\n[mcp.servers.x]\nurl = "https://mcp.example.com:99999/"', "mcp.servers.x.url:"),
    ('version = 1\n[mcp.servers.x]\nurl = "https://mcp.example.com:x/"', "mcp.servers.x.url:"),
    ('version = 1\n[mcp.servers.x]\nurl = "https://[::1/"', "mcp.servers.x.url: 'https://[::1/' is not a URL"),
    ('version = 1\n[mcp.servers.x]\nurl = "https://mcp..example.com/"', "is not a valid host name"),
    ('version = 1\n[mcp.servers.x]\nurl = "https://mcp.example.com/#frag"', "a fragment"),
    ('version = 1\n[mcp.servers.x]\nurl = "https:///mcp"', "is not an http(s) URL"),
    ('version = 1\n[api]\nserver_tools = ["web_fetch_20250910"]', "api.server_tools: 'web_fetch_20250910': name the family"),
    ('version = 1\n[api]\nserver_tools = ["browse"]', "api.server_tools: 'browse' is not a server tool (known: web_search"),
    ('version = 1\n[api]\nserver_tools = "web_fetch"', "api.server_tools: must be a list of strings"),
    ('version = 1\n[api]\nmcp_servers = true', "api.mcp_servers: unknown key"),
    ('version = 1\napi = 1', "api: must be a table"),
    ('version = 1\nextra_ca_certificates = ["/nonexistent.crt"]', "extra_ca_certificates: /nonexistent.crt does not exist"),
])
def test_mistakes_name_the_file_and_key(tmp_path: Path, text: str, words: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse(text, tmp_path)
    assert str(info.value).startswith("agent.toml: ")
    assert words in str(info.value)


def test_lookup_order_and_missing_agents(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    workspace = tmp_path / "project"
    workspace.mkdir()
    assert load_agent(None, workspace) == AgentConfig(), "no config at all: the defaults"
    (workspace / ".claude-bottle.toml").write_text('version = 1\nallow = ["project.example"]\n')
    trust.approve(workspace, read_project_file(workspace).digest)  # type: ignore[union-attr]
    assert load_agent(None, workspace).allow.texts() == ("project.example",)
    with pytest.raises(ConfigError, match=r"no agent 'ci'.*agents: none yet"):
        load_agent("ci", workspace)
    agents = tmp_path / "config/claude-bottle/agents"
    agents.mkdir(parents=True)
    (agents / "ci.toml").write_text('version = 1\nallow = ["ci.example"]\n')
    assert load_agent("ci", workspace).allow.texts() == ("ci.example",)
    (agents / "broken.toml").write_text("version = 1\nallow = [\n")
    with pytest.raises(ConfigError, match=r"broken\.toml: not valid TOML"):
        load_agent("broken", workspace)
    with pytest.raises(ConfigError, match="agent name"):
        load_agent("../etc", workspace)


@pytest.mark.parametrize(("url", "entry"), [
    ("https://mcp.example.com/mcp", "mcp.example.com"),
    ("https://MCP.Example.com.:443/mcp", "mcp.example.com"),
    ("http://mcp.example.com:80/", "mcp.example.com"),
    ("http://mcp.example.com:443/", "mcp.example.com:443"),
    ("https://mcp.example.com:8443/a/b?c=d", "mcp.example.com:8443"),
    ("https://[2001:db8::1]:8443/mcp", "[2001:db8::1]:8443"),
    ("https://bücher.example/mcp", "xn--bcher-kva.example"),
])
def test_a_remote_mcp_server_joins_the_allowlist_as_host_and_port(tmp_path: Path, url: str, entry: str) -> None:
    agent = parse(f'version = 1\n[mcp.servers.x]\nurl = "{url}"\n', tmp_path)
    assert agent.egress_allowlist.texts() == (entry,)


EGRESS = """
version = 1
allow = ["registry.npmjs.org"]
presets = ["github-read"]
[[egress]]
host = "api.example.com"
allow = ["GET /v1/**", "HEAD /**"]
deny = ["* /v1/admin/**"]
[[egress]]
host = "pinned.example.com:8443"
inspect = false
[[egress]]
host = "*.internal.example.com"
[dlp]
disable = ["jwt"]
[dlp.rules]
internal-token = "itk_[a-z0-9]{32}"
"""


def test_egress_entries_and_dlp_are_parsed_once_into_policies(tmp_path: Path) -> None:
    from claude_bottle.policy.hosts import Target

    agent = parse(EGRESS, tmp_path)
    policy = agent.egress
    assert [str(e.host) for e in policy.hosts] == [
        "github.com", "api.github.com", "codeload.github.com", "raw.githubusercontent.com",
        "objects.githubusercontent.com", "api.example.com", "pinned.example.com:8443", "*.internal.example.com"]
    # every entry's host joins the allowlist
    assert agent.egress_allowlist.texts() == ("registry.npmjs.org", *(str(e.host) for e in policy.hosts))
    assert policy.decide("GET", "api.example.com", 443, "/v1/things").allow
    assert not policy.decide("GET", "api.example.com", 443, "/v1/admin/users").allow
    assert not policy.decide("POST", "api.example.com", 443, "/v1/things").allow
    assert not policy.inspects(Target("pinned.example.com", 8443))
    assert policy.decide("DELETE", "x.internal.example.com", 443, "/").allow
    assert "jwt" in agent.dlp.disabled and [r.name for r in agent.dlp.extra] == ["internal-token"]


@pytest.mark.parametrize(("method", "host", "path", "allow"), [
    ("GET", "github.com", "/o/r.git/info/refs?service=git-upload-pack", True),
    ("POST", "github.com", "/o/r.git/git-upload-pack", True),
    ("POST", "github.com", "/o/r.git/git-receive-pack", False),
    ("GET", "github.com", "/o/r/archive/refs/heads/main.zip", True),
    ("POST", "github.com", "/o/r.git/info/lfs/objects/batch", False),
    ("GET", "api.github.com", "/repos/o/r/pulls", True),
    ("HEAD", "api.github.com", "/", True),
    ("POST", "api.github.com", "/repos/o/r/issues", False),
    ("PATCH", "api.github.com", "/repos/o/r", False),
    ("DELETE", "api.github.com", "/repos/o/r", False),
    ("PUT", "api.github.com", "/repos/o/r/contents/x", False),
    ("POST", "api.github.com", "/graphql", False),
    ("POST", "api.github.com", "/gists", False),
    ("GET", "codeload.github.com", "/o/r/tar.gz/refs/heads/main", True),
    ("GET", "raw.githubusercontent.com", "/o/r/main/README.md", True),
    ("PUT", "objects.githubusercontent.com", "/x", False),
    ("GET", "registry.npmjs.org", "/@types%2fnode", True),
    ("GET", "registry.npmjs.org", "/left-pad/-/left-pad-1.3.0.tgz", True),
    ("POST", "registry.npmjs.org", "/-/npm/v1/security/advisories/bulk", True),
    ("PUT", "registry.npmjs.org", "/left-pad", False),
    ("PUT", "registry.npmjs.org", "/@scope%2fpkg", False),
    ("DELETE", "registry.npmjs.org", "/-/user/token/x", False),
    ("POST", "registry.npmjs.org", "/-/v1/login", False),
    ("GET", "pypi.org", "/simple/requests/", True),
    ("GET", "pypi.org", "/pypi/requests/json", True),
    ("POST", "pypi.org", "/pypi", False),
    ("POST", "pypi.org", "/legacy/", False),
    ("GET", "files.pythonhosted.org", "/packages/ab/cd/requests-2.32.0-py3-none-any.whl", True),
])
def test_read_presets_fetch_and_install_but_never_write(method: str, host: str, path: str, allow: bool,
                                                       tmp_path: Path) -> None:
    agent = parse('version = 1\npresets = ["github-read", "npm-read", "pypi-read"]\n', tmp_path)
    decision = agent.egress.decide(method, host, 443, path)
    assert decision.allow is allow, decision.reason
    assert "presets" not in decision.reason and "[[egress]]" in decision.reason


@pytest.mark.parametrize(("body", "message"), [
    ('egress = "x"', "egress: must be a list of tables"),
    ("egress = [1]", "egress[0]: must be a table"),
    ('[[egress]]\nallow = ["GET /**"]', "egress[0].host: is required"),
    ('[[egress]]\nhost = "*"', "egress[0].host: allow pattern '*' matches every host"),
    ('[[egress]]\nhost = "https://x.example.com/"', "egress[0].host: allow pattern .* give a host, not a URL"),
    ('[[egress]]\nhost = "x.example.com"\nallow = ["get /**"]', "egress[0].allow: rule 'get /**': .* write GET"),
    ('[[egress]]\nhost = "x.example.com"\ndeny = ["POST gists"]', "egress[0].deny: rule 'POST gists': path 'gists' must start"),
    ('[[egress]]\nhost = "x.example.com"\nallow = "GET /**"', "egress[0].allow: must be a list of strings"),
    ('[[egress]]\nhost = "x.example.com"\ninspect = "no"', "egress[0].inspect: must be true or false"),
    ('[[egress]]\nhost = "x.example.com"\ninspect = false\nallow = ["GET /**"]', "egress[0].inspect: false, yet"),
    ('[[egress]]\nhost = "x.example.com"\nmethods = ["GET"]', "egress[0].methods: unknown key"),
    ('[[egress]]\nhost = "x.example.com"\n[[egress]]\nhost = "X.example.com."', "egress[1]: x.example.com has an entry already (egress[0])"),
    ('presets = ["github-read"]\n[[egress]]\nhost = "api.github.com"', "egress[0]: api.github.com has an entry already (presets: github-read)"),
    ('presets = ["github-write"]', "presets: unknown preset 'github-write' .*github-read"),
    ('[dlp]\ndisable = ["aws"]', "dlp.disable: 'aws' is not a built-in DLP rule"),
    ('[dlp]\ndisable = ["held-secret"]', "dlp.disable: .*always refused"),
    ('[dlp]\nrules = ["x"]', "dlp.rules: must be a table"),
    ('[dlp.rules]\nx = 1', "dlp.rules.x: must be a regular expression in a string"),
    ('[dlp.rules]\ntok = "tok_[a-z]+"', "dlp.rules.tok: rule tok: .* bound every repetition"),
    ('[dlp.rules]\nTok = "tok_[a-z]{20}"', "dlp.rules.Tok: rule name 'Tok'"),
    ('[dlp]\nallow = []', "dlp.allow: unknown key"),
])
def test_egress_and_dlp_mistakes_name_the_file_and_key(body: str, message: str, tmp_path: Path) -> None:
    """``message``: literal text, with ``.*`` where anything may come between."""
    with pytest.raises(ConfigError) as caught:
        parse("version = 1\n" + body, tmp_path)
    assert re.match(".*".join(map(re.escape, ("agent.toml: " + message).split(".*"))), str(caught.value)), caught.value


def test_runtime_and_latest_are_kept(tmp_path: Path) -> None:
    agent = parse_agent("g", {"version": 1, "runtime": "runsc", "claude": {"version": "latest"}}, "g.toml")
    assert (agent.runtime, agent.claude_version) == ("runsc", "latest")
    assert parse_agent("d", {"version": 1}, "d.toml").runtime == ""


def test_ask_command_is_kept() -> None:
    agent = parse_agent("h", {"version": 1, "ask_command": ["/opt/hook", "--strict"]}, "h.toml")
    assert agent.ask_command == ("/opt/hook", "--strict")
    assert parse_agent("d", {"version": 1}, "d.toml").ask_command == ()
