"""Agents: named TOML configs, parsed once into frozen, validated values.

- ``<config dir>/agents/NAME.toml``: user-level agents (``claude-bottle start NAME``).
- ``.claude-bottle.toml`` in the workspace: the project's default agent (``claude-bottle start``). A
  repository (or a bottle) may have written it, so it is used only once the user approved exactly these bytes
  (``claude-bottle trust``), and never sets what ``PROJECT_FORBIDDEN`` lists.
- Neither: built-in defaults. Every error names the file, the key, what was wrong and how to fix it.
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import stat
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from claude_bottle import trust
from claude_bottle.errors import ConfigError
from claude_bottle.gate.dlp import DlpPolicy, DlpRule, InvalidDlpRule, parse_builtin_name, parse_dlp_rule
from claude_bottle.gate.routes import (
    InvalidRoute,
    RouteSpec,
    Scheme,
    check_name,
    check_routes,
    check_username,
    parse_bound_host,
)
from claude_bottle.gate.settings import DEFAULT_UPSTREAM, parse_upstream
from claude_bottle.paths import config_dir, state_dir
from claude_bottle.policy.addresses import parse_network
from claude_bottle.policy.hosts import Allowlist, InvalidHost, Target, normalize_host, parse_pattern, parse_port
from claude_bottle.policy.messages import InvalidServerTool, parse_server_tool
from claude_bottle.policy.rules import HostRules, InvalidRule, RequestPolicy, Verdict, make_host_rules, parse_rule
from claude_bottle.runtime.images import DEFAULT_CLAUDE_CODE_VERSION, LATEST

CONFIG_VERSION = 1
PROJECT_FILE = ".claude-bottle.toml"
PROJECT_FILE_LIMIT = 256 * 1024
# What a repository must not choose, even once the user approved its project file without reading it: where
# the credential goes, host paths in the bottle, the address guard, and whom TLS trusts.
PROJECT_FORBIDDEN = {
    "upstream": "it decides where your credential is sent",
    "mounts": "it puts paths of your machine into the bottle",
    "allow_private": "it opens private networks to the bottle",
    "extra_ca_certificates": "it decides whom TLS connections trust",
    "credentials": "it decides which of your credentials go where, and may run commands on your machine",
    "runtime": "it chooses the kernel boundary between the bottle and your machine",
}
DEFAULT_AGENT = "default"
PRESETS: dict[str, tuple[str, ...]] = {
    "npm": ("registry.npmjs.org",),
    "pypi": ("pypi.org", "files.pythonhosted.org"),
    "github": ("github.com", "api.github.com", "codeload.github.com", "raw.githubusercontent.com",
               "objects.githubusercontent.com"),
}
# Read-only variants: the same hosts, inspected, with rules that let a bottle fetch, clone and install but
# not push, publish or write through an API (docs/agents.md lists the rules).
_READ = ("GET /**", "HEAD /**")
READ_PRESETS: dict[str, tuple[HostRules, ...]] = {
    "github-read": (
        make_host_rules("github.com", allow=[*_READ, "POST /*/*/git-upload-pack"]),
        *(make_host_rules(host, allow=_READ) for host in PRESETS["github"] if host != "github.com"),
    ),
    "npm-read": (
        make_host_rules("registry.npmjs.org", allow=[*_READ, "POST /-/npm/v1/security/advisories/bulk",
                                                     "POST /-/npm/v1/security/audits/quick"]),
    ),
    "pypi-read": tuple(make_host_rules(host, allow=_READ) for host in PRESETS["pypi"]),
}
# What a project file may not turn off, even once approved: inspection of a host, and DLP rules.
PROJECT_FORBIDDEN_WEAKER = {
    "egress[N].inspect = false": "it lets requests to that host pass unseen: no rules, no DLP",
    "dlp.disable": "it turns off checks that stop credentials leaving",
}
_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,39}")
_VARIABLE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# What a bottle's tools read a credential from may be more than a variable name (npm's per-registry keys).
_BOTTLE_VARIABLE = re.compile(r"[A-Za-z_][A-Za-z0-9_./:-]{0,200}")


@dataclass(frozen=True)
class CredentialPreset:
    hosts: tuple[str, ...]
    scheme: Scheme
    username: str = ""
    bottle_env: tuple[str, ...] = ()
    git: bool = False


# [credentials.NAME] with one of these names: the hosts, how the value is sent, and where the bottle finds its
# sentinel (docs/credentials.md has a section for each).
CREDENTIAL_PRESETS = {
    "github": CredentialPreset(("github.com", "api.github.com"), Scheme.BASIC, "x-access-token",
                               ("GH_TOKEN", "GITHUB_TOKEN"), git=True),
    "npm": CredentialPreset(("registry.npmjs.org",), Scheme.BEARER,
                            bottle_env=("npm_config_//registry.npmjs.org/:_authToken",)),
    "pypi": CredentialPreset(("upload.pypi.org",), Scheme.BASIC, "__token__", ("TWINE_PASSWORD",)),
}
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


_RUNTIME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_MEMORY = re.compile(r"\d+[kmg]?", re.IGNORECASE)


@dataclass(frozen=True)
class Mount:
    source: Path  # checked: a real file or folder, its path free of symlinks, nothing the bottle must not reach
    target: str
    read_only: bool
    origin: str = ""  # "FILE: mounts[N].source", for messages


@dataclass(frozen=True)
class McpServer:
    """A stdio server (``command``) runs inside the bottle; a remote one (``url``) is reached through the
    gate, and ``allow_entry`` (its host, with the port when not the scheme's default) joins the allowlist."""

    name: str
    command: tuple[str, ...] = ()
    url: str = ""
    allow_entry: str = ""


@dataclass(frozen=True)
class Resources:
    """A bottle's limits: memory (Docker's notation, e.g. 4g), CPUs and processes."""

    memory: str = "4g"
    cpus: float = 2.0
    pids: int = 1024


@dataclass(frozen=True)
class AgentConfig:
    name: str = DEFAULT_AGENT
    allow: tuple[str, ...] = ()
    allow_tcp: tuple[str, ...] = ()  # HOST:PORT whose tunnels may carry any TCP, not only TLS (e.g. SSH)
    allow_private: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    mounts: tuple[Mount, ...] = ()
    resources: Resources = Resources()
    claude_version: str = DEFAULT_CLAUDE_CODE_VERSION
    claude_args: tuple[str, ...] = ()
    model: str = ""
    extra_ca_certificates: tuple[Path, ...] = ()
    extra_packages: tuple[str, ...] = ()
    mcp_servers: tuple[McpServer, ...] = ()
    server_tools: tuple[str, ...] = ()  # [api] server_tools: provider-side tool families the gate lets through
    egress: RequestPolicy = RequestPolicy()  # [[egress]] entries and the read-only presets' entries
    dlp: DlpPolicy = DlpPolicy()  # [dlp]: extra rules, built-in rules turned off
    upstream: str = DEFAULT_UPSTREAM
    credentials: tuple[CredentialConfig, ...] = ()  # [credentials.NAME]: routes beyond Anthropic
    runtime: str = ""  # the bottle's OCI runtime (e.g. runsc for gVisor); empty: the engine's default
    sources: tuple[str, ...] = ()  # the files this came from, for messages

    @property
    def egress_allowlist(self) -> tuple[str, ...]:
        """The allowlist the gate enforces: listed hosts, the hosts of ``[[egress]]`` entries, of remote MCP
        servers and of credential routes."""
        remote = tuple(s.allow_entry for s in self.mcp_servers if s.allow_entry)
        egress = tuple(str(pattern) for pattern in self.egress.patterns)
        bound = tuple(f"{host}:{port}" for c in self.credentials for host, port in c.hosts)
        return tuple(dict.fromkeys(self.allow + egress + remote + bound))


def agents_dir() -> Path:
    return config_dir() / "agents"


def known_agents() -> list[str]:
    return sorted(p.stem for p in agents_dir().glob("*.toml"))


def load_agent(name: str | None, workspace: Path) -> AgentConfig:
    """The agent ``name`` (user-level), or with no name the project's file, else the defaults."""
    if name is not None:
        if not _NAME.fullmatch(name):
            raise ConfigError(f"agent name {name!r}: use lower-case letters, digits, '-' and '_'")
        path = agents_dir() / f"{name}.toml"
        if not path.exists():
            known = ", ".join(known_agents()) or "none yet"
            raise ConfigError(f"no agent {name!r}: create {path} (agents: {known}); see docs/agents.md")
        return parse_agent(name, _read(path), str(path))
    project = read_project_file(workspace)
    if project is None:
        return AgentConfig()
    agent = project.agent()
    approved = trust.approved_digest(workspace)
    if approved != project.digest:
        state = "changed since you approved it" if approved else "not approved"
        raise ConfigError(f"{project.path} is {state}: a project file widens what the bottle may reach; review it "
                          f"with `{trust.trust_command(workspace)}`, which asks before it approves")
    return agent


@dataclass(frozen=True)
class ProjectFile:
    """A workspace's ``.claude-bottle.toml`` as read once: its bytes, their SHA-256 and what they parse to."""

    path: Path
    text: str
    digest: str
    data: dict[str, Any]

    def agent(self) -> AgentConfig:
        """The project's agent; keys a repository must not choose are refused (``PROJECT_FORBIDDEN``)."""
        for key in PROJECT_FORBIDDEN:
            if key in self.data:
                raise ConfigError(
                    f"{self.path}: {key}: not allowed in a project file ({PROJECT_FORBIDDEN[key]}); put it in an "
                    f"agent of your own under {agents_dir()} and start that agent by name")
        agent = parse_agent(DEFAULT_AGENT, self.data, str(self.path))
        weaker = [f"egress[{i}].inspect" for i, entry in enumerate(self.data.get("egress", []))
                  if entry.get("inspect") is False] + (["dlp.disable"] if agent.dlp.disabled else [])
        if weaker:
            why = PROJECT_FORBIDDEN_WEAKER["dlp.disable" if weaker[0] == "dlp.disable" else "egress[N].inspect = false"]
            raise ConfigError(
                f"{self.path}: {weaker[0]}: not allowed in a project file ({why}); put it in an agent of your own "
                f"under {agents_dir()} and start that agent by name")
        return agent


# What each key a project file may set does, for `claude-bottle trust`.
PROJECT_EFFECTS = {
    "allow": "hosts the bottle may reach",
    "presets": "registries the bottle may reach (the -read ones: with method and path rules)",
    "egress": "hosts the bottle may reach, with method and path rules",
    "dlp": "extra DLP rules: more requests refused",
    "mcp": "MCP servers (a remote one's host joins the allowlist)",
    "env": "environment variables in the bottle",
    "extra_packages": "Debian packages in the bottle image",
    "claude": "Claude Code's version, model and arguments",
    "resources": "the bottle's memory, CPU and process limits",
}


def project_summary(project: ProjectFile) -> list[str]:
    """One line per key the project file sets, with what it changes; raises like ``ProjectFile.agent``."""
    agent = project.agent()
    lines = [f"{key}: {PROJECT_EFFECTS[key]}" for key in project.data if key in PROJECT_EFFECTS]
    if agent.egress_allowlist:
        lines.append(f"the bottle may then reach, besides the Anthropic API: {', '.join(agent.egress_allowlist)}")
    return lines


def read_project_file(workspace: Path) -> ProjectFile | None:
    """The workspace's project file, or None. It is opened without following a symlink and must be a regular
    file; the bytes hashed are the bytes parsed, so what was approved is what runs."""
    path = workspace / PROJECT_FILE
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ConfigError(f"{path} is a symlink: a project file must be a regular file in the workspace "
                              "(a symlink could point anywhere); replace it with the file itself") from None
        raise ConfigError(f"{path}: cannot read ({exc.strerror})") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ConfigError(f"{path} is not a regular file; remove it or replace it with a TOML file")
        raw = b""
        while len(raw) <= PROJECT_FILE_LIMIT and (chunk := os.read(fd, PROJECT_FILE_LIMIT + 1 - len(raw))):
            raw += chunk
    finally:
        os.close(fd)
    if len(raw) > PROJECT_FILE_LIMIT:
        raise ConfigError(f"{path}: larger than {PROJECT_FILE_LIMIT} bytes; a project file is a short TOML file")
    try:
        text = raw.decode("utf-8")
        data = tomllib.loads(text)
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{path}: not valid TOML ({exc})") from None
    return ProjectFile(path, text, hashlib.sha256(raw).hexdigest(), data)


def _read(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as f:
            return tomllib.load(f)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML ({exc})") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read ({exc.strerror})") from None


class _Fields:
    """Typed access to one table, with errors naming the file and key."""

    def __init__(self, data: dict[str, Any], source: str, prefix: str = "") -> None:
        self.data, self.source, self.prefix = data, source, prefix

    def fail(self, key: str, problem: str) -> ConfigError:
        return ConfigError(f"{self.source}: {self.prefix}{key}: {problem}")

    def check_keys(self, allowed: set[str]) -> None:
        for key in self.data:
            if key not in allowed:
                raise self.fail(key, f"unknown key (known: {', '.join(sorted(allowed))})")

    def strings(self, key: str) -> tuple[str, ...]:
        value = self.data.get(key, [])
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise self.fail(key, 'must be a list of strings, like ["a", "b"]')
        return tuple(value)

    def string(self, key: str, default: str = "") -> str:
        value = self.data.get(key, default)
        if not isinstance(value, str):
            raise self.fail(key, "must be a string")
        return value

    def table(self, key: str) -> dict[str, Any]:
        value = self.data.get(key, {})
        if not isinstance(value, dict):
            raise self.fail(key, f"must be a table ([{self.prefix}{key}])")
        return value


def parse_agent(name: str, data: dict[str, Any], source: str) -> AgentConfig:
    top = _Fields(data, source)
    top.check_keys({"version", "allow", "allow_tcp", "presets", "allow_private", "env", "mounts", "resources",
                    "claude", "extra_ca_certificates", "extra_packages", "mcp", "upstream", "api", "egress", "dlp",
                    "credentials", "runtime"})
    if data.get("version") != CONFIG_VERSION:
        raise top.fail("version", f"must be {CONFIG_VERSION} (add `version = {CONFIG_VERSION}` at the top)")

    allow = list(top.strings("allow"))
    read_entries: list[tuple[str, HostRules]] = []
    for preset in top.strings("presets"):
        if preset in READ_PRESETS:
            read_entries.extend((f"presets: {preset}", entry) for entry in READ_PRESETS[preset])
        elif preset in PRESETS:
            allow.extend(PRESETS[preset])
        else:
            raise top.fail("presets", f"unknown preset {preset!r} (known: {', '.join([*PRESETS, *READ_PRESETS])})")
    _check_patterns(top, "allow", allow)
    allow_tcp = top.strings("allow_tcp")
    _check_patterns(top, "allow_tcp", allow_tcp)
    allow_private = top.strings("allow_private")
    for cidr in allow_private:
        try:
            parse_network(cidr)
        except ValueError as exc:
            raise top.fail("allow_private", str(exc)) from None

    env = top.table("env")
    for key, value in env.items():
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key) or not isinstance(value, str):
            raise top.fail(f"env.{key}", "variables need a NAME of letters, digits and '_' and a string value")

    upstream = top.string("upstream", DEFAULT_UPSTREAM)
    try:
        parse_upstream(upstream)
    except ConfigError as exc:
        raise top.fail("upstream", str(exc)) from None

    credentials = _credentials(_Fields(top.table("credentials"), source, "credentials."))
    read_entries.extend((f"credentials.{c.name}", entry) for c, entry in credentials if entry is not None)
    claude = _Fields(top.table("claude"), source, "claude.")
    claude.check_keys({"version", "args", "model"})
    version = claude.string("version", DEFAULT_CLAUDE_CODE_VERSION)
    if version != LATEST and not re.fullmatch(r"\d+\.\d+\.\d+", version):
        raise claude.fail("version", f"{version!r} is not a Claude Code version such as {DEFAULT_CLAUDE_CODE_VERSION} "
                                     f"or {LATEST!r} (the newest release, resolved at build time)")
    runtime = top.string("runtime")
    if runtime:
        check_runtime_name(runtime, top.fail)

    agent = AgentConfig(
        name=name,
        allow=tuple(dict.fromkeys(allow)),
        allow_tcp=tuple(dict.fromkeys(allow_tcp)),
        allow_private=allow_private,
        env=dict(env),
        mounts=_mounts(data.get("mounts", []), top),
        resources=_resources(_Fields(top.table("resources"), source, "resources.")),
        claude_version=version,
        claude_args=claude.strings("args"),
        model=claude.string("model"),
        extra_ca_certificates=tuple(_existing(Path(p).expanduser(), top, "extra_ca_certificates")
                                    for p in top.strings("extra_ca_certificates")),
        extra_packages=top.strings("extra_packages"),
        mcp_servers=_mcp(_Fields(top.table("mcp"), source, "mcp.")),
        server_tools=_api(_Fields(top.table("api"), source, "api.")),
        egress=_egress(data.get("egress", []), top, read_entries),
        dlp=_dlp(_Fields(top.table("dlp"), source, "dlp.")),
        upstream=upstream,
        credentials=tuple(c for c, _ in credentials),
        runtime=runtime,
        sources=(source,),
    )
    _check_bound_hosts(agent)
    return agent


def _check_patterns(fields: _Fields, key: str, patterns: list[str] | tuple[str, ...]) -> None:
    """Host patterns as the allowlist reads them; the first bad one is an error naming ``key``."""
    for pattern in patterns:
        try:
            parse_pattern(pattern)
        except InvalidHost as exc:
            raise fields.fail(key, str(exc)) from None


def check_runtime_name(runtime: str, fail: Callable[[str, str], ConfigError]) -> str:
    """An OCI runtime's name as engines register it (runsc, runc, crun, kata-runtime)."""
    if not _RUNTIME.fullmatch(runtime):
        raise fail("runtime", f"{runtime!r} is not an OCI runtime name such as runsc (gVisor) or runc")
    return runtime


def _existing(path: Path, fields: _Fields, key: str) -> Path:
    if not path.exists():
        raise fields.fail(key, f"{path} does not exist")
    return path


def _mounts(value: Any, top: _Fields) -> tuple[Mount, ...]:
    if not isinstance(value, list):
        raise top.fail("mounts", 'must be a list of tables: [[mounts]] source = "~/data" target = "/data"')
    mounts = []
    for i, entry in enumerate(value):
        fields = _Fields(entry if isinstance(entry, dict) else {}, top.source, f"mounts[{i}].")
        fields.check_keys({"source", "target", "mode"})
        source = _mount_source(fields.string("source"), fields)
        target = fields.string("target")
        if not target.startswith("/") or target in ("/", "/workspace") or ".." in target.split("/"):
            raise fields.fail("target", f"{target!r} must be an absolute path other than / and /workspace")
        mode = fields.string("mode", "ro")
        if mode not in ("ro", "rw"):
            raise fields.fail("mode", f"{mode!r} must be 'ro' or 'rw'")
        mounts.append(Mount(source, target, mode == "ro", f"{top.source}: mounts[{i}].source"))
    return tuple(mounts)


def engine_paths() -> tuple[Path, ...]:
    """Where a Docker engine may listen on this host, and the Docker client's folder (its credentials): a
    bottle that reached one would own the host."""
    paths = [Path("/var/run/docker.sock"), Path("/run/docker.sock"), Path.home() / ".docker"]
    host = os.environ.get("DOCKER_HOST", "")
    if host.startswith("unix://"):
        paths.append(Path(host.removeprefix("unix://")))
    if os.environ.get("XDG_RUNTIME_DIR"):
        paths.append(Path(os.environ["XDG_RUNTIME_DIR"], "docker.sock"))
    return tuple(paths)


def _relation(source: Path, protected: Path) -> str:
    """How ``source`` touches ``protected`` ("is", "contains", "lies under"), or "" if it does not."""
    protected = Path(os.path.realpath(protected))
    if source == protected:
        return "is"
    return "contains" if protected.is_relative_to(source) else "lies under" if source.is_relative_to(protected) else ""


_KINDS = {stat.S_IFSOCK: "socket", stat.S_IFCHR: "character device", stat.S_IFBLK: "block device",
          stat.S_IFIFO: "named pipe"}


def _mount_source(written: str, fields: _Fields) -> Path:
    """A mount source exactly as it will be mounted: an existing regular file or folder, named by its real
    path (a symlink anywhere on the way could be pointed elsewhere later), and none of the engine's socket,
    the Docker client's folder, or claude-bottle's own config and state (the token file, the runs' audit)."""
    path = Path(os.path.expanduser(written))
    if not path.is_absolute():
        raise fields.fail("source", f"{written!r} must be an absolute path or start with ~")
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        raise fields.fail("source", f"{path} does not exist") from None
    except OSError as exc:
        raise fields.fail("source", f"{path}: cannot be read ({exc.strerror})") from None
    if stat.S_ISLNK(info.st_mode):
        raise fields.fail("source", f"{path} is a symlink (to {os.path.realpath(path)}); name the real file or "
                                    "folder, as long as nothing below forbids it")
    if not (stat.S_ISREG(info.st_mode) or stat.S_ISDIR(info.st_mode)):
        kind = _KINDS.get(stat.S_IFMT(info.st_mode), "special file")
        raise fields.fail("source", f"{path} is a {kind}: only regular files and folders can be mounted")
    resolved = Path(os.path.realpath(path))
    if resolved != path:
        raise fields.fail("source", f"{path} resolves to {resolved} (through a symlink or '..' on the way); "
                                    "write the real path")
    forbidden = [(p, "the Docker engine's socket or client folder") for p in engine_paths()] + \
        [(config_dir(), "claude-bottle's config folder (the token file, the agents)"),
         (state_dir(), "claude-bottle's state folder (the runs' audit)")]
    for protected, what in forbidden:
        if relation := _relation(resolved, protected):
            raise fields.fail("source", f"{path} {relation} {what}, {protected}: a bottle must never reach it; "
                                        "mount a folder of its own instead")
    return resolved


def check_mounts(agent: AgentConfig, workspace: Path) -> None:
    """No mount may reach the workspace: it is at /workspace already, with its .git protections, which a
    second, writable view of it (or of a folder around it) would bypass."""
    for mount in agent.mounts:
        if relation := _relation(mount.source, workspace):
            raise ConfigError(f"{mount.origin}: {mount.source} {relation} the workspace {workspace}, which the "
                              "bottle has at /workspace already; mount another folder")


def _resources(fields: _Fields) -> Resources:
    fields.check_keys({"memory", "cpus", "pids"})
    default = Resources()
    memory = fields.string("memory", default.memory)
    if not _MEMORY.fullmatch(memory):
        raise fields.fail("memory", f"{memory!r} must be a size such as 4g or 512m")
    cpus, pids = fields.data.get("cpus", default.cpus), fields.data.get("pids", default.pids)
    if not isinstance(cpus, int | float) or isinstance(cpus, bool) or not 0 < cpus <= 256:
        raise fields.fail("cpus", "must be a number of CPUs such as 2 or 0.5")
    if not isinstance(pids, int) or isinstance(pids, bool) or not 16 <= pids <= 1_000_000:
        raise fields.fail("pids", "must be a whole number of processes, at least 16")
    return Resources(memory=memory, cpus=float(cpus), pids=pids)


def _mcp(fields: _Fields) -> tuple[McpServer, ...]:
    fields.check_keys({"servers"})
    servers = []
    for name, entry in fields.table("servers").items():
        server = _Fields(entry if isinstance(entry, dict) else {}, fields.source, f"mcp.servers.{name}.")
        server.check_keys({"command", "url"})
        command, url = server.strings("command"), server.string("url")
        if bool(command) == bool(url):
            raise server.fail("command", "give either command = [...] (stdio, runs in the bottle) or url = ...")
        servers.append(McpServer(name, command, url, _mcp_allow_entry(url, server) if url else ""))
    return tuple(servers)


def _mcp_allow_entry(url: str, server: _Fields) -> str:
    """The allowlist entry for a remote MCP server: its host, and its port unless the scheme's default."""
    example = "write it like https://mcp.example.com/mcp"
    try:
        parts = urlsplit(url)
        port_text = parts.netloc.rpartition("@")[2].rpartition("]")[2].partition(":")[2]
    except ValueError as exc:
        raise server.fail("url", f"{url!r} is not a URL ({exc}); {example}") from None
    if parts.scheme not in ("https", "http") or not parts.hostname:
        raise server.fail("url", f"{url!r} is not an http(s) URL; {example}")
    if "@" in parts.netloc:
        raise server.fail("url", f"{url!r} carries credentials (user@ or user:password@): they would go through "
                                 "the gate in plain sight and into the allowlist; remove them")
    if "*" in parts.netloc:
        raise server.fail("url", f"{url!r}: a wildcard is not a host to connect to; {example}")
    if parts.fragment:
        raise server.fail("url", f"{url!r}: a fragment (#...) has no meaning here; remove it")
    try:
        host, ip = normalize_host(parts.hostname)
        port = parse_port(port_text, "the") if port_text else None
    except InvalidHost as exc:
        raise server.fail("url", f"{url!r}: {exc}; {example}") from None
    default = 443 if parts.scheme == "https" else 80
    shown = f"[{host}]" if ip is not None and ip.version == 6 else host
    entry = shown if port in (None, default) else f"{shown}:{port}"
    try:
        parse_pattern(entry)
    except InvalidHost as exc:
        raise server.fail("url", f"{url!r}: {exc}") from None
    return entry


def _api(fields: _Fields) -> tuple[str, ...]:
    """``[api] server_tools``: provider-side tool families the agent opts in to (see docs/api-policy.md)."""
    fields.check_keys({"server_tools"})
    tools = fields.strings("server_tools")
    for tool in tools:
        try:
            parse_server_tool(tool)
        except InvalidServerTool as exc:
            raise fields.fail("server_tools", str(exc)) from None
    return tuple(dict.fromkeys(tools))


def _egress(value: Any, top: _Fields, presets: list[tuple[str, HostRules]]) -> RequestPolicy:
    """``[[egress]]`` entries, after the read-only presets' ones. One entry per host pattern."""
    example = '[[egress]] host = "api.github.com" allow = ["GET /repos/**"]'
    if not isinstance(value, list):
        raise top.fail("egress", f"must be a list of tables: {example}")
    entries = list(presets)
    for i, item in enumerate(value):
        fields = _Fields(item if isinstance(item, dict) else {}, top.source, f"egress[{i}].")
        if not isinstance(item, dict):
            raise top.fail(f"egress[{i}]", f"must be a table: {example}")
        fields.check_keys({"host", "allow", "deny", "inspect"})
        host, inspect = fields.string("host"), fields.data.get("inspect", True)
        if not host:
            raise fields.fail("host", "is required: a host pattern as in allow, such as api.github.com")
        if not isinstance(inspect, bool):
            raise fields.fail("inspect", "must be true or false")
        try:
            pattern = parse_pattern(host)
        except InvalidHost as exc:
            raise fields.fail("host", str(exc)) from None
        rules = {}
        for verdict in Verdict:
            try:
                rules[verdict] = tuple(parse_rule(verdict, text) for text in fields.strings(verdict))
            except InvalidRule as exc:
                raise fields.fail(verdict, str(exc)) from None
        if not inspect and (rules[Verdict.ALLOW] or rules[Verdict.DENY]):
            raise fields.fail("inspect", "false, yet the entry has allow or deny rules, which need the gate to see "
                                         "the requests; drop the rules or inspect = false")
        entries.append((f"egress[{i}]", HostRules(pattern, rules[Verdict.ALLOW], rules[Verdict.DENY], inspect)))
    seen: dict[object, str] = {}
    for origin, entry in entries:
        if entry.host in seen:
            raise top.fail(origin, f"{entry.host} has an entry already ({seen[entry.host]}); keep one (to change a "
                                   "preset's rules, copy them from docs/agents.md into [[egress]] instead)")
        seen[entry.host] = origin
    return RequestPolicy(tuple(entry for _, entry in entries))


def _dlp(fields: _Fields) -> DlpPolicy:
    """``[dlp]``: ``disable`` (built-in rule names) and ``[dlp.rules]`` (name = regex), see docs/inspection.md."""
    fields.check_keys({"disable", "rules"})
    disabled = set()
    for name in fields.strings("disable"):
        try:
            disabled.add(parse_builtin_name(name))
        except InvalidDlpRule as exc:
            raise fields.fail("disable", str(exc)) from None
    extra: list[DlpRule] = []
    for name, regex in fields.table("rules").items():
        if not isinstance(regex, str):
            raise fields.fail(f"rules.{name}", "must be a regular expression in a string")
        try:
            extra.append(parse_dlp_rule(name, regex))
        except InvalidDlpRule as exc:
            raise fields.fail(f"rules.{name}", str(exc)) from None
    return DlpPolicy(tuple(extra), frozenset(disabled))


def _credentials(fields: _Fields) -> list[tuple[CredentialConfig, HostRules | None]]:
    """``[credentials.NAME]`` tables, each with the ``[[egress]]``-like entry of its rules (one per bound host,
    when it has rules). A preset's name fills in what the table leaves out."""
    found: list[tuple[CredentialConfig, HostRules | None]] = []
    for name, table in fields.data.items():
        entry = _Fields(table if isinstance(table, dict) else {}, fields.source, f"credentials.{name}.")
        if not isinstance(table, dict):
            raise fields.fail(name, f"must be a table ([credentials.{name}])")
        try:
            check_name(name)
        except InvalidRoute as exc:
            raise fields.fail(name, str(exc)) from None
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


def _check_bound_hosts(agent: AgentConfig) -> None:
    """A host bound to a credential is always inspected: not ``inspect = false``, not raw TCP."""
    raw = Allowlist.parse(agent.allow_tcp)
    for credential in agent.credentials:
        for host, port in credential.hosts:
            target = Target(host, port, normalize_host(host)[1])
            if not agent.egress.inspects(target):
                raise ConfigError(f"{credential.origin}: {host}:{port} has an [[egress]] entry with inspect = false, "
                                  "but the gate must read every request to a host bound to a credential (it replaces "
                                  "the client's credentials there); drop inspect = false")
            if raw.match(target) is not None:
                raise ConfigError(f"{credential.origin}: {host}:{port} is in allow_tcp, whose tunnels the gate does "
                                  "not read, but a host bound to a credential must be inspected; remove it from "
                                  "allow_tcp")
