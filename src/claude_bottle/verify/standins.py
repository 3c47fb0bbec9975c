"""The stand-ins of ``claude-bottle verify`` and the bottles started against them.

The bottle is the agent's own (its allowlist, mounts, limits and images) with three stand-ins: a throwaway
credential, a stub Messages API as the upstream, and a scratch workspace. A second stub plays a host outside
the bottle, on a private address: the gate could reach it, the bottle must not; HTTPS stand-ins the gate
inspects, a remote MCP server (``verify.mcp_server``) added to the agent with tool rules and a credential
route of its own, and a listener on the host, complete them. This is the one module of ``verify`` that speaks to the
container engine, and only through its seam (``runtime.seam``): the attacks reach the bottle, the stand-ins
and the probe through the functions and values here.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import secrets
import socket
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from claude_bottle.agent.credential_config import CredentialConfig
from claude_bottle.agent.schema import AgentConfig, McpServer
from claude_bottle.credentials import Credential
from claude_bottle.errors import DockerError, GateError
from claude_bottle.gate.ca import RunCA
from claude_bottle.gate.routes import CredentialRoute, Scheme, new_sentinel
from claude_bottle.gate.settings import parse_upstream
from claude_bottle.gate.upstream_proxy import UpstreamProxy
from claude_bottle.launch import Launch, Progress, build_images, interrupt, on_stop_signals, started
from claude_bottle.persistence import make_repository, share
from claude_bottle.policy.addresses import parse_network
from claude_bottle.policy.hosts import Allowlist, parse_pattern
from claude_bottle.policy.mcp import McpServerRules
from claude_bottle.policy.rules import HostRules, make_host_rules
from claude_bottle.runtime.engines import open_engine
from claude_bottle.runtime.interrupts import uninterrupted
from claude_bottle.runtime.names import RunNames, state_volume
from claude_bottle.runtime.removal import remove_run
from claude_bottle.runtime.run import Run
from claude_bottle.runtime.seam import ContainerSpec, Engine, NetworkSpec

STUB_PORT = 8000
PRIVATE_NAME = f"canary:{STUB_PORT}"  # allowlisted on purpose: the name resolves to a private address
FRONT = "front"  # an allowed host the bottle may reach (its address too), to attack what tunnels carry
# HTTPS stand-ins the gate inspects: one open to any request (DLP alone judges what it carries), one under
# the read-only rules of the -read presets. Their CA is verify's own, trusted by the gate toward them only.
INSPECTED, READ_ONLY = "inspected", "registry"
TLS_PORT = 8443
# The remote MCP server added to the agent under test: its host (an HTTPS stand-in under verify's CA), its tool
# rules, and the credential route bound to it (``mcp_server_of``).
TRACKER, MCP_PATH = "tracker", "/mcp"
MCP_TOOLS, MCP_DENY_TOOLS = ("search_*", "get_issue"), ("delete_*",)
PROBE_SECONDS = 120
IN_BOTTLE_SECONDS = 300  # a script run in the bottle (in_bottle): a bound for a bottle that died under it
# The host-side name of the stand-ins' bridge: unlike a bottle's (runtime/pool.py BRIDGE_PREFIX), the host
# serves the gate there (Podman's resolver answers on the bridge's address).
STAND_IN_BRIDGE = "stand-"


class HostCanary:
    """A TCP and a UDP socket on every address of the Docker host: anything arriving came from a bottle that
    reached the host. Nothing is read or answered; pending connections and datagrams are only counted."""

    def __init__(self) -> None:
        for _ in range(20):
            self.tcp = socket.create_server(("0.0.0.0", 0))
            self.port = self.tcp.getsockname()[1]
            self.udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            try:
                self.udp.bind(("0.0.0.0", self.port))
                break
            except OSError:
                self.close()
        else:
            raise DockerError("cannot open a listening port on this host for the host-reachability check")
        self.tcp.setblocking(False)
        self.udp.setblocking(False)

    def arrivals(self) -> list[str]:
        seen = []
        for sock in (self.tcp, self.udp):
            with contextlib.suppress(BlockingIOError):
                while True:
                    if sock is self.tcp:
                        conn, peer = sock.accept()
                        conn.close()
                        seen.append(f"TCP from {peer[0]}")
                    else:
                        seen.append(f"UDP from {sock.recvfrom(2048)[1][0]}")
        return seen

    def close(self) -> None:
        self.tcp.close()
        self.udp.close()


@dataclass(frozen=True)
class StandIn:
    """A stand-in's container (``name``) on the engine that runs it, and its ``address`` on the stand-ins'
    network."""

    engine: Engine
    name: str
    address: str

    def requests(self) -> list[dict[str, Any]]:
        """The requests it logged, one JSON object each (its target, headers and what it noticed)."""
        output = b"".join(self.engine.logs(self.name, stderr=False)).decode("utf-8", "replace")
        return [json.loads(line) for line in output.splitlines() if line.startswith("{")]


@dataclass
class Verification:
    """A started bottle under test and what the attacks need to know about it."""

    run: Run
    credential: Credential
    stub: StandIn  # the stub Messages API, the gate's upstream
    canary: StandIn  # a host outside the bottle that the gate could reach
    gate_image: str
    host: HostCanary
    host_addresses: tuple[str, ...]
    https: dict[str, StandIn]  # the HTTPS stand-ins the gate inspects, by name
    mcp: StandIn  # the remote MCP server
    mcp_server: str  # its name in the agent, which is also its credential route's
    attacker_key: str = dataclasses.field(default_factory=lambda: "sk-ant-api03-attacker-" + secrets.token_hex(16))


def throwaway_credential() -> Credential:
    return Credential.parse("sk-ant-oat01-verify-" + secrets.token_urlsafe(48), "the throwaway credential")


def scratch_workspace(root: str) -> Path:
    """A project with a repository in it: a real one where git is installed, so that what a bottle plants for
    the host's git is judged by the host's git."""
    workspace = Path(root) / "workspace"
    workspace.mkdir()
    if not make_repository(workspace, Path(root)):
        (workspace / ".git" / "hooks").mkdir(parents=True)
        (workspace / ".git" / "config").write_text("[core]\n")
    share(workspace)
    return workspace


@contextlib.contextmanager
def _verify_asked() -> Iterator[None]:
    """The engine's refusal of what verify asks for itself (its stand-ins, its probe), said as verify's."""
    try:
        yield
    except DockerError as exc:
        raise DockerError(f"verify: {exc}") from None


def _wait_for_log(engine: Engine, name: str, line: str, what: str, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while line not in (logs := b"".join(engine.logs(name)).decode("utf-8", "replace")):
        found = engine.container(name)
        if found is None or found.status in ("exited", "dead") or time.monotonic() > deadline:
            raise GateError(f"{what} did not start: {logs.strip()[-300:] or 'no output'}")
        time.sleep(0.1)


# What a stand-in runs (``python -m`` these), each with the same options: --listen, --log, --tls.
STUB = ("claude_bottle", "stub-upstream")  # the stub Messages API
MCP_STAND_IN = ("claude_bottle.verify.mcp_server",)  # the remote MCP server


def stub_container(engine: Engine, image: str, network: str, alias: str, name: str,
                   labels: dict[str, str], tls: Path | None = None, program: tuple[str, ...] = STUB) -> StandIn:
    """A stand-in from the gate image (``program``: the stub Messages API, or ``MCP_STAND_IN``), known on
    ``network`` as ``alias``, logging each request; with ``tls`` (a PEM file of a chain and key, mounted
    read-only), on HTTPS port ``TLS_PORT``."""
    port, served = (STUB_PORT, ()) if tls is None else (TLS_PORT, ("--tls", "/opt/stub/tls.pem"))
    with uninterrupted():
        engine.create_container(ContainerSpec(
            image, name, labels, entrypoint=("/opt/gate/bin/python", "-m", *program, "--listen", f"{alias}:{port}",
                                             "--log", *served),
            network=network, aliases=(alias,), binds=((str(tls), "/opt/stub/tls.pem", True),) if tls else (),
            read_only=True))
    engine.start(name)
    _wait_for_log(engine, name, " on http", f"the {alias} container")
    return StandIn(engine, name, engine.address(name, network))


def _gateways(engine: Engine, names: list[str]) -> tuple[str, ...]:
    found: list[str] = []
    for name in names:
        network = engine.network(name)
        found += network.gateways if network is not None else ()
    return tuple(dict.fromkeys(found))


@dataclass
class StandIns:
    """What every bottle of a verify run is started against: the throwaway credential, the stub upstream and a
    host outside the bottle (and an allowed front host) on a network only gates join, and the host canary."""

    engine: Engine
    agent: AgentConfig  # the agent under test, with the stand-ins allowed
    credential: Credential
    stub: StandIn
    canary: StandIn
    gate_image: str
    outside: str  # the network of the stand-ins
    host: HostCanary
    progress: Progress
    https: dict[str, StandIn]  # the HTTPS stand-ins by name (INSPECTED, READ_ONLY)
    https_ca: Path  # their CA (and the MCP server's), trusted by the gate toward them
    mcp: StandIn  # the remote MCP server
    mcp_server: str  # its name in the agent, and its credential route's
    workspaces: list[Path] = dataclasses.field(default_factory=list)  # scratch projects bottles were started on


@contextlib.contextmanager
def stand_ins(agent: AgentConfig, progress: Progress, credential: Credential | None = None,
              proxy: UpstreamProxy | None = None) -> Iterator[StandIns]:
    """The stand-ins, removed on the way out (Ctrl-C included), with every bottle started against them. The
    images are built through ``proxy``; the gates reach the stand-ins directly (no proxy could reach them)."""
    credential = credential or throwaway_credential()
    verify_hex = secrets.token_hex(4)
    names = RunNames(f"verify-{verify_hex}", agent.name)
    verify_id, labels = names.id, names.labels
    workspaces: list[Path] = []
    with on_stop_signals(interrupt), tempfile.TemporaryDirectory(prefix="claude-bottle-verify-tls-") as tls:
        engine = open_engine()
        host = HostCanary()
        try:
            _, gate_image = build_images(engine, agent, progress, proxy)
            progress("starting the stub upstream and a host outside the bottle")
            ca, files = _https_files(Path(tls))
            with _verify_asked():
                with uninterrupted():
                    outside = engine.create_network(NetworkSpec(names.container("outside"), labels, internal=True,
                                                                bridge=STAND_IN_BRIDGE + verify_hex))
                stub, canary, front = (stub_container(engine, gate_image, outside.name, alias,
                                                      names.container(alias), labels)
                                       for alias in ("stub", "canary", FRONT))
                https = {name: stub_container(engine, gate_image, outside.name, name, names.container(name),
                                              labels, files[name]) for name in (INSPECTED, READ_ONLY)}
                mcp = stub_container(engine, gate_image, outside.name, TRACKER, names.container(TRACKER), labels,
                                     files[TRACKER], MCP_STAND_IN)
            # The stand-ins speak plain HTTP, and these attacks are on what an opaque tunnel carries: tunnels to
            # them stay opaque (still under the first-flight check), else the gate's own TLS to them would fail
            # before any attack reached them.
            opaque = tuple(HostRules(parse_pattern(p), inspect=False) for p in (PRIVATE_NAME, f"{FRONT}:{STUB_PORT}",
                                                                               FRONT))
            server, route = mcp_server_of(agent)
            tested = dataclasses.replace(
                agent, allow=Allowlist((*agent.allow.patterns, *(parse_pattern(p) for p in (
                    PRIVATE_NAME, f"{FRONT}:{STUB_PORT}", FRONT, f"{INSPECTED}:{TLS_PORT}")))),
                egress=dataclasses.replace(agent.egress, hosts=(*agent.egress.hosts, *opaque, *inspected_rules())),
                allow_private=(*agent.allow_private,
                               *(parse_network(f"{c.address}/32") for c in (front, *https.values(), mcp))),
                mcp_servers=(*agent.mcp_servers, server), credentials=(*agent.credentials, route))
            yield StandIns(engine, tested, credential, stub, canary, gate_image, outside.name, host, progress,
                           https, ca, mcp, server.name, workspaces)
        finally:
            with on_stop_signals(lambda signum, frame: None):
                try:
                    remove_run(engine, verify_id)
                except DockerError as exc:  # the report still comes: what is left is named, with its remedy
                    progress(f"verify could not remove all it started: {exc}")
                for workspace in workspaces:  # the scratch projects' Claude state: of no later use
                    with contextlib.suppress(DockerError):
                        engine.remove_volume(state_volume(agent.name, workspace))
            host.close()


def inspected_rules() -> tuple[HostRules, ...]:
    """The ``[[egress]]`` entries of the HTTPS stand-ins: the read-only one under the rules of the -read
    presets (GET and HEAD only); the open one needs none (it is in the allowlist, so inspected)."""
    return (make_host_rules(f"{READ_ONLY}:{TLS_PORT}", allow=["GET /**", "HEAD /**"]),)


def mcp_server_of(agent: AgentConfig) -> tuple[McpServer, CredentialConfig]:
    """The remote MCP server verify adds to ``agent`` (``https://tracker:8443/mcp`` with ``MCP_TOOLS`` and
    ``MCP_DENY_TOOLS``) and the credential route bound to it, both under one name the agent does not use."""
    taken = {s.name for s in agent.mcp_servers} | {c.name for c in agent.credentials}
    name = next(n for n in (f"verify-{TRACKER}{f'-{i}' if i else ''}" for i in range(len(taken) + 1))
                if n not in taken)
    rules = McpServerRules(name, TRACKER, TLS_PORT, MCP_TOOLS, MCP_DENY_TOOLS)
    server = McpServer(name, url=f"https://{TRACKER}:{TLS_PORT}{MCP_PATH}", allow_entry=rules.allow_entry,
                       rules=rules, credential=name)
    return server, CredentialConfig(name, ((TRACKER, TLS_PORT),), Scheme.BEARER, origin="verify's MCP server")


def _https_files(folder: Path) -> tuple[Path, dict[str, Path]]:
    """A CA for the HTTPS stand-ins' names only, and a leaf for each: (the CA's certificate, the leaves
    with their keys), as files in ``folder`` (readable by the stand-ins' and the gate's users)."""
    ca = RunCA.generate(Allowlist.parse([INSPECTED, READ_ONLY, TRACKER]).patterns)
    files = {"ca": ca.certificate_pem, **{name: ca.issue(name) for name in (INSPECTED, READ_ONLY, TRACKER)}}
    paths = {}
    for name, data in files.items():
        paths[name] = folder / f"{name}.pem"
        paths[name].write_bytes(data)
        paths[name].chmod(0o644)
    return paths.pop("ca"), paths


@contextlib.contextmanager
def bottle_on(env: StandIns, workspace: Path) -> Iterator[Verification]:
    """A sleeping bottle of the agent on ``workspace``, started the way ``start`` would, against the stand-ins;
    the run is removed on the way out (its Claude state stays until the stand-ins go, for later bottles)."""
    env.workspaces.append(workspace)
    # The agent's credential routes get throwaway values too: verify never reads the user's.
    routes = tuple(CredentialRoute(c.spec(new_sentinel(c.name)), "verify-" + secrets.token_urlsafe(24))
                   for c in env.agent.credentials)
    launch = Launch(env.agent, workspace, env.credential, parse_upstream(f"http://stub:{STUB_PORT}"), (env.outside,),
                    upstream_ca_files=(env.https_ca,), routes=routes)
    # The run's review of protected files is verify's own business (the persistence group judges it).
    with started(launch, env.progress, review=lambda report: None) as run:
        assert run.internal is not None and run.egress is not None
        run.start_bottle(["sleep", "infinity"])
        yield Verification(run, env.credential, env.stub, env.canary, env.gate_image, env.host,
                           _gateways(env.engine, ["bridge", run.internal.name, run.egress.name, env.outside]),
                           env.https, env.mcp, env.mcp_server)


@contextlib.contextmanager
def verification(agent: AgentConfig, progress: Progress,
                 credential: Credential | None = None) -> Iterator[Verification]:
    """The agent's bottle on a scratch workspace, started against the stand-ins; everything is removed on the
    way out, Ctrl-C included."""
    with tempfile.TemporaryDirectory(prefix="claude-bottle-verify-") as scratch, \
            stand_ins(agent, progress, credential) as env, bottle_on(env, scratch_workspace(scratch)) as target:
        yield target


def in_bottle(run: Run, script: str, stdin: str | None = None) -> tuple[int, str]:
    """``script`` in bash in the bottle, as the agent user (the bottle's own); ``stdin`` goes in as a
    here-document (a pipe, never a file or argv). A DockerError after ``IN_BOTTLE_SECONDS``: every script
    bounds its own steps far below that, so only a bottle that died under it gets there."""
    if stdin is not None:
        script = f"{script} <<'__CLAUDE_BOTTLE_END__'\n{stdin}\n__CLAUDE_BOTTLE_END__"
    code, output = run.engine.exec(run.names.bottle, ["bash", "-c", script], timeout=IN_BOTTLE_SECONDS)
    return code, output.decode("utf-8", "replace")


def stub_requests(target: Verification) -> list[dict[str, Any]]:
    """The requests the stub upstream logged."""
    return target.stub.requests()


def engine_view(run: Run) -> str:
    """What the engine shows the host of the bottle and the gate (``docker inspect``), as text."""
    return "".join(json.dumps(run.engine.inspect(name)) for name in (run.names.bottle, run.names.gate))


def run_probe(target: Verification, targets: dict[str, Any]) -> str:
    """The probe (``claude_bottle.verify.probe``) run on ``targets`` in a container sharing the bottle's network
    namespace, as the agent user, unprivileged: what it printed, one JSON outcome a line."""
    run = target.run
    engine, probe = run.engine, run.names.container("probe")
    with _verify_asked():
        try:
            with uninterrupted():
                engine.create_container(ContainerSpec(
                    target.gate_image, probe, run.labels,
                    entrypoint=("/opt/gate/bin/python", "-m", "claude_bottle.verify.probe", json.dumps(targets)),
                    network_of=run.names.bottle, user=run.spec.user, read_only=True))
            engine.start(probe)
            status = engine.wait(probe, timeout=PROBE_SECONDS)
            output = b"".join(engine.logs(probe, stderr=False)).decode("utf-8", "replace")
            if status:
                errors = b"".join(engine.logs(probe, stdout=False)).decode()
                raise GateError(f"the network probe failed: {errors[-500:]}")
        finally:
            engine.remove_container(probe)
    return output
