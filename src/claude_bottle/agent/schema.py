"""An agent's settings: ``AgentConfig`` and the parsing of an agent's TOML table into it. Each value is
checked as it is read; the first problem is a ConfigError naming the file and the key."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from claude_bottle.agent.credential_config import CredentialConfig, check_bound_hosts, parse_credentials
from claude_bottle.agent.fields import Fields
from claude_bottle.agent.mounts import Mount, parse_mounts
from claude_bottle.agent.presets import PRESETS, READ_PRESETS
from claude_bottle.agent.upstream_proxy import check_setting
from claude_bottle.claude_code import DEFAULT_CLAUDE_CODE_VERSION, LATEST
from claude_bottle.errors import ConfigError
from claude_bottle.gate.ask import ASK_TIMEOUT_BOUNDS
from claude_bottle.gate.ask import DEFAULT_TIMEOUT as DEFAULT_ASK_TIMEOUT
from claude_bottle.gate.dlp import DlpPolicy, DlpRule, InvalidDlpRule, parse_builtin_name, parse_dlp_rule
from claude_bottle.gate.options import compose_allowlist
from claude_bottle.gate.routes import InvalidRoute, check_routes
from claude_bottle.gate.settings import DEFAULT_UPSTREAM, Upstream, parse_upstream
from claude_bottle.policy.addresses import IPNetwork, parse_network
from claude_bottle.policy.hosts import (
    Allowlist,
    HostPattern,
    InvalidHost,
    Target,
    normalize_host,
    parse_pattern,
    parse_port,
)
from claude_bottle.policy.mcp import (
    InvalidMcpServer,
    McpServerRules,
    check_server_name,
    check_servers,
    check_tool_globs,
)
from claude_bottle.policy.messages import InvalidServerTool, parse_server_tool
from claude_bottle.policy.rules import HostRules, InvalidRule, RequestPolicy, Verdict, parse_rule

CONFIG_VERSION = 1
DEFAULT_AGENT = "default"
_RUNTIME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_MEMORY = re.compile(r"\d+[kmg]?", re.IGNORECASE)
ANTHROPIC_API = parse_upstream(DEFAULT_UPSTREAM)  # the upstream of an agent that names none


@dataclass(frozen=True)
class McpServer:
    """A stdio server (``command``) runs inside the bottle; a remote one (``url``) is reached through the
    gate, and ``allow_entry`` (its host, with the port when not the scheme's default) joins the allowlist.
    For a remote one, ``rules`` are what the gate judges its JSON-RPC by (docs/mcp.md): ``tools`` allowed
    (empty: all), ``deny_tools``; ``transport`` is "http" (streamable HTTP) or "sse"; ``credential`` names a
    ``[credentials.NAME]`` route bound to its host, whose sentinel the bottle's MCP config sends."""

    name: str
    command: tuple[str, ...] = ()
    url: str = ""
    allow_entry: HostPattern | None = None
    rules: McpServerRules | None = None
    transport: str = "http"
    credential: str = ""


@dataclass(frozen=True)
class Resources:
    """A bottle's limits: memory (Docker's notation, e.g. 4g), CPUs and processes."""

    memory: str = "4g"
    cpus: float = 2.0
    pids: int = 1024


@dataclass(frozen=True)
class AgentConfig:
    """One agent, validated: what its bottle may reach and hold, and how the bottle is built and run. The
    defaults are the built-in agent's (``claude-bottle start`` with neither an agent nor a project file)."""

    name: str = DEFAULT_AGENT
    allow: Allowlist = Allowlist()  # `allow` and the hosts of the presets it names (not the -read ones)
    allow_tcp: Allowlist = Allowlist()  # HOST:PORT whose tunnels may carry any TCP, not only TLS (e.g. SSH)
    allow_private: tuple[IPNetwork, ...] = ()  # non-public networks the gate may reach
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
    upstream: Upstream = ANTHROPIC_API  # where the gate's API route forwards, with the credential
    # The HTTP proxy the gate connects out through (agent/upstream_proxy.py): a URL, "none", or empty (unset:
    # the host's proxy variables decide). Checked when parsed; never from a project file.
    upstream_proxy: str = field(default="", repr=False)
    credentials: tuple[CredentialConfig, ...] = ()  # [credentials.NAME]: routes beyond Anthropic
    runtime: str = ""  # the bottle's OCI runtime (e.g. runsc for gVisor); empty: the engine's default
    # Ask mode's hook (runtime/ask_watch.py): a command run on the host for each held request; never from a
    # project file.
    ask_command: tuple[str, ...] = ()
    # Ask mode (gate/ask.py): a destination outside the allowlist is held until the user answers, at most
    # ``ask_timeout`` seconds. A project file may turn it on: the user still decides each destination, which is
    # stricter than learn mode and than an allowlist entry, both of which a project file may already give.
    ask: bool = False
    ask_timeout: float = DEFAULT_ASK_TIMEOUT
    sources: tuple[str, ...] = ()  # the files this came from, for messages

    @property
    def mcp_rules(self) -> tuple[McpServerRules, ...]:
        """The remote MCP servers as the gate judges them (``--mcp-server``)."""
        return tuple(s.rules for s in self.mcp_servers if s.rules is not None)

    @property
    def egress_allowlist(self) -> Allowlist:
        """The allowlist the gate enforces: listed hosts, the hosts of ``[[egress]]`` entries, of remote MCP
        servers and of credential routes, each once (``gate.options.compose_allowlist``)."""
        remote = tuple(s.allow_entry for s in self.mcp_servers if s.allow_entry is not None)
        bound = (host for c in self.credentials for host in c.hosts)
        return compose_allowlist(self.allow.patterns, self.egress, bound, implied=remote)


# The keys of an agent's file (a project file may set some of them: agent/project.py).
AGENT_KEYS = frozenset({"version", "allow", "allow_tcp", "presets", "allow_private", "env", "mounts", "resources",
                        "claude", "extra_ca_certificates", "extra_packages", "mcp", "upstream", "api", "egress", "dlp",
                        "credentials", "runtime", "upstream_proxy", "ask", "ask_timeout", "ask_command"})


def parse_agent(name: str, data: dict[str, Any], source: str) -> AgentConfig:
    """The agent ``name`` from its parsed TOML ``data``; ``source`` (the file) is named in every error."""
    top = Fields(data, source)
    top.check_keys(AGENT_KEYS)
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
    allowlist = _allowlist(top, "allow", allow)
    allow_tcp = _allowlist(top, "allow_tcp", top.strings("allow_tcp"))
    allow_private = []
    for cidr in top.strings("allow_private"):
        try:
            allow_private.append(parse_network(cidr))
        except ValueError as exc:
            raise top.fail("allow_private", str(exc)) from None

    env = top.table("env")
    for key, value in env.items():
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key) or not isinstance(value, str):
            raise top.fail(f"env.{key}", "variables need a NAME of letters, digits and '_' and a string value")

    try:
        upstream = parse_upstream(top.string("upstream", DEFAULT_UPSTREAM))
    except ConfigError as exc:
        raise top.fail("upstream", str(exc)) from None

    upstream_proxy = check_setting(top.string("upstream_proxy"), f"{source}: upstream_proxy") \
        if top.string("upstream_proxy") else ""
    credentials = parse_credentials(Fields(top.table("credentials"), source, "credentials."))
    read_entries.extend((f"credentials.{c.name}", entry) for c, entry in credentials if entry is not None)
    claude = Fields(top.table("claude"), source, "claude.")
    claude.check_keys({"version", "args", "model"})
    version = claude.string("version", DEFAULT_CLAUDE_CODE_VERSION)
    if version != LATEST and not re.fullmatch(r"\d+\.\d+\.\d+", version):
        raise claude.fail("version", f"{version!r} is not a Claude Code version such as {DEFAULT_CLAUDE_CODE_VERSION} "
                                     f"or {LATEST!r} (the newest release, resolved at build time)")
    ask_command = top.strings("ask_command")
    if "ask_command" in data and not (ask_command and ask_command[0]):
        raise top.fail("ask_command", 'a command and its arguments, like ["/path/to/hook", "--flag"]')
    runtime = top.string("runtime")
    if runtime:
        check_runtime_name(runtime, top.fail)
    ask, ask_timeout = _ask(top)

    agent = AgentConfig(
        name=name,
        allow=allowlist,
        allow_tcp=allow_tcp,
        allow_private=tuple(allow_private),
        env=dict(env),
        mounts=parse_mounts(data.get("mounts", []), top),
        resources=_resources(Fields(top.table("resources"), source, "resources.")),
        claude_version=version,
        claude_args=claude.strings("args"),
        model=claude.string("model"),
        extra_ca_certificates=tuple(_existing(Path(p).expanduser(), top, "extra_ca_certificates")
                                    for p in top.strings("extra_ca_certificates")),
        extra_packages=top.strings("extra_packages"),
        mcp_servers=_mcp(Fields(top.table("mcp"), source, "mcp.")),
        server_tools=_api(Fields(top.table("api"), source, "api.")),
        egress=_egress(data.get("egress", []), top, read_entries),
        dlp=_dlp(Fields(top.table("dlp"), source, "dlp.")),
        upstream=upstream,
        upstream_proxy=upstream_proxy,
        credentials=tuple(c for c, _ in credentials),
        runtime=runtime,
        ask_command=ask_command,
        ask=ask,
        ask_timeout=ask_timeout,
        sources=(source,),
    )
    agent = dataclasses.replace(agent, credentials=_bind_mcp_credentials(agent.mcp_servers, agent.credentials,
                                                                         source))
    check_bound_hosts(agent.credentials, agent.egress, agent.allow_tcp)
    check_mcp_hosts(agent.mcp_servers, agent.egress, agent.allow_tcp, source)
    return agent


def check_mcp_hosts(servers: tuple[McpServer, ...], egress: RequestPolicy, allow_tcp: Allowlist, source: str) -> None:
    """A remote MCP server's host is always inspected: the gate reads its JSON-RPC."""
    for server in servers:
        if server.rules is None:
            continue
        target = Target(server.rules.host, server.rules.port, normalize_host(server.rules.host)[1])
        if not egress.inspects(target) or allow_tcp.match(target) is not None:
            raise ConfigError(f"{source}: mcp.servers.{server.name}: {server.rules.host}:{server.rules.port} has "
                              "inspect = false or is in allow_tcp, but the gate must read an MCP server's requests "
                              "to judge its tools; drop that")


def _allowlist(fields: Fields, key: str, texts: list[str] | tuple[str, ...]) -> Allowlist:
    """Host patterns as the allowlist reads them, each once; the first bad one is an error naming ``key``."""
    try:
        return Allowlist(tuple(dict.fromkeys(parse_pattern(text) for text in texts)))
    except InvalidHost as exc:
        raise fields.fail(key, str(exc)) from None


def _ask(top: Fields) -> tuple[bool, float]:
    """``ask`` (true or false) and ``ask_timeout`` (seconds, as ``--ask-timeout`` bounds them)."""
    ask = top.data.get("ask", False)
    if not isinstance(ask, bool):
        raise top.fail("ask", "must be true or false")
    timeout = top.data.get("ask_timeout", DEFAULT_ASK_TIMEOUT)
    low, high = ASK_TIMEOUT_BOUNDS
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not low <= timeout <= high:
        raise top.fail("ask_timeout", f"must be a number of seconds from {low:g} to {high:g}")
    return ask, float(timeout)


def check_runtime_name(runtime: str, fail: Callable[[str, str], ConfigError]) -> str:
    """An OCI runtime's name as engines register it (runsc, runc, crun, kata-runtime)."""
    if not _RUNTIME.fullmatch(runtime):
        raise fail("runtime", f"{runtime!r} is not an OCI runtime name such as runsc (gVisor) or runc")
    return runtime


def _existing(path: Path, fields: Fields, key: str) -> Path:
    if not path.exists():
        raise fields.fail(key, f"{path} does not exist")
    return path



def _resources(fields: Fields) -> Resources:
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


def _mcp(fields: Fields) -> tuple[McpServer, ...]:
    fields.check_keys({"servers"})
    servers = []
    for name, entry in fields.table("servers").items():
        server = Fields(entry if isinstance(entry, dict) else {}, fields.source, f"mcp.servers.{name}.")
        server.check_keys({"command", "url", "transport", "tools", "deny_tools", "credential"})
        command, url = server.strings("command"), server.string("url")
        if bool(command) == bool(url):
            raise server.fail("command", "give either command = [...] (stdio, runs in the bottle) or url = ...")
        if not url:
            if remote := {"transport", "tools", "deny_tools", "credential"} & set(server.data):
                raise server.fail(sorted(remote)[0], "applies to a remote server (url = ...) only: a stdio server "
                                                     "runs in the bottle, its traffic judged as any process's")
            servers.append(McpServer(name, command))
            continue
        transport = server.string("transport", "http")
        if transport not in ("http", "sse"):
            raise server.fail("transport", f"{transport!r} is not http (streamable HTTP) or sse (the older transport)")
        entry_pattern = _mcp_allow_entry(url, server)
        try:
            check_server_name(name)
            tools = check_tool_globs(server.strings("tools"), "tools")
            deny = check_tool_globs(server.strings("deny_tools"), "deny_tools")
        except InvalidMcpServer as exc:
            raise server.fail("tools", str(exc)) from None
        port = entry_pattern.port or (443 if url.lower().startswith("https:") else 80)
        rules = McpServerRules(name, entry_pattern.host, port, tools, deny)
        servers.append(McpServer(name, (), url, entry_pattern, rules, transport, server.string("credential")))
    try:
        check_servers([s.rules for s in servers if s.rules is not None])
    except InvalidMcpServer as exc:
        raise fields.fail("servers", str(exc)) from None
    return tuple(servers)


def _bind_mcp_credentials(servers: tuple[McpServer, ...], credentials: tuple[CredentialConfig, ...],
                          source: str) -> tuple[CredentialConfig, ...]:
    """Each ``credential = "NAME"`` of a remote MCP server binds route NAME to the server's host as well."""
    by_name = {c.name: c for c in credentials}
    for server in servers:
        if not server.credential or server.rules is None:
            continue
        config = by_name.get(server.credential)
        if config is None:
            raise ConfigError(f"{source}: mcp.servers.{server.name}.credential: {server.credential!r} names no "
                              f"[credentials.{server.credential}] table; add one (its value as for any credential)")
        origin = (server.rules.host, server.rules.port)
        if origin not in config.hosts:
            by_name[config.name] = dataclasses.replace(config, hosts=(*config.hosts, origin))
    bound = tuple(by_name[c.name] for c in credentials)
    try:
        check_routes([c.spec("-") for c in bound])
    except InvalidRoute as exc:
        raise ConfigError(f"{source}: credentials: {exc}") from None
    return bound


def _mcp_allow_entry(url: str, server: Fields) -> HostPattern:
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
        return parse_pattern(entry)
    except InvalidHost as exc:
        raise server.fail("url", f"{url!r}: {exc}") from None


def _api(fields: Fields) -> tuple[str, ...]:
    """``[api] server_tools``: provider-side tool families the agent opts in to (see docs/api-policy.md)."""
    fields.check_keys({"server_tools"})
    tools = fields.strings("server_tools")
    for tool in tools:
        try:
            parse_server_tool(tool)
        except InvalidServerTool as exc:
            raise fields.fail("server_tools", str(exc)) from None
    return tuple(dict.fromkeys(tools))


def _egress(value: Any, top: Fields, presets: list[tuple[str, HostRules]]) -> RequestPolicy:
    """``[[egress]]`` entries, after the read-only presets' ones. One entry per host pattern."""
    example = '[[egress]] host = "api.github.com" allow = ["GET /repos/**"]'
    if not isinstance(value, list):
        raise top.fail("egress", f"must be a list of tables: {example}")
    entries = list(presets)
    for i, item in enumerate(value):
        fields = Fields(item if isinstance(item, dict) else {}, top.source, f"egress[{i}].")
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


def _dlp(fields: Fields) -> DlpPolicy:
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
