"""The project file: a workspace's ``.claude-bottle.toml``, the project's default agent. A repository (or a
bottle) may have written it, so it is read without following symlinks, used only once the user approved
exactly its bytes (``claude-bottle trust``), and never sets what ``PROJECT_FORBIDDEN`` lists."""

from __future__ import annotations

import errno
import hashlib
import os
import stat
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from claude_bottle.agent.schema import DEFAULT_AGENT, AgentConfig, parse_agent
from claude_bottle.errors import ConfigError
from claude_bottle.paths import agents_dir

PROJECT_FILE = ".claude-bottle.toml"
PROJECT_FILE_LIMIT = 256 * 1024
# What a repository must not choose, even once the user approved its project file without reading it: where
# the credential goes, host paths in the bottle, the address guard, and whom TLS trusts.
PROJECT_FORBIDDEN = {
    "upstream": "it decides where your credential is sent",
    "upstream_proxy": "it decides where all the gate's traffic goes",
    "mounts": "it puts paths of your machine into the bottle",
    "allow_private": "it opens private networks to the bottle",
    "extra_ca_certificates": "it decides whom TLS connections trust",
    "credentials": "it decides which of your credentials go where, and may run commands on your machine",
    "runtime": "it chooses the kernel boundary between the bottle and your machine",
    "ask_command": "it runs a command on your machine, and it decides what the bottle may reach",
    "allow_tcp": "it lets tunnels to those hosts carry any bytes, unseen: no TLS name check, no rules, no DLP",
    "api": "it lets the provider fetch URLs or run code with network access for the bottle (server tools)",
}
# What a project file may not turn off, even once approved: inspection of a host, and DLP rules.
PROJECT_FORBIDDEN_WEAKER = {
    "egress[N].inspect = false": "it lets requests to that host pass unseen: no rules, no DLP",
    "dlp.disable": "it turns off checks that stop credentials leaving",
}


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
    "ask": "ask mode: unlisted destinations wait for your answer",
    "ask_timeout": "how long ask mode waits for your answer",
}


def project_summary(project: ProjectFile) -> list[str]:
    """One line per key the project file sets, with what it changes; raises like ``ProjectFile.agent``."""
    agent = project.agent()
    lines = [f"{key}: {PROJECT_EFFECTS[key]}" for key in project.data if key in PROJECT_EFFECTS]
    if reachable := agent.egress_allowlist.texts():
        lines.append(f"the bottle may then reach, besides the Anthropic API: {', '.join(reachable)}")
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
