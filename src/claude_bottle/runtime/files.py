"""The host files a bottle gets mounted read-only: its trust store, its git configuration, the policy in
effect and Claude Code's seeded settings; and the read-only mounts protecting the workspace's own files."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from claude_bottle import records
from claude_bottle.credentials import CredentialKind
from claude_bottle.errors import ConfigError, DockerError
from claude_bottle.gate.routes import RouteSpec
from claude_bottle.paths import made_state_dir, state_dir
from claude_bottle.policy.addresses import AddressGuard
from claude_bottle.policy.decide import EgressPolicy
from claude_bottle.policy.view import policy_toml, policy_view
from claude_bottle.runtime.seam import ContainerInfo, Engine, Mount
from claude_bottle.runtime.spec import HOME, RunSpec
from claude_bottle.workspace import GIT, PROTECTED, lstat_inside

POLICY_DIR = "/etc/claude-bottle"  # in the bottle, read-only: the policy in effect (gate/failures.py POLICY_FILE)
POLICY_FILE = "policy.toml"
# Created by the host once the gate listens and its CA is in the bottle's trust store: the bottle's entrypoint
# (runtime/dockerfiles/bottle-entry.sh) holds the bottle's command until then.
READY_FILE = f"{POLICY_DIR}/ready"

# The bottle's system trust store: the image's bundle, to which the gate's CA is added before the bottle starts
# (root-owned, 0644: the bottle's user cannot change it). Every variable through which a tool finds its CA
# certificates points at the whole bundle, so none trusts the gate's CA alone: node and Claude Code
# (NODE_EXTRA_CA_CERTS adds to their built-in roots), OpenSSL and what uses it, Go and rustls (SSL_CERT_FILE),
# requests, curl, git, pip and npm (each replaces its own default with the file named).
SYSTEM_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
IMAGE_BUNDLE = "/usr/share/claude-bottle/ca-certificates.crt"  # the image's, as built (bottle.Dockerfile)
IMAGE_BUNDLES_KEPT = 8  # images whose bundle the host keeps
CA_ENV = {name: SYSTEM_BUNDLE for name in ("NODE_EXTRA_CA_CERTS", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE",
                                           "CURL_CA_BUNDLE", "GIT_SSL_CAINFO", "PIP_CERT", "npm_config_cafile")}

# ~/.claude/settings.json in every bottle: the bottle is the sandbox the bypass-mode warning asks for. It is
# the product's file, mounted read-only: hooks or settings a bottle writes there would run in later runs.
CLAUDE_SETTINGS = {"skipDangerousModePermissionPrompt": True}


def seeded_claude_json(kind: CredentialKind, placeholder: str, mcp_servers: dict[str, Any]) -> bytes:
    """~/.claude.json that lands an interactive start on the prompt: onboarding done (its connectivity
    check ignores ANTHROPIC_BASE_URL), /workspace trusted, bypass mode accepted, the placeholder key approved."""
    state: dict[str, Any] = {
        "hasCompletedOnboarding": True,
        "bypassPermissionsModeAccepted": True,
        "projects": {"/workspace": {"hasTrustDialogAccepted": True}},
        "mcpServers": mcp_servers,
    }
    if kind is CredentialKind.API_KEY:
        state["customApiKeyResponses"] = {"approved": [placeholder[-20:]], "rejected": []}
    return json.dumps(state).encode()


def policy_dir(run_id: str) -> Path:
    """The host folder mounted read-only at ``POLICY_DIR`` in a run's bottle: the policy in effect."""
    return records.run_dir(run_id) / "policy"


def write_policy(run_id: str, view: dict[str, Any]) -> None:
    """Write (replace whole) the bottle's policy file from the gate's ``policy_view``: readable by the
    bottle's user, whoever that is; written on the host only."""
    folder = policy_dir(run_id)
    made_state_dir()
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o755)
    partial = folder / f".{POLICY_FILE}.{os.getpid()}"
    partial.write_text(policy_toml(view))
    partial.chmod(0o644)
    os.replace(partial, folder / POLICY_FILE)


def spec_policy(spec: RunSpec) -> dict[str, Any]:
    """The policy a run's gate starts with, as ``policy_view`` shows it."""
    policy = EgressPolicy(spec.allow, AddressGuard(), raw_tcp=spec.allow_tcp, learn=spec.learn)
    return policy_view(policy, spec.request_policy, spec.ask)


# The bottle's /etc/gitconfig (a read-only file mount): for each host of a route with git, a credential helper
# that answers the route's sentinel, so git in the bottle authenticates (the gate replaces it with the value).
GIT_CONFIG = "/etc/gitconfig"


def git_credentials(routes: Iterable[RouteSpec]) -> bytes:
    lines = []
    for route in routes:
        username = route.username or "git"
        for host, port in route.hosts:
            url = f"https://{host}" if port == 443 else f"https://{host}:{port}"
            answer = f"echo username={username} && echo password={route.sentinel}"
            lines += [f'[credential "{url}"]', "\thelper =", f'\thelper = "!f() {{ test $1 = get && {answer}; }}; f"']
    return ("\n".join(lines) + "\n").encode() if lines else b""


def claude_state_mounts(volume: str) -> dict[str, dict[str, str]]:
    """~/.claude: the project's state volume, with the product's settings over it, read-only."""
    return {volume: {"bind": f"{HOME}/.claude", "mode": "rw"},
            str(seeded_settings()): {"bind": f"{HOME}/.claude/settings.json", "mode": "ro"}}


def seeded_settings() -> Path:
    """The host file mounted read-only at ~/.claude/settings.json (rewritten only when its content changes;
    a replaced file does not disturb running bottles, which hold the old one)."""
    path = state_dir() / "claude-settings.json"
    content = json.dumps(CLAUDE_SETTINGS, indent=2) + "\n"
    if not path.is_file() or path.read_text() != content:
        made_state_dir()
        partial = path.with_name(f".{path.name}.{os.getpid()}")
        partial.write_text(content)
        partial.chmod(0o644)  # read by the bottle's user, whoever that is
        os.replace(partial, path)
    return path


@dataclass(frozen=True)
class Protection:
    """A read-only mount over a workspace path: the path itself (a directory or regular file, checked without
    following symlinks), or with no source an empty read-only file system (where .git does not exist)."""

    target: str
    source: Path | None

    def mount(self) -> Mount:
        if self.source is None:
            return Mount(self.target, tmpfs_mode=0o555, tmpfs_size=4096)
        return Mount(self.target, str(self.source))


def protective_mounts(workspace: Path, paths: Iterable[str] = PROTECTED) -> list[Protection]:
    """Read-only mounts for the workspace paths a bottle must not change (``claude_bottle.workspace``): each
    that is a real directory or regular file, as ``lstat`` sees it; a symlink or a missing path gets none (the
    run's before-and-after check covers it). ``.git`` always gets one: itself, or an empty read-only file
    system where there is none, so a bottle can neither change nor create a repository there. Mounting the
    whole directory also makes it a mount point in the bottle, which cannot be renamed or replaced.

    A ``.git`` that is a symlink or neither a directory nor a file is refused (ConfigError)."""
    protections = []
    for relative in dict.fromkeys([GIT, *paths]):
        path = workspace / relative
        found = lstat_inside(workspace, relative)
        if found is None:
            if relative == GIT:
                protections.append(Protection(f"/workspace/{GIT}", None))
            continue
        checked, info = found
        mode = info.st_mode
        if checked != relative:
            continue  # a parent is a symlink or a file: nothing of the host to mount, and the watch sees it
        if stat.S_ISDIR(mode) or stat.S_ISREG(mode):
            protections.append(Protection(f"/workspace/{relative}", path))
        elif relative == GIT:
            kind = "a symlink" if stat.S_ISLNK(mode) else "neither a directory nor a file"
            raise ConfigError(f"{path} is {kind}: a bottle cannot be given a repository it could point elsewhere; "
                              "replace it with the repository itself (or a gitfile) and start again")
    return protections


def bottle_files(run_id: str) -> Path:
    """The host folder of the files a run's bottle gets as read-only file mounts (its trust store and git
    configuration); removed with the run."""
    return records.run_dir(run_id) / "bottle"


def image_trust_store(engine: Engine, container: ContainerInfo) -> bytes:
    """The system bundle of a created bottle's image, as built (``IMAGE_BUNDLE``: the bundle's own path has
    the run's file mount over it). An image's bundle never changes, so it is read from the container once
    per image and kept on the host (``state_dir()/image-trust``, the newest ``IMAGE_BUNDLES_KEPT``)."""
    image = container.image.removeprefix("sha256:")
    kept = state_dir() / "image-trust"
    cached = kept / f"{image}.crt"
    if image and cached.is_file():
        try:
            return cached.read_bytes()
        except FileNotFoundError:  # removed by another start's pruning since: read from the container
            pass
    try:
        found = engine.read_file(container.name, IMAGE_BUNDLE)
    except DockerError as exc:
        raise DockerError(f"cannot read the bottle image's trust store: {exc}") from None
    if found is None:
        raise DockerError(f"the bottle image has no {IMAGE_BUNDLE}: it is older than this claude-bottle; run "
                          "`claude-bottle build`")
    bundle = found
    if b"-----BEGIN CERTIFICATE-----" not in bundle:
        raise DockerError(f"{IMAGE_BUNDLE} in the bottle image holds no certificate: rebuild it with "
                          "`claude-bottle build`")
    if image:
        made_state_dir()
        kept.mkdir(mode=0o700, exist_ok=True)
        partial = cached.with_name(f".{cached.name}.{os.getpid()}")
        partial.write_bytes(bundle)
        os.replace(partial, cached)
        for old in sorted(kept.glob("*.crt"), key=_age)[:-IMAGE_BUNDLES_KEPT]:
            old.unlink(missing_ok=True)
    return bundle


def _age(bundle: Path) -> float:
    """When a kept bundle was written; 0 for one another start removed since it was listed."""
    try:
        return bundle.stat().st_mtime
    except FileNotFoundError:
        return 0.0


def write_for_bottle(path: Path, data: bytes) -> None:
    """A host file a bottle gets as a read-only mount, replaced whole (before the bottle starts: a started one
    keeps the file it was given); readable by the bottle's user, whoever that is."""
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    partial.write_bytes(data)
    partial.chmod(0o644)
    os.replace(partial, path)


def add_ca(path: Path, certificate_pem: bytes) -> None:
    """Append a CA certificate to a bottle's trust store, in place: a started bottle has this very file
    (inode) mounted, so replacing it would not reach the bottle."""
    with path.open("ab") as store:
        store.write(certificate_pem)
