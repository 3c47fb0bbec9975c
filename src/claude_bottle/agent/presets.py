"""Named sets an agent file refers to: host presets (``presets = ["npm"]``), their read-only variants with
method and path rules, and credential presets (``[credentials.github]``)."""

from __future__ import annotations

from dataclasses import dataclass

from claude_bottle.gate.routes import Scheme
from claude_bottle.policy.rules import HostRules, make_host_rules

# Hosts the bottle may reach, by the name an agent's ``presets`` lists.
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


@dataclass(frozen=True)
class CredentialPreset:
    """What a preset's name fills in of a ``[credentials.NAME]`` table that leaves it out."""

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
