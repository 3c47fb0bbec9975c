"""One run of an agent: its internal network, its gate, its bottle, from start to removal.

Everything a run creates carries its labels (``runtime.names``); ``Run.remove`` (and ``claude-bottle stop``)
removes by them, so an interrupted start leaves nothing behind whatever step it reached.
"""

from __future__ import annotations

import contextlib
import ipaddress
import socket
import threading
from concurrent.futures import ThreadPoolExecutor

from claude_bottle.credentials import CredentialKind
from claude_bottle.errors import ConfigError, DockerError, GateError
from claude_bottle.runtime.files import (
    CA_ENV,
    GIT_CONFIG,
    POLICY_DIR,
    READY_FILE,
    SYSTEM_BUNDLE,
    add_ca,
    bottle_files,
    claude_state_mounts,
    git_credentials,
    image_trust_store,
    policy_dir,
    protective_mounts,
    seeded_claude_json,
    spec_policy,
    write_for_bottle,
    write_policy,
)
from claude_bottle.runtime.gate import (
    GATE_ALIAS,
    GATE_MEMORY,
    GATE_PIDS_LIMIT,
    GATE_PYTHON,
    GATE_READY_SECONDS,
    GATE_STOP_SECONDS,
    GATE_TMPFS,
    ca_from_ready_line,
    gate_options,
    startup_lines,
    upstream_ca_mounts,
)
from claude_bottle.runtime.interrupts import uninterrupted
from claude_bottle.runtime.lifeline import SILENCE_SECONDS, Heartbeat, Lifeline
from claude_bottle.runtime.names import (
    RunNames,
    state_volume,
)
from claude_bottle.runtime.pool import (
    BRIDGE_PREFIX,
    claim_internal,
    egress_network,
)
from claude_bottle.runtime.removal import remove_run
from claude_bottle.runtime.seam import ENDED, ContainerInfo, ContainerSpec, Engine, Mount, NetworkInfo, NetworkSpec
from claude_bottle.runtime.spec import API_PORT, HOME, PROXY_PORT, RunSpec
from claude_bottle.runtime.stillness import held_still

# Podman: the internal network has no resolver (nor, with it, a gateway address), and the gate is given this
# address of its subnet, where it listens.
PODMAN_GATE_HOST = 2
HOST_PROBE_SECONDS = 1  # a firewall that drops what comes in from a bridge makes the check wait this long
STARTED_POLL_SECONDS = 0.05  # how often a created bottle is looked at, until it has started and its mounts are made

# Claude Code's own calls home that the bottle never needs (see docs/gate.md).
CLAUDE_ENV = {
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    "CLAUDE_CODE_DISABLE_OFFICIAL_MARKETPLACE_AUTOINSTALL": "1",
    "DISABLE_AUTOUPDATER": "1",
    "DISABLE_TELEMETRY": "1",
    "DISABLE_ERROR_REPORTING": "1",
}


class Run:
    """A run: ``start_gate()``, then the bottle (``start_bottle``; or ``create_bottle`` or
    ``create_held_bottle`` to start it yourself); always ``remove()`` (it is idempotent). Everything it does
    goes through ``engine``; its containers are known by their names (``names.gate``, ``names.bottle``)."""

    def __init__(self, spec: RunSpec, engine: Engine) -> None:
        self.spec = spec
        self.names = RunNames.new(spec.agent, spec.workspace)
        self.hex = self.names.hex
        self.id = self.names.id
        self.labels = self.names.labels
        self.engine = engine
        self.internal: NetworkInfo | None = None
        self.egress: NetworkInfo | None = None
        self.gate_started = False
        self.gate_ip = ""
        self.gate_ca = b""  # the gate's CA certificate (PEM), as it announced it; set by wait_for_gate
        self._gate_output: socket.socket | None = None  # the gate's attached stream, until it says it listens
        self.lifeline: Lifeline | None = None  # the same stream from then on, held until the run ends
        self.heartbeat: Heartbeat | None = None  # beats on it, where the engine needs them
        self.gate_lost = threading.Event()  # the gate ended while the bottle ran: set before its removal
        self.gate_listen = GATE_ALIAS  # the gate's name or (Podman) address on the internal network
        self._still = contextlib.ExitStack()  # bottles held still while this one's mounts are checked and made
        self._still_lock = threading.Lock()
        self._still_over = threading.Event()

    def _internal_network(self) -> NetworkInfo:
        """The run's own network, the bottle's only one: no route out, and its only other member the gate.
        Kept between runs where the engine's are alike (``claim_internal``); else made for this run, where
        the gate listens at ``gate_listen``, an address it is given, when nothing resolves its name there.
        Either way its bridge is named ``bottle-<hex>``, for firewall rules (docs/engines.md)."""
        if self.engine.pooled_networks:
            return claim_internal(self.engine, self.spec.gate_image, self.labels)
        name = self.names.internal
        with uninterrupted():
            network = self.engine.create_network(NetworkSpec(name, self.labels, internal=True, isolated=True,
                                                             bridge=BRIDGE_PREFIX + self.hex))
        if not self.engine.internal_names:
            v4 = [subnet for subnet in map(ipaddress.ip_network, network.subnets) if subnet.version == 4]
            if not v4:
                raise DockerError(f"the engine gave the internal network {name} no IPv4 subnet ({network.subnets})")
            self.gate_listen = str(v4[0].network_address + PODMAN_GATE_HOST)
        return network

    def start_gate(self) -> None:
        """The gate joins the egress network, then the run's internal one, and listens on its internal address
        only. The token goes in over the attached stdin: never an argument, a variable or a file."""
        spec = self.spec
        with uninterrupted(), ThreadPoolExecutor(2) as pool:  # held by this thread while its workers create
            internal, egress = pool.submit(self._internal_network), pool.submit(egress_network, self.engine)
            self.internal, self.egress = internal.result(), egress.result()
        beats = not self.engine.stdin_ends_with_client
        gate, options = self.names.gate, gate_options(spec, self.gate_listen, SILENCE_SECONDS if beats else 0.0)
        try:
            with uninterrupted():
                self.engine.create_container(ContainerSpec(
                    spec.gate_image, gate, self.labels, command=tuple(options.args()),
                    stdin_open=True, network=self.egress.id, read_only=True, tmpfs=GATE_TMPFS,
                    pids_limit=GATE_PIDS_LIMIT, memory=GATE_MEMORY, bounded_logs=True,
                    binds=tuple((source, mount["bind"], True) for source, mount in upstream_ca_mounts(spec).items())))
            if self.engine.internal_names:
                self.engine.connect(self.internal.name, gate, alias=GATE_ALIAS)
            else:  # no names on that network: the address the gate listens on
                self.engine.connect(self.internal.name, gate, address=self.gate_listen)
            for name in spec.upstream_networks:
                self.engine.connect(name, gate)
            # Attached before it starts, so its start-up lines are all read here (wait_for_gate): no polling.
            raw = self.engine.start_attached(gate)
            self.gate_started = True
            self._gate_output = raw
            raw.sendall(options.stdin())  # and held open: the gate stops when it closes (runtime/lifeline.py)
            if beats:
                self.heartbeat = Heartbeat(raw)
                self.heartbeat.start()
            self.gate_ip = self.engine.address(gate, self.internal.name)  # assigned by now, while it boots
        except DockerError as exc:
            raise DockerError(f"cannot start the gate: {exc}") from None

    def check_host_unreachable(self) -> None:
        """A DockerError unless this host is out of the internal network's reach at the bridge's gateway address.

        Docker gives an internal bridge no address on the host (``inhibit_ipv4``); Podman gives it one, and a
        bottle would reach whatever the host serves there or on 0.0.0.0. The gate, on the same network, dials
        a port this host listens on at that address: a connection dropped on the way (the firewall rule
        docs/engines.md gives) or refused is fine; a connection made is refused here, before any bottle
        exists."""
        assert self.internal is not None and self.gate_started
        now = self.engine.network(self.internal.name)
        gateways = [address for address in (now.gateways if now else ()) if ":" not in address]
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
                           if self.engine.exec(self.names.gate, [GATE_PYTHON, "-c", dial, address])[0] == 0]
            except DockerError as exc:
                raise DockerError(f"cannot check the internal network from the gate: {exc}") from None
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
        assert self.gate_started and self._gate_output is not None
        output, self._gate_output = self._gate_output, None
        try:
            self.gate_ca = ca_from_ready_line(startup_lines(output, GATE_READY_SECONDS))
        except BaseException:
            output.close()
            raise
        self.lifeline = Lifeline(output, self._gate_ended)
        self.lifeline.follow()

    def _gate_ended(self) -> None:
        """The gate's stream ended, not by this run's doing. A bottle already gone or exited went first
        (``stop`` from another terminal removes the bottle before the gate): the run is over, nothing lost.
        Else (the bottle running, or created and about to start) the gate is gone while the run goes on:
        remove the bottle, so that what waits on it (the command)
        ends instead of Claude Code retrying against nothing; ``check_gate`` then says why."""
        try:
            bottle = self.engine.container(self.names.bottle)
        except DockerError:
            bottle = None
        if bottle is None or bottle.status in ENDED:
            return
        self.gate_lost.set()
        with contextlib.suppress(DockerError):
            self.engine.remove_container(self.names.bottle)

    def check_gate(self) -> None:
        """A GateError when the gate stopped while the bottle ran (``gate_lost``), the bottle removed."""
        if self.gate_lost.is_set():
            raise GateError("the gate stopped while the run went on (it exited, was killed, or the engine lost "
                            "it): the bottle is removed and the run ended; its audit is kept (`claude-bottle "
                            "logs`)")

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

    def create_bottle(self, command: list[str], tty: bool) -> ContainerInfo:
        """The bottle (``names.bottle``), created and ready to start: it returns once the gate listens and
        its CA is in the bottle's trust store (``release``)."""
        bottle = self._create_bottle(command, tty)
        self.release()
        return bottle

    def create_held_bottle(self, command: list[str], stdin: bool) -> ContainerInfo:
        """The bottle, without a terminal (and with an open standard input if ``stdin``), created and not yet
        released: whoever starts it attached gets everything Claude Code writes while the gate boots; its
        entrypoint holds ``command`` until ``release``."""
        return self._create_bottle(command, tty=False, stdin=stdin)

    def start_bottle(self, command: list[str]) -> ContainerInfo:
        """The bottle, without a terminal, started while the gate boots: its entrypoint holds ``command`` until
        ``release``, before which this does not return."""
        bottle = self._create_bottle(command, tty=False)
        try:
            self.engine.start(self.names.bottle)
        except DockerError as exc:
            raise DockerError(f"cannot start the bottle: {exc}") from None
        self.release()
        return bottle

    def _create_bottle(self, command: list[str], tty: bool, stdin: bool = False) -> ContainerInfo:
        """The bottle: internal network only, user 1000, no capabilities, no new privileges, limits, and a
        resolver that answers nothing (its only peer is the gate, addressed by IP). Its trust store and git
        configuration are host files mounted read-only; its ~/.claude.json is written fresh by its entrypoint."""
        spec = self.spec
        assert self.internal is not None
        resources = spec.resources
        self._hold_neighbours()
        write_policy(self.id, spec_policy(spec))
        files = bottle_files(self.id)
        files.mkdir(parents=True, exist_ok=True)
        trust = files / "ca-certificates.crt"
        write_for_bottle(trust, b"")  # a file mount's source must exist; the image's bundle comes below
        mounts = [*(protection.mount() for protection in protective_mounts(spec.workspace, spec.protected)),
                  Mount(SYSTEM_BUNDLE, str(trust))]
        if config := git_credentials(spec.git_routes):
            write_for_bottle(files / "gitconfig", config)
            mounts.append(Mount(GIT_CONFIG, str(files / "gitconfig")))
        seed = seeded_claude_json(spec.credential.kind, spec.credential.placeholder(), spec.mcp_servers)
        environment = {**self.bottle_environment(), "CLAUDE_BOTTLE_CLAUDE_JSON": seed.decode(),
                       "CLAUDE_BOTTLE_READY_FILE": READY_FILE,
                       "CLAUDE_BOTTLE_GATE": f"{self.gate_ip}:{API_PORT}"}  # watched by the entrypoint
        try:
            with uninterrupted():
                state = self.engine.create_volume(state_volume(spec.agent, spec.workspace), self.names.volume_labels)
        except DockerError as exc:
            raise DockerError(f"cannot create the bottle: {exc}") from None
        volumes = {
            str(spec.workspace): {"bind": "/workspace", "mode": "rw"},
            **claude_state_mounts(state),
            str(policy_dir(self.id)): {"bind": POLICY_DIR, "mode": "ro"},
            **{str(source): {"bind": target, "mode": "ro" if read_only else "rw"}
               for source, target, read_only in spec.mounts},
        }
        try:
            with uninterrupted():
                created = self.engine.create_container(ContainerSpec(
                    spec.bottle_image, self.names.bottle, self.labels, command=tuple(command),
                    user=spec.user, environment=environment, bounded_logs=True, network=self.internal.name,
                    dns=(self.gate_ip,), dns_search=(".",), dns_opt=("timeout:1", "attempts:1"),
                    working_dir="/workspace", tty=tty, stdin_open=tty or stdin, runtime=spec.runtime,
                    pids_limit=resources.pids, memory=resources.memory, nano_cpus=int(resources.cpus * 1e9),
                    binds=tuple((source, mount["bind"], mount["mode"] == "ro") for source, mount in volumes.items()),
                    mounts=tuple(mounts), no_ipv6=True, host_user=True))
        except DockerError as exc:
            raise DockerError(f"cannot create the bottle: {exc}") from None
        self._let_neighbours_go_once_started()
        bundle = image_trust_store(self.engine, created)
        write_for_bottle(trust, bundle if bundle.endswith(b"\n") or not bundle else bundle + b"\n")
        return created

    def _hold_neighbours(self) -> None:
        """From here until the bottle has started, the running bottles on folders that overlap its own are
        paused (runtime/stillness.py), and its host paths are checked again: none leads elsewhere now."""
        spec = self.spec
        sources = [spec.workspace, *(source for source, _, _ in spec.mounts)]
        with self._still_lock:
            self._still.enter_context(held_still(self.engine, sources))
        for source in sources:
            if (now := source.resolve()) != source:
                raise ConfigError(f"{source} leads to {now} now, through a symbolic link made since this start "
                                  "began (a bottle on an overlapping folder can make one): nothing was started")

    def _let_neighbours_go_once_started(self) -> None:
        """Resume the bottles held still once this one has started (whoever starts it: its mounts are made
        then), or is gone, or the run ends."""

        def watch() -> None:
            while not self._still_over.wait(STARTED_POLL_SECONDS):
                try:
                    bottle = self.engine.container(self.names.bottle)
                except DockerError:  # not known to be started: its mounts may be still to come
                    continue
                if bottle is None or bottle.status != "created":
                    break
            self._let_neighbours_go()

        threading.Thread(target=watch, name="neighbours-held", daemon=True).start()

    def _let_neighbours_go(self) -> None:
        self._still_over.set()
        with self._still_lock:
            self._still.close()

    def release(self) -> None:
        """Wait for the gate to listen, add its CA to the bottle's trust store, and let the bottle's command
        go on (``READY_FILE``)."""
        self.wait_for_gate()
        add_ca(bottle_files(self.id) / "ca-certificates.crt", self.gate_ca)
        ready = policy_dir(self.id) / READY_FILE.rsplit("/", 1)[1]
        ready.write_text("the gate listens\n")
        ready.chmod(0o644)
        self.check_gate()

    def stop_gate(self) -> None:
        """Stop the gate (SIGTERM: what is in flight finishes, every line is written) ahead of ``remove``, which
        then only keeps its audit: once the bottle's processes are gone, while the engine finishes with it."""
        self._let_go()
        if self.gate_started:
            with contextlib.suppress(DockerError):
                self.engine.stop(self.names.gate, timeout=GATE_STOP_SECONDS)

    def _let_go(self) -> None:
        """The run ends on purpose: its gate's stream closed, which is no loss (``Lifeline.close``)."""
        if self.heartbeat is not None:
            self.heartbeat.stop()
        if self.lifeline is not None:
            self.lifeline.close()

    def remove(self) -> None:
        if self.heartbeat is not None:
            self.heartbeat.stop()
        if self._gate_output is not None:  # a start that ended before the gate was waited for
            self._gate_output.close()
            self._gate_output = None
        self._let_go()
        self._let_neighbours_go()
        remove_run(self.engine, self.id)
