"""One run of an agent: its internal network, its gate, its bottle, and their removal.

Everything a run creates carries the label ``claude-bottle.run=<id>``; ``Run.remove`` (and ``claude-bottle
stop``) removes by that label, so an interrupted start leaves nothing behind whatever step it reached.
"""

from __future__ import annotations

import contextlib
import io
import ipaddress
import json
import os
import secrets
import shutil
import signal
import socket
import stat
import tarfile
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import docker
import docker.errors
from docker.models.containers import Container
from docker.models.networks import Network
from docker.types import LogConfig, Mount

from claude_bottle import records
from claude_bottle.agent.schema import Resources
from claude_bottle.credentials import Credential, CredentialKind
from claude_bottle.errors import BottleError, ConfigError, DockerError, GateError
from claude_bottle.gate.dlp import DlpPolicy
from claude_bottle.gate.routes import CredentialRoute, RouteSpec
from claude_bottle.gate.settings import Upstream
from claude_bottle.paths import state_dir, workspace_key
from claude_bottle.policy.addresses import AddressGuard, IPNetwork
from claude_bottle.policy.decide import EgressPolicy
from claude_bottle.policy.hosts import Allowlist
from claude_bottle.policy.rules import RequestPolicy
from claude_bottle.policy.view import policy_toml, policy_view
from claude_bottle.runtime import engine
from claude_bottle.workspace import GIT, PROTECTED, lstat_inside

LABEL = "claude-bottle"
RUN_LABEL = "claude-bottle.run"
AGENT_LABEL = "claude-bottle.agent"
WORKSPACE_LABEL = "claude-bottle.workspace"
EGRESS_LABEL = "claude-bottle.egress"
EGRESS_NETWORK = "claude-bottle-egress"  # every gate's way out (egress_network)
POOL_LABEL = "claude-bottle.pool"  # an internal network kept between runs (claim_internal), on Docker
POOL_KEPT = 2  # internal networks no run uses that are kept for the next runs
API_PORT = 8080
PROXY_PORT = 3128
CONTROL_SOCKET = "/tmp/claude-bottle-control.sock"  # in the gate's own tmpfs: see gate/control.py
GATE_PYTHON = "/opt/gate/bin/python"
POLICY_DIR = "/etc/claude-bottle"  # in the bottle, read-only: the policy in effect (gate/failures.py POLICY_FILE)
POLICY_FILE = "policy.toml"
# Created by the host once the gate listens and its CA is in the bottle's trust store: the bottle's entrypoint
# (runtime/dockerfiles/bottle-entry.sh) holds the bottle's command until then.
READY_FILE = f"{POLICY_DIR}/ready"
GATE_READY_SECONDS = 30
GATE_STOP_SECONDS = 3
# The host-side name of every internal network's bridge: this prefix and the network's (Podman: the run's)
# hex, 15 characters (the kernel's limit). A firewall rule on the prefix covers every bottle's bridge
# (docs/engines.md, "Podman").
BRIDGE_PREFIX = "bottle-"
GATE_ALIAS = "gate"  # the gate's name on the internal network, where the engine resolves names there (Docker)
# Podman: the internal network has no resolver (nor, with it, a gateway address), and the gate is given this
# address of its subnet, where it listens.
PODMAN_GATE_HOST = 2
# Podman leaves IPv6 on in a container whose networks have none, so a bottle could send link-local packets to
# its bridge, which rootless Podman keeps in its own network namespace, beyond any host firewall. Docker turns
# it off the same way.
PODMAN_SYSCTLS = {"net.ipv6.conf.all.disable_ipv6": "1", "net.ipv6.conf.default.disable_ipv6": "1"}
HOST_PROBE_SECONDS = 1  # a firewall that drops what comes in from a bridge makes the check wait this long
HOME = "/home/agent"
AGENT_UID = 1000  # the image's user: who a bottle runs as when root starts it on a folder root owns
# What a container may leave in the engine's logs (the gate's audit, the bottle's output), whatever it floods.
LOG_CONFIG = LogConfig(type=LogConfig.types.JSON, config={"max-size": "5m", "max-file": "2"})

# Claude Code's own calls home that the bottle never needs (see docs/gate.md).
CLAUDE_ENV = {
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    "CLAUDE_CODE_DISABLE_OFFICIAL_MARKETPLACE_AUTOINSTALL": "1",
    "DISABLE_AUTOUPDATER": "1",
    "DISABLE_TELEMETRY": "1",
    "DISABLE_ERROR_REPORTING": "1",
}

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


@dataclass(frozen=True)
class RunSpec:
    """Everything a run needs, already validated."""

    agent: str
    workspace: Path
    bottle_image: str
    gate_image: str
    credential: Credential
    user: str  # uid:gid, from bottle_user()
    upstream: Upstream
    allow: Allowlist = Allowlist()
    allow_tcp: Allowlist = Allowlist()  # HOST:PORT patterns whose tunnels may carry any TCP (--allow-tcp)
    allow_private: tuple[IPNetwork, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    resources: Resources = Resources()
    upstream_networks: tuple[str, ...] = ()  # Docker networks the gate joins to reach an upstream there
    # CA certificates (PEM files on the host) the gate trusts toward upstreams besides its image's store: the
    # CAs of stand-ins on those networks (verify's, the tests'), without an image of their own. Mounted
    # read-only into the gate, named by --extra-ca.
    upstream_ca_files: tuple[Path, ...] = ()
    mounts: tuple[tuple[Path, str, bool], ...] = ()  # (host path, container path, read-only)
    mcp_servers: dict[str, dict[str, Any]] = field(default_factory=dict)  # Claude Code's mcpServers entries
    protected: tuple[str, ...] = PROTECTED  # workspace paths mounted read-only where they exist (and nested .git)
    server_tools: tuple[str, ...] = ()  # server-tool families the API route lets through (--allow-server-tool)
    request_policy: RequestPolicy = RequestPolicy()  # [[egress]] (--egress-rule, --no-inspect)
    dlp: DlpPolicy = DlpPolicy()  # [dlp] (--dlp-rule, --dlp-off)
    runtime: str = ""  # the bottle's OCI runtime (runsc: gVisor); empty: the engine's default. The gate keeps it.
    learn: bool = False  # learn mode (--learn): what the allowlist does not name passes, audited as would_deny
    routes: tuple[CredentialRoute, ...] = ()  # [credentials.NAME] with their values: the gate gets them on stdin
    route_env: dict[str, str] = field(default_factory=dict)  # bottle variables holding a route's sentinel
    git_routes: tuple[RouteSpec, ...] = ()  # routes the bottle's git credential helper answers for
    # The engine is Podman: the internal network is made without a resolver, and so without a gateway address
    # (Run.start_gate), and the bottle without IPv6 (PODMAN_SYSCTLS).
    podman: bool = False
    # The bottle's user namespace: empty, the engine's default; "keep-id" on rootless Podman, where the
    # default maps every uid but root to the user's subordinate ids (``userns_for``).
    userns: str = ""


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


@contextlib.contextmanager
def _uninterrupted() -> Iterator[None]:
    """Hold Ctrl-C and friends until a create request returns. Interrupted mid-request, the engine would
    still create the resource after the removal had listed the run's resources and missed it."""
    stop = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, stop)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def gate_command(spec: RunSpec, listen: str = GATE_ALIAS) -> list[str]:
    """The gate's arguments: where it listens (``listen``: its name or address on the internal network), its
    upstream, and the agent's egress and API policy. The token comes on stdin, never here."""
    allow_args = [arg for pattern in spec.allow.patterns for arg in ("--allow", str(pattern))]
    tcp_args = [arg for pattern in spec.allow_tcp.patterns for arg in ("--allow-tcp", str(pattern))]
    private_args = [arg for network in spec.allow_private for arg in ("--allow-private", str(network))]
    tool_args = [arg for tool in spec.server_tools for arg in ("--allow-server-tool", tool)]
    ca_args = [arg for path in upstream_ca_mounts(spec).values() for arg in ("--extra-ca", path["bind"])]
    route_args = [arg for route in spec.routes for arg in ("--credential-route", route.spec.flag())]
    return ["--api-listen", f"{listen}:{API_PORT}", "--proxy-listen", f"{listen}:{PROXY_PORT}",
            "--upstream", str(spec.upstream), "--token-file", "-", "--audit-log", "-",
            "--control-socket", CONTROL_SOCKET, *(["--learn"] if spec.learn else []),
            *allow_args, *tcp_args, *private_args, *tool_args, *ca_args, *spec.request_policy.args(), *spec.dlp.args(),
            *route_args]


def upstream_ca_mounts(spec: RunSpec) -> dict[str, dict[str, str]]:
    """``spec.upstream_ca_files`` as read-only mounts into the gate."""
    return {str(path): {"bind": f"/opt/gate/upstream-ca/{i}.pem", "mode": "ro"}
            for i, path in enumerate(spec.upstream_ca_files)}


def policy_dir(run_id: str) -> Path:
    """The host folder mounted read-only at ``POLICY_DIR`` in a run's bottle: the policy in effect."""
    return records.run_dir(run_id) / "policy"


def write_policy(run_id: str, view: dict[str, Any]) -> None:
    """Write (replace whole) the bottle's policy file from the gate's ``policy_view``: readable by the
    bottle's user, whoever that is; written on the host only."""
    folder = policy_dir(run_id)
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o755)
    partial = folder / f".{POLICY_FILE}.{os.getpid()}"
    partial.write_text(policy_toml(view))
    partial.chmod(0o644)
    os.replace(partial, folder / POLICY_FILE)


def spec_policy(spec: RunSpec) -> dict[str, Any]:
    """The policy a run's gate starts with, as ``policy_view`` shows it."""
    policy = EgressPolicy(spec.allow, AddressGuard(), raw_tcp=spec.allow_tcp, learn=spec.learn)
    return policy_view(policy, spec.request_policy)


def control_gate(gate: Container, op: str, entry: str = "") -> dict[str, Any]:
    """Change (or with ``show`` read) a running gate's egress policy through its control socket, reached
    by running ``claude_bottle.gate.control`` inside the gate container; then the bottle's policy file is
    rewritten. The reply; a ConfigError naming what the gate refused."""
    try:
        _, output = gate.exec_run([GATE_PYTHON, "-m", "claude_bottle.gate.control", CONTROL_SOCKET, op, entry],
                                     stdout=True, stderr=True)
    except docker.errors.APIError as exc:
        raise DockerError(f"cannot reach the gate {gate.name}: {exc.explanation or exc}") from None
    text = output.decode("utf-8", "replace").strip()
    try:
        reply = json.loads(text.splitlines()[-1])
    except (ValueError, IndexError):
        raise GateError(f"the gate {gate.name} gave no answer on its control channel ({text[:200] or 'nothing'}); "
                        "a bottle started by an older claude-bottle has none: restart it") from None
    if not reply.get("ok"):
        raise ConfigError(f"{op} {entry}: {reply.get('error', 'refused by the gate')}")
    if op != "show":
        write_policy(gate.labels.get(RUN_LABEL, ""), reply["policy"])
    return dict(reply)


def gate_input(spec: RunSpec) -> bytes:
    """What the gate reads on its stdin: the token, then each route's value, one line each in the order of
    ``--credential-route`` (``gate_command``)."""
    return "".join(f"{value}\n" for value in (spec.credential.secret, *(r.secret for r in spec.routes))).encode()


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


def userns_for(podman: bool, rootless: bool) -> str:
    """The bottle's user namespace mode on this engine. Rootless Podman maps the container's root to the user
    and every other uid to the user's subordinate ids: a bottle running as the user's uid would be a stranger
    on the host, unable to write the workspace, and what it made there the user could not remove. With
    ``keep-id`` the user's uid is the same inside and out (and root inside is a subordinate id)."""
    return "keep-id" if podman and rootless else ""


def create_container(client: docker.DockerClient, image: str, userns: str = "", **options: Any) -> Container:
    """``client.containers.create(image, **options)``, in the user namespace ``userns`` when one is given:
    the Docker SDK refuses any mode but Docker's "host", so the request is made with the SDK's own arguments
    and the mode added to its host config."""
    if not userns:
        return client.containers.create(image, **options)
    from docker.models.containers import _create_container_args

    arguments = _create_container_args({**options, "image": image, "version": client.api._version})
    arguments["host_config"]["UsernsMode"] = userns
    return client.containers.get(client.api.create_container(**arguments)["Id"])


def bottle_user(uid: int, gid: int, workspace: Path) -> str:
    """Who the bottle runs as (uid:gid): the invoking user, so files made in /workspace are theirs. Never root:
    for root, the workspace's owner, or uid 1000 when root owns it too. A ConfigError, before anything starts,
    when that user cannot write the workspace: a session must not find out halfway that it cannot save."""
    return user_for(uid, gid, workspace.stat(), workspace)


def user_for(uid: int, gid: int, info: os.stat_result, workspace: Path) -> str:
    """``bottle_user`` for a workspace whose stat is ``info``."""
    if uid != 0:
        user, group, who = uid, gid, "you"
    elif info.st_uid != 0:
        user, group, who = info.st_uid, info.st_gid, "its owner, as root started it"
    else:
        user, group, who = AGENT_UID, AGENT_UID, "uid 1000, as root started it on a folder root owns"
    owner, member = info.st_uid == user, info.st_gid == group
    write, search = ((stat.S_IWUSR, stat.S_IXUSR) if owner else (stat.S_IWGRP, stat.S_IXGRP) if member
                     else (stat.S_IWOTH, stat.S_IXOTH))
    if info.st_mode & write and info.st_mode & search:
        return f"{user}:{group}"
    fix = (f"run claude-bottle as a user who can write it, or `chown -R {AGENT_UID}:{AGENT_UID} {workspace}`"
           if uid == 0 else f"make it yours (`chown -R {uid}:{gid} {workspace}`) or writable for you")
    raise ConfigError(f"the workspace {workspace} is not writable by the bottle's user {user}:{group} ({who}): "
                      f"{fix}")


def state_volume(agent: str, workspace: Path) -> str:
    """Claude Code's ~/.claude for one agent on one workspace: sessions and history, kept across runs for
    --continue and --resume, and seen by no other project's bottle."""
    return f"claude-bottle-{agent}-{workspace_key(workspace)}-state"


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
        state_dir().mkdir(mode=0o700, parents=True, exist_ok=True)
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
            return Mount(self.target, None, type="tmpfs", read_only=True, tmpfs_mode=0o555, tmpfs_size=4096)
        return Mount(self.target, str(self.source), type="bind", read_only=True)


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


def image_trust_store(container: Container) -> bytes:
    """The system bundle of a created bottle's image, as built (``IMAGE_BUNDLE``: the bundle's own path has
    the run's file mount over it). An image's bundle never changes, so it is read from the container once
    per image and kept on the host (``state_dir()/image-trust``, the newest ``IMAGE_BUNDLES_KEPT``)."""
    image = str(container.attrs.get("Image", "")).removeprefix("sha256:")
    kept = state_dir() / "image-trust"
    cached = kept / f"{image}.crt"
    if image and cached.is_file():
        return cached.read_bytes()
    try:
        chunks, _ = container.get_archive(IMAGE_BUNDLE)
    except docker.errors.NotFound:
        raise DockerError(f"the bottle image has no {IMAGE_BUNDLE}: it is older than this claude-bottle; run "
                          "`claude-bottle build`") from None
    except docker.errors.APIError as exc:
        raise DockerError(f"cannot read the bottle image's trust store: {exc.explanation or exc}") from None
    with tarfile.open(fileobj=io.BytesIO(b"".join(chunks))) as tar:
        member = tar.next()
        extracted = tar.extractfile(member) if member is not None and member.isfile() else None
        bundle = extracted.read() if extracted is not None else b""
    if b"-----BEGIN CERTIFICATE-----" not in bundle:
        raise DockerError(f"{IMAGE_BUNDLE} in the bottle image holds no certificate: rebuild it with "
                          "`claude-bottle build`")
    if image:
        kept.mkdir(mode=0o700, parents=True, exist_ok=True)
        partial = cached.with_name(f".{cached.name}.{os.getpid()}")
        partial.write_bytes(bundle)
        os.replace(partial, cached)
        for old in sorted(kept.glob("*.crt"), key=lambda p: p.stat().st_mtime)[:-IMAGE_BUNDLES_KEPT]:
            old.unlink(missing_ok=True)
    return bundle


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


def egress_network(client: docker.DockerClient) -> Network:
    """The network through which every gate reaches the world: one for all runs, made on first use and kept.
    Sharing it opens no path: bottles never join it, a gate listens on its internal address only, and the
    address guard refuses the others' (private) addresses like any. Two runs that made it at once are
    told apart by age, the older one used by all."""
    try:
        found = client.networks.list(filters={"label": EGRESS_LABEL})
        if found:
            return min(found, key=lambda network: (str(network.attrs.get("Created", "")), network.id))
        with _uninterrupted():
            return client.networks.create(EGRESS_NETWORK, driver="bridge", labels={LABEL: "1", EGRESS_LABEL: "1"})
    except docker.errors.APIError as exc:
        raise DockerError(f"cannot create the egress network {EGRESS_NETWORK}: {exc.explanation or exc}") from None


def claim_internal(client: docker.DockerClient, image: str, labels: dict[str, str]) -> Network:
    """An internal network for one run, on Docker: one kept from an earlier run that no container is on, or a
    new one. Making one and removing it cost the engine about a fifth of a second of every run.

    A run holds its network by a claim: a container named after the network, never started, with the run's
    labels (so removing the run removes it). The engine lets one container have a name, so of two runs
    claiming at once one gets it; and a network is taken only once, after the claim, no container is found on
    it, in any state: a run that ended without its claim removed, or a container someone else connected,
    keeps it out of use. Two runs never share one, which would put one's bottle in the other's reach."""
    for network in client.networks.list(filters={"label": POOL_LABEL}):
        claim = _claim(client, network.name, image, labels)
        if claim is None:
            continue
        if not on_network(client, network):
            return network
        _remove_claim(claim)
    name = f"claude-bottle-internal-{secrets.token_hex(4)}"
    if _claim(client, name, image, labels) is None:  # a new name: claimed before anyone can see the network
        raise DockerError(f"cannot claim the new internal network {name}: a container {name}-claim exists")
    # An internal bridge still gets the gateway address on the host side, and with it anything the host serves
    # on that address or on 0.0.0.0 would be in the bottle's reach: the bridge gets no address.
    options = {"com.docker.network.bridge.inhibit_ipv4": "true",
               "com.docker.network.bridge.name": BRIDGE_PREFIX + name.rsplit("-", 1)[1]}
    try:
        with _uninterrupted():
            return client.networks.create(name, driver="bridge", internal=True, options=options,
                                          labels={LABEL: "1", POOL_LABEL: "1"})
    except docker.errors.APIError as exc:
        raise DockerError(f"cannot create the internal network: {exc.explanation or exc}") from None


def on_network(client: docker.DockerClient, network: Network) -> list[Container]:
    """The containers on ``network``, in any state. By name too: the engine's filter by id misses a container
    that is created but was never started, which has joined no network yet but will at its start."""
    return list(client.containers.list(all=True, filters={"network": [network.name, network.id]}))


def _claim(client: docker.DockerClient, network: str, image: str, labels: dict[str, str]) -> Container | None:
    """The claim on ``network`` (``claim_internal``); None when another run holds it."""
    try:
        with _uninterrupted():
            return client.containers.create(image, name=f"{network}-claim", labels=labels, network_disabled=True)
    except docker.errors.APIError as exc:
        if exc.status_code == 409:  # the name is taken: another run's claim
            return None
        raise DockerError(f"cannot claim the internal network {network}: {exc.explanation or exc}") from None


def _remove_claim(claim: Container) -> None:
    with contextlib.suppress(docker.errors.NotFound):
        claim.remove(force=True)


def trim_pool(client: docker.DockerClient, image: str, kept: int = POOL_KEPT) -> None:
    """Remove the kept internal networks beyond ``kept`` that no run uses: each claimed first (with ``image``,
    any image present), so none is removed under a run that has just taken it."""
    pooled = client.networks.list(filters={"label": POOL_LABEL})
    if len(pooled) <= kept:
        return
    free = 0
    for network in pooled:
        # a run of its own, so a claim left by a trim cut short is listed, and removed by `stop --all`
        claim = _claim(client, network.name, image, {LABEL: "1", RUN_LABEL: f"trim-{secrets.token_hex(4)}"})
        if claim is None:
            continue
        try:
            if on_network(client, network):
                continue
            free += 1
            if free > kept:
                with contextlib.suppress(docker.errors.NotFound):
                    network.remove()
        finally:
            _remove_claim(claim)


def startup_lines(stream: socket.socket, seconds: float) -> str | None:
    """A starting gate's standard error, read from its attached ``stream`` (the engine's multiplexed frames:
    an 8-byte header, then the payload) until the line saying it listens has come (with whatever came in the
    same read), or to its end if it stopped first. None when neither came within ``seconds``."""
    deadline = time.monotonic() + seconds
    text = b""
    buffer = b""
    while b"claude-bottle gate: API on" not in text:
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        stream.settimeout(left)
        try:
            data = stream.recv(65536)
        except TimeoutError:
            return None
        except OSError:
            data = b""
        if not data:
            break
        buffer += data
        while len(buffer) >= 8 and len(buffer) >= 8 + int.from_bytes(buffer[4:8], "big"):
            size = int.from_bytes(buffer[4:8], "big")
            if buffer[0] == 2:  # standard error
                text += buffer[8 : 8 + size]
            buffer = buffer[8 + size :]
    return text.decode("utf-8", "replace")


class Run:
    """A run: ``start_gate()``, then the bottle (``start_bottle``, or ``create_bottle`` to start it yourself);
    always ``remove()`` (it is idempotent)."""

    def __init__(self, client: docker.DockerClient, spec: RunSpec) -> None:
        self.client = client
        self.spec = spec
        self.hex = secrets.token_hex(4)
        self.id = f"{spec.agent}-{self.hex}"
        self.labels = {LABEL: "1", RUN_LABEL: self.id, AGENT_LABEL: spec.agent, WORKSPACE_LABEL: str(spec.workspace)}
        self.internal: Network | None = None
        self.egress: Network | None = None
        self.gate: Container | None = None
        self.bottle: Container | None = None
        self.gate_ip = ""
        self.gate_ca = b""  # the gate's CA certificate (PEM), as it announced it; set by wait_for_gate
        self._gate_output: socket.socket | None = None  # the gate's attached stream, until it says it listens
        self.gate_listen = GATE_ALIAS  # the gate's name or (Podman) address on the internal network

    def _internal_network(self) -> Network:
        """The run's own network, the bottle's only one: no route out, and its only other member the gate.
        On Docker one kept between runs (``claim_internal``); on Podman made for this run."""
        if self.spec.podman:
            return self._podman_internal(f"claude-bottle-{self.id}-internal")
        return claim_internal(self.client, self.spec.gate_image, self.labels)

    def _podman_internal(self, name: str) -> Network:
        """The internal network on Podman, made through its own API: without a resolver. With one (what its
        Docker-compatible API always makes) the bridge gets the gateway address, on the host (rootful) or in
        rootless Podman's network namespace, and there Podman's resolver, aardvark-dns, answers the bottle and
        forwards whatever it does not know to the host's resolvers: a way out for any name the bottle makes
        up. Without a resolver the bridge has no address at all, and the gate listens at ``gate_listen``, an
        address it is given, as nothing resolves its name there. The bridge is still named ``bottle-<hex>``,
        for firewall rules (docs/engines.md)."""
        with _uninterrupted():
            created = engine.libpod(self.client, "POST", "/networks/create", {
                "name": name, "driver": "bridge", "internal": True, "dns_enabled": False,
                "network_interface": BRIDGE_PREFIX + self.hex, "labels": self.labels})
        subnets = [ipaddress.ip_network(s["subnet"]) for s in created.get("subnets") or []]
        v4 = [subnet for subnet in subnets if subnet.version == 4]
        try:
            network = self.client.networks.get(name)
        except docker.errors.APIError as exc:
            raise DockerError(f"cannot find the internal network just made: {exc.explanation or exc}") from None
        if not v4:
            raise DockerError(f"Podman gave the internal network {name} no IPv4 subnet ({created.get('subnets')})")
        self.gate_listen = str(v4[0].network_address + PODMAN_GATE_HOST)
        return network

    def start_gate(self) -> None:
        """The gate joins the egress network, then the run's internal one, and listens on its internal address
        only. The token goes in over the attached stdin: never an argument, a variable or a file."""
        spec = self.spec
        with _uninterrupted(), ThreadPoolExecutor(2) as pool:  # its threads inherit the blocked signals
            internal, egress = pool.submit(self._internal_network), pool.submit(egress_network, self.client)
            self.internal, self.egress = internal.result(), egress.result()
        try:
            with _uninterrupted():
                self.gate = self.client.containers.create(
                    spec.gate_image,
                    command=gate_command(spec, self.gate_listen),
                    name=f"claude-bottle-{self.id}-gate", labels=self.labels, stdin_open=True,
                    network=self.egress.id, read_only=True, tmpfs={"/tmp": "size=16m"},
                    cap_drop=["ALL"], security_opt=["no-new-privileges"], pids_limit=256, mem_limit="256m",
                    log_config=LOG_CONFIG, volumes=upstream_ca_mounts(spec),
                )
            if spec.podman:  # no names on that network: the address the gate listens on
                self.internal.connect(self.gate, ipv4_address=self.gate_listen)
            else:
                self.internal.connect(self.gate, aliases=[GATE_ALIAS])
            for name in spec.upstream_networks:
                self.client.networks.get(name).connect(self.gate)
            # Attached before it starts, so its start-up lines are all read here (wait_for_gate): no polling.
            socket_ = self.gate.attach_socket(params={"stdin": 1, "stderr": 1, "stream": 1})
            self.gate.start()
            raw = getattr(socket_, "_sock", socket_)  # the SDK wraps the socket; half-close needs the real one
            self._gate_output = raw
            raw.sendall(gate_input(spec))
            with contextlib.suppress(OSError):
                raw.shutdown(socket.SHUT_WR)
            self.gate.reload()  # its address is assigned by now, while it boots
        except docker.errors.APIError as exc:
            raise DockerError(f"cannot start the gate: {exc.explanation or exc}") from None
        self.gate_ip = self.gate.attrs["NetworkSettings"]["Networks"][self.internal.name]["IPAddress"]

    def check_host_unreachable(self) -> None:
        """A DockerError unless this host is out of the internal network's reach at the bridge's gateway address.

        Docker gives an internal bridge no address on the host (``inhibit_ipv4``); Podman gives it one, and a
        bottle would reach whatever the host serves there or on 0.0.0.0. The gate, on the same network, dials
        a port this host listens on at that address: a connection dropped on the way (the firewall rule
        docs/engines.md gives) or refused is fine; a connection made is refused here, before any bottle
        exists."""
        assert self.internal is not None and self.gate is not None
        self.internal.reload()
        gateways = [address for address in network_gateways(self.internal) if ":" not in address]
        if not gateways:
            return
        with socket.create_server(("0.0.0.0", 0)) as listener:
            port = listener.getsockname()[1]
            dial = ("import socket, sys\n"
                    "try:\n"
                    f"    socket.create_connection((sys.argv[1], {port}), timeout={HOST_PROBE_SECONDS}).close()\n"
                    "except OSError:\n"
                    "    sys.exit(1)\n")
            try:
                reached = [address for address in gateways
                           if self.gate.exec_run([GATE_PYTHON, "-c", dial, address]).exit_code == 0]
            except docker.errors.APIError as exc:
                raise DockerError(f"cannot check the internal network from the gate: {exc.explanation or exc}") \
                    from None
        if reached:
            raise DockerError(
                f"this engine gives the bottle's internal network an address on this host ({reached[0]}, bridge "
                f"{BRIDGE_PREFIX}{self.hex}) and the host answers there, so a bottle could reach this machine's "
                f"services. As root, drop what arrives from bottles' bridges (`iptables -I INPUT -i "
                f"{BRIDGE_PREFIX}+ -j DROP`, the same with ip6tables, and the rules that go with them in "
                "docs/engines.md, \"Podman\"; scripts/podman sets them all up), then start again")

    def wait_for_gate(self) -> None:
        """Return once the gate listens, with the CA certificate it announced in ``gate_ca``; a gate that exits
        instead is a GateError with its last words. Read from the gate's attached stream as its lines come."""
        assert self.gate is not None and self._gate_output is not None
        output, self._gate_output = self._gate_output, None
        try:
            lines = startup_lines(output, GATE_READY_SECONDS)
        finally:
            output.close()
        if lines is None:
            raise GateError(f"the gate did not become ready within {GATE_READY_SECONDS}s")
        if "claude-bottle gate: API on" not in lines:
            raise GateError(f"the gate stopped at start: {lines.strip().splitlines()[-1:] or 'no output'}")
        from claude_bottle.gate.ca import announced_ca  # cryptography: a tenth of a second to import

        certificate = announced_ca(lines)
        if certificate is None:
            raise GateError("the gate announced no CA certificate: its image is older than this "
                            "claude-bottle; run `claude-bottle build`")
        self.gate_ca = certificate

    def bottle_environment(self) -> dict[str, str]:
        spec = self.spec
        api, proxy = f"http://{self.gate_ip}:{API_PORT}", f"http://{self.gate_ip}:{PROXY_PORT}"
        credential_variable = ("CLAUDE_CODE_OAUTH_TOKEN" if spec.credential.kind is CredentialKind.OAUTH
                               else "ANTHROPIC_API_KEY")
        return {
            **spec.env,
            **CLAUDE_ENV,
            **CA_ENV,
            **spec.route_env,
            "ANTHROPIC_BASE_URL": api,
            credential_variable: spec.credential.placeholder(),
            "HTTPS_PROXY": proxy, "HTTP_PROXY": proxy, "https_proxy": proxy, "http_proxy": proxy,
            "NO_PROXY": self.gate_ip, "no_proxy": self.gate_ip,
            "HOME": HOME,
        }

    def create_bottle(self, command: list[str], tty: bool) -> Container:
        """The bottle, created and ready to start: it returns once the gate listens and its CA is in the
        bottle's trust store (``release``)."""
        bottle = self._create_bottle(command, tty)
        self.release()
        return bottle

    def start_bottle(self, command: list[str]) -> Container:
        """The bottle, without a terminal, started while the gate boots: its entrypoint holds ``command`` until
        ``release``, before which this does not return."""
        bottle = self._create_bottle(command, tty=False)
        try:
            bottle.start()
        except docker.errors.APIError as exc:
            raise DockerError(f"cannot start the bottle: {exc.explanation or exc}") from None
        self.release()
        return bottle

    def _create_bottle(self, command: list[str], tty: bool) -> Container:
        """The bottle: internal network only, user 1000, no capabilities, no new privileges, limits, and a
        resolver that answers nothing (its only peer is the gate, addressed by IP). Its trust store and git
        configuration are host files mounted read-only; its ~/.claude.json is written fresh by its entrypoint."""
        spec = self.spec
        assert self.internal is not None
        resources = spec.resources
        write_policy(self.id, spec_policy(spec))
        files = bottle_files(self.id)
        files.mkdir(parents=True, exist_ok=True)
        trust = files / "ca-certificates.crt"
        write_for_bottle(trust, b"")  # a file mount's source must exist; the image's bundle comes below
        mounts = [*(protection.mount() for protection in protective_mounts(spec.workspace, spec.protected)),
                  Mount(SYSTEM_BUNDLE, str(trust), type="bind", read_only=True)]
        if config := git_credentials(spec.git_routes):
            write_for_bottle(files / "gitconfig", config)
            mounts.append(Mount(GIT_CONFIG, str(files / "gitconfig"), type="bind", read_only=True))
        seed = seeded_claude_json(spec.credential.kind, spec.credential.placeholder(), spec.mcp_servers)
        environment = {**self.bottle_environment(), "CLAUDE_BOTTLE_CLAUDE_JSON": seed.decode(),
                       "CLAUDE_BOTTLE_READY_FILE": READY_FILE}
        try:
            state = self.client.volumes.create(state_volume(spec.agent, spec.workspace), labels={
                LABEL: "1", AGENT_LABEL: spec.agent, WORKSPACE_LABEL: str(spec.workspace)})
            with _uninterrupted():
                self.bottle = create_container(
                    self.client, spec.bottle_image, spec.userns, command=command,
                    name=f"claude-bottle-{self.id}-bottle", labels=self.labels,
                    user=spec.user, environment=environment, log_config=LOG_CONFIG,
                    network=self.internal.name,
                    dns=[self.gate_ip], dns_search=["."], dns_opt=["timeout:1", "attempts:1"],
                    working_dir="/workspace", tty=tty, stdin_open=tty, runtime=spec.runtime or None,
                    cap_drop=["ALL"], security_opt=["no-new-privileges"], pids_limit=resources.pids,
                    mem_limit=resources.memory, nano_cpus=int(resources.cpus * 1e9),
                    sysctls=PODMAN_SYSCTLS if spec.podman else None,
                    volumes={
                        str(spec.workspace): {"bind": "/workspace", "mode": "rw"},
                        **claude_state_mounts(state.name),
                        str(policy_dir(self.id)): {"bind": POLICY_DIR, "mode": "ro"},
                        **{str(source): {"bind": target, "mode": "ro" if read_only else "rw"}
                           for source, target, read_only in spec.mounts},
                    },
                    mounts=mounts,
                )
        except docker.errors.APIError as exc:
            raise DockerError(f"cannot create the bottle: {exc.explanation or exc}") from None
        bundle = image_trust_store(self.bottle)
        write_for_bottle(trust, bundle if bundle.endswith(b"\n") or not bundle else bundle + b"\n")
        return self.bottle

    def release(self) -> None:
        """Wait for the gate to listen, add its CA to the bottle's trust store, and let the bottle's command
        go on (``READY_FILE``)."""
        self.wait_for_gate()
        add_ca(bottle_files(self.id) / "ca-certificates.crt", self.gate_ca)
        ready = policy_dir(self.id) / READY_FILE.rsplit("/", 1)[1]
        ready.write_text("the gate listens\n")
        ready.chmod(0o644)

    def stop_gate(self) -> None:
        """Stop the gate (SIGTERM: what is in flight finishes, every line is written) ahead of ``remove``, which
        then only keeps its audit: once the bottle's processes are gone, while the engine finishes with it."""
        if self.gate is not None:
            with contextlib.suppress(docker.errors.APIError):
                self.gate.stop(timeout=GATE_STOP_SECONDS)

    def remove(self) -> None:
        if self._gate_output is not None:  # a start that ended before the gate was waited for
            self._gate_output.close()
            self._gate_output = None
        remove_run(self.client, self.id)


def network_gateways(network: Network) -> list[str]:
    """The gateway addresses a network's IPAM names: none for Podman's internal networks without a resolver
    (which its Docker-compatible API shows as "<nil>")."""
    found = []
    for pool in network.attrs.get("IPAM", {}).get("Config") or []:
        with contextlib.suppress(ValueError):
            found.append(str(ipaddress.ip_address(pool.get("Gateway") or "")))
    return found


def keep_audit(gate: Container) -> None:
    """Stop the gate, then copy its audit to the host (``claude_bottle.records``).

    The copy is taken here, at removal, because removal is the one step every ending of a run goes through:
    ``run -p``, the end or Ctrl-C of ``start``, ``stop`` from another terminal, ``start --keep`` then ``stop``,
    ``verify``. The gate writes a connection's line when it closes, so it is stopped first (SIGTERM: it
    finishes what is in flight, the bottle being gone). Its log is bounded by the engine (LOG_CONFIG) and the
    copy by the records' caps. A run whose CLI was killed outright is copied when `stop` removes it."""
    with contextlib.suppress(docker.errors.APIError):
        gate.stop(timeout=GATE_STOP_SECONDS)
    labels = gate.labels
    started = str(gate.attrs.get("Created", ""))[:23] + "Z"  # to the millisecond, like the end
    try:
        records.save(labels.get(RUN_LABEL, ""), labels.get(AGENT_LABEL, ""), labels.get(WORKSPACE_LABEL, ""),
                     started, gate.logs(stdout=False, stderr=True, stream=True))
    except OSError as exc:
        raise BottleError(f"cannot keep the audit of run {labels.get(RUN_LABEL)} in {records.runs_dir()}: "
                          f"{exc.strerror or exc}; its gate stays, so nothing is lost: fix that, then run "
                          f"`claude-bottle stop {labels.get(AGENT_LABEL)}`") from None


def remove_run(client: docker.DockerClient, run_id: str) -> None:
    """Remove a run: its bottle (and any other container), then its gate once its audit is kept on the host,
    then its claim on its internal network (which stays for a later run) or the network itself, and the
    files its bottle was given; each kind at once. A bottle that no longer runs has closed its connections to
    the gate, so then its removal and the gate's stop go together. Safe to call at any point and more than
    once."""
    run = {"label": f"{RUN_LABEL}={run_id}"}

    def remove(resource: Container | Network) -> None:
        with contextlib.suppress(docker.errors.NotFound):
            if isinstance(resource, Container):
                resource.remove(force=True)
            else:
                resource.remove()

    containers = client.containers.list(all=True, filters=run)
    gates = [c for c in containers if c.name.endswith("-gate")]
    claims = [c for c in containers if c.name.endswith("-claim")]
    others = [c for c in containers if c not in gates and c not in claims]
    with ThreadPoolExecutor(4) as pool:
        if any(c.status in ("running", "paused", "restarting") for c in others):
            list(pool.map(remove, others))  # its connections stay open until it is gone
            others = []
        removed = [pool.submit(remove, c) for c in others]
        list(pool.map(keep_audit, gates))
        for future in removed:
            future.result()
        list(pool.map(remove, gates))
        list(pool.map(remove, claims))  # the network is free once nothing of the run is on it
        list(pool.map(remove, client.networks.list(filters=run)))
    if claims:
        with contextlib.suppress(DockerError):  # housekeeping: a later run's end trims again
            trim_pool(client, str(claims[0].attrs.get("Image", "")))
    shutil.rmtree(bottle_files(run_id), ignore_errors=True)


def runs(client: docker.DockerClient) -> list[dict[str, str]]:
    """One entry per run that has a container: agent, run id, the bottle's (or gate's) status, workspace."""
    found: dict[str, dict[str, str]] = {}
    for container in client.containers.list(all=True, filters={"label": LABEL}):
        run_id = container.labels.get(RUN_LABEL, "")
        entry = found.setdefault(run_id, {"agent": container.labels.get(AGENT_LABEL, ""), "run": run_id,
                                          "status": container.status,
                                          "workspace": container.labels.get(WORKSPACE_LABEL, "")})
        if container.name.endswith("-bottle"):
            entry["status"] = container.status
            for mount in container.attrs.get("Mounts", []):
                if mount.get("Destination") == "/workspace" and not entry["workspace"]:
                    entry["workspace"] = mount.get("Source", "")
    return sorted(found.values(), key=lambda r: (r["agent"], r["run"]))


def running_run(client: docker.DockerClient, agent: str | None, workspace: Path | None) -> str | None:
    """The run (still present: running, or kept) of ``agent`` on ``workspace``, None meaning any; None when
    there is none, a DockerError when several match and no agent was named."""
    matching = [r for r in runs(client) if (agent is None or r["agent"] == agent)
                and (workspace is None or r["workspace"] == str(workspace))]
    if len(matching) > 1 and agent is None:
        raise DockerError("several bottles are running; name the AGENT (see `claude-bottle ls`)")
    return matching[-1]["run"] if matching else None


def _container_of(client: docker.DockerClient, agent: str | None, workspace: Path | None, role: str) -> Container:
    """The workspace's bottle first, else any matching one (the only one, when no agent is named)."""
    run_id = (workspace and running_run(client, agent, workspace)) or running_run(client, agent, None)
    if run_id is None:
        raise DockerError(f"no running bottle{f' for agent {agent}' if agent else ''}; see `claude-bottle ls`")
    try:
        return client.containers.get(f"claude-bottle-{run_id}-{role}")
    except docker.errors.NotFound:
        raise DockerError(f"run {run_id} has no {role} container; remove it with `claude-bottle stop`") from None


def gate_of(client: docker.DockerClient, agent: str | None, workspace: Path | None = None) -> Container:
    return _container_of(client, agent, workspace, "gate")


def bottle_of(client: docker.DockerClient, agent: str | None, workspace: Path | None = None) -> Container:
    return _container_of(client, agent, workspace, "bottle")
