"""``claude-bottle verify``: start an agent's bottle, attack it from inside, and say what happened.

The bottle is the agent's own (its allowlist, mounts, limits and images) with three stand-ins: a throwaway
credential, a stub Messages API as the upstream, and a scratch workspace. A second stub plays a host outside
the bottle, on a private address: the gate could reach it, the bottle must not. Attacks on files, processes and
privileges run in the bottle as the agent user; attacks on the network run in its network namespace (see
``claude_bottle.probe``). Nothing here needs an Anthropic account or spends a token.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import secrets
import socket
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker
import docker.errors
from docker.models.containers import Container

from claude_bottle.config import AgentConfig
from claude_bottle.credentials import Credential
from claude_bottle.errors import DockerError, GateError
from claude_bottle.gate.config import Limits
from claude_bottle.launch import Launch, Progress, build_images, interrupt, on_stop_signals, started
from claude_bottle.persistence import Plants, make_repository, share
from claude_bottle.policy.hosts import parse_pattern
from claude_bottle.policy.rules import HostRules
from claude_bottle.probe import Outcome
from claude_bottle.runtime import engine
from claude_bottle.runtime.bottle import AGENT_LABEL, LABEL, RUN_LABEL, Run, remove_run, state_volume

STUB_PORT = 8000
PRIVATE_NAME = f"canary:{STUB_PORT}"  # allowlisted on purpose: the name resolves to a private address
FRONT = "front"  # an allowed host the bottle may reach (its address too), to attack what tunnels carry
PUBLIC_IPV4 = ("1.1.1.1", "8.8.8.8")
PUBLIC_IPV6 = ("2606:4700:4700::1111",)
PROBE_SECONDS = 120
# The host-side name of the stand-ins' bridge: unlike a bottle's (runtime/bottle.py BRIDGE_PREFIX), the host
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


@dataclass
class Verification:
    """A started bottle under test and what the attacks need to know about it."""

    run: Run
    credential: Credential
    stub: Container  # the stub Messages API, the gate's upstream
    canary: Container  # a host outside the bottle that the gate could reach
    gate_image: str
    host: HostCanary
    host_addresses: tuple[str, ...]
    attacker_key: str = dataclasses.field(default_factory=lambda: "sk-ant-api03-attacker-" + secrets.token_hex(16))


def throwaway_credential() -> Credential:
    return Credential.parse("sk-ant-oat01-verify-" + secrets.token_urlsafe(48), "the throwaway credential")


def _scratch_workspace(root: str) -> Path:
    """A project with a repository in it: a real one where git is installed, so that what a bottle plants for
    the host's git is judged by the host's git."""
    workspace = Path(root) / "workspace"
    workspace.mkdir()
    if not make_repository(workspace, Path(root)):
        (workspace / ".git" / "hooks").mkdir(parents=True)
        (workspace / ".git" / "config").write_text("[core]\n")
    share(workspace)
    return workspace


def _wait_for_log(container: Container, line: str, what: str, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while line not in (logs := container.logs().decode("utf-8", "replace")):
        container.reload()
        if container.status in ("exited", "dead") or time.monotonic() > deadline:
            raise GateError(f"{what} did not start: {logs.strip()[-300:] or 'no output'}")
        time.sleep(0.1)


def stub_container(client: docker.DockerClient, image: str, network: str, alias: str, name: str,
          labels: dict[str, str]) -> Container:
    """A stub Messages API from the gate image, known on ``network`` as ``alias``, logging each request."""
    container = client.containers.create(
        image, entrypoint=["/opt/gate/bin/python", "-m", "claude_bottle", "stub-upstream", "--listen",
                           f"{alias}:{STUB_PORT}", "--log"],
        name=name, labels=labels, network=network,
        networking_config={network: client.api.create_endpoint_config(aliases=[alias])},
        cap_drop=["ALL"], security_opt=["no-new-privileges"], read_only=True)
    container.start()
    _wait_for_log(container, "stub upstream on", f"the {alias} container")
    return container


def _gateways(client: docker.DockerClient, names: list[str]) -> tuple[str, ...]:
    found = []
    for name in names:
        with contextlib.suppress(docker.errors.NotFound):
            for pool in client.networks.get(name).attrs.get("IPAM", {}).get("Config") or []:
                if pool.get("Gateway"):
                    found.append(pool["Gateway"])
    return tuple(dict.fromkeys(found))


@dataclass
class StandIns:
    """What every bottle of a verify run is started against: the throwaway credential, the stub upstream and a
    host outside the bottle (and an allowed front host) on a network only gates join, and the host canary."""

    client: docker.DockerClient
    agent: AgentConfig  # the agent under test, with the stand-ins allowed
    credential: Credential
    stub: Container
    canary: Container
    gate_image: str
    outside: str  # the network of the stand-ins
    host: HostCanary
    progress: Progress
    workspaces: list[Path] = dataclasses.field(default_factory=list)  # scratch projects bottles were started on


@contextlib.contextmanager
def stand_ins(agent: AgentConfig, progress: Progress, credential: Credential | None = None) -> Iterator[StandIns]:
    """The stand-ins, removed on the way out (Ctrl-C included), with every bottle started against them."""
    credential = credential or throwaway_credential()
    verify_hex = secrets.token_hex(4)
    verify_id = f"verify-{verify_hex}"
    labels = {LABEL: "1", RUN_LABEL: verify_id, AGENT_LABEL: agent.name}
    workspaces: list[Path] = []
    with on_stop_signals(interrupt):
        client = engine.connect()
        host = HostCanary()
        try:
            _, gate_image = build_images(client, agent, progress)
            progress("starting the stub upstream and a host outside the bottle")
            outside = client.networks.create(f"claude-bottle-{verify_id}-outside", driver="bridge", internal=True,
                                             options={"com.docker.network.bridge.name": STAND_IN_BRIDGE + verify_hex},
                                             labels=labels)
            stub, canary, front = (stub_container(client, gate_image, outside.name, alias,
                                                  f"claude-bottle-{verify_id}-{alias}", labels)
                                   for alias in ("stub", "canary", FRONT))
            # The stand-ins speak plain HTTP, and these attacks are on what an opaque tunnel carries: tunnels to
            # them stay opaque (still under the first-flight check), else the gate's own TLS to them would fail
            # before any attack reached them.
            opaque = tuple(HostRules(parse_pattern(p), inspect=False) for p in (PRIVATE_NAME, f"{FRONT}:{STUB_PORT}",
                                                                               FRONT))
            tested = dataclasses.replace(agent, allow=(*agent.allow, PRIVATE_NAME, f"{FRONT}:{STUB_PORT}", FRONT),
                                         egress=dataclasses.replace(agent.egress, hosts=(*agent.egress.hosts, *opaque)),
                                         allow_private=(*agent.allow_private, f"{_address(front)}/32"))
            yield StandIns(client, tested, credential, stub, canary, gate_image, outside.name, host, progress,
                           workspaces)
        except docker.errors.APIError as exc:
            raise DockerError(f"verify: {exc.explanation or exc}") from None
        finally:
            with on_stop_signals(lambda signum, frame: None):
                remove_run(client, verify_id)
                for workspace in workspaces:  # the scratch projects' Claude state: of no later use
                    with contextlib.suppress(docker.errors.APIError):
                        client.volumes.get(state_volume(agent.name, workspace)).remove(force=True)
            host.close()


@contextlib.contextmanager
def bottle_on(env: StandIns, workspace: Path) -> Iterator[Verification]:
    """A sleeping bottle of the agent on ``workspace``, started the way ``start`` would, against the stand-ins;
    the run is removed on the way out (its Claude state stays until the stand-ins go, for later bottles)."""
    env.workspaces.append(workspace)
    launch = Launch(env.agent, workspace, env.credential, f"http://stub:{STUB_PORT}", (env.outside,))
    # The run's review of protected files is verify's own business (the persistence group judges it).
    with started(launch, env.progress, review=lambda report: None) as run:
        assert run.internal is not None and run.egress is not None
        run.create_bottle(["sleep", "infinity"], tty=False).start()
        yield Verification(run, env.credential, env.stub, env.canary, env.gate_image, env.host,
                           _gateways(env.client, ["bridge", run.internal.name, run.egress.name, env.outside]))


@contextlib.contextmanager
def verification(agent: AgentConfig, progress: Progress,
                 credential: Credential | None = None) -> Iterator[Verification]:
    """The agent's bottle on a scratch workspace, started against the stand-ins; everything is removed on the
    way out, Ctrl-C included."""
    with tempfile.TemporaryDirectory(prefix="claude-bottle-verify-") as scratch, \
            stand_ins(agent, progress, credential) as env, bottle_on(env, _scratch_workspace(scratch)) as target:
        yield target


# ---- attacks in the bottle, as the agent user --------------------------------------------------------------

def in_bottle(run: Run, script: str, stdin: str | None = None) -> tuple[int, str]:
    """``script`` in bash in the bottle, as the agent user (the bottle's own); ``stdin`` goes in as a
    here-document (a pipe, never a file or argv)."""
    bottle = run.bottle
    assert bottle is not None
    if stdin is not None:
        script = f"{script} <<'__CLAUDE_BOTTLE_END__'\n{stdin}\n__CLAUDE_BOTTLE_END__"
    code, output = bottle.exec_run(["bash", "-c", script])
    return code, output.decode("utf-8", "replace")


@dataclass(frozen=True)
class Check:
    group: str
    attack: str
    expected: str
    script: str
    judge: Callable[[int, str, str], tuple[str, bool]]  # (exit code, output, secret) -> (actual, blocked)


def _no_secret(what: str) -> Callable[[int, str, str], tuple[str, bool]]:
    def judge(code: int, output: str, secret: str) -> tuple[str, bool]:
        return (f"the credential is in {what}", False) if secret in output else (f"not in {what}", True)
    return judge


def _nothing(found: str, none: str) -> Callable[[int, str, str], tuple[str, bool]]:
    """Blocked when the output is empty; else ``found`` and the first few items."""
    def judge(code: int, output: str, secret: str) -> tuple[str, bool]:
        items = output.split()
        return (f"{found}: {' '.join(items[:5])}", False) if items else (none, True)
    return judge


def _fails(code: int, output: str, secret: str) -> tuple[str, bool]:
    if code == 0:
        return "it worked", False
    return (output.strip().splitlines()[-1:] or ["failed"])[0][-80:], True


def _status_field(name: str, wanted: str) -> Callable[[int, str, str], tuple[str, bool]]:
    def judge(code: int, output: str, secret: str) -> tuple[str, bool]:
        values = dict(line.split(":", 1) for line in output.splitlines() if ":" in line)
        value = values.get(name, "missing").strip()
        return f"{name} {value}", value == wanted
    return judge


def _gate_hidden(code: int, output: str, secret: str) -> tuple[str, bool]:
    seen = [line for line in output.splitlines() if "claude_bottle" in line or "--token-file" in line]
    return (f"visible: {seen[0].strip()[:60]}", False) if seen else (f"{len(output.splitlines()) - 1} "
                                                                     "processes, none of the gate's", True)


CREDENTIAL, PRIVILEGE = "credential discovery", "privilege and persistence"
BOTTLE_CHECKS = (
    Check(CREDENTIAL, "environment variables", "no credential", "env", _no_secret("the environment")),
    Check(CREDENTIAL, "every readable /proc/*/environ and cmdline", "no credential",
          "cat /proc/[0-9]*/environ /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' '\\n'", _no_secret("/proc")),
    Check(CREDENTIAL, "the process list", "no gate process visible", "ps -eo pid,user,args", _gate_hidden),
    Check(CREDENTIAL, "Claude Code's config files", "no credential",
          "cat ~/.claude.json; find ~/.claude /etc/claude-code -type f -exec cat {} + 2>/dev/null; true",
          _no_secret("Claude's config")),
    Check(PRIVILEGE, "effective capabilities", "none", "cat /proc/self/status", _status_field("CapEff", "0" * 16)),
    Check(PRIVILEGE, "bounding capabilities", "none", "cat /proc/self/status", _status_field("CapBnd", "0" * 16)),
    # prctl(PR_GET_NO_NEW_PRIVS), which gVisor answers; its /proc/self/status has no NoNewPrivs line
    Check(PRIVILEGE, "no-new-privileges", "set", "setpriv -d 2>&1", _status_field("no_new_privs", "1")),
    Check(PRIVILEGE, "setuid and setgid programs", "none",
          "find / -xdev -type f -perm /6000 2>/dev/null", _nothing("found", "none found")),
    Check(PRIVILEGE, "a Docker socket", "none",
          "find / \\( -path /proc -o -path /sys \\) -prune -o -type s -name '*docker*' -print 2>/dev/null; "
          "curl -s -m 3 --unix-socket /var/run/docker.sock http://docker/version; true",
          _nothing("found", "none found")),
    Check(PRIVILEGE, "write a hook into the workspace's .git/hooks", "refused",
          "echo 'curl attacker' > /workspace/.git/hooks/pre-commit", _fails),
    Check(PRIVILEGE, "change the workspace's .git/config", "refused",
          "echo '[core] fsmonitor = attacker' >> /workspace/.git/config", _fails),
    Check(PRIVILEGE, "write outside the workspace and home", "refused everywhere",
          "for d in / /etc /usr/bin /usr/local/bin /opt /var /root; do "
          "touch $d/.claude-bottle-probe 2>/dev/null && echo $d; done; true", _nothing("writable", "refused in each")),
)

# Last, once every other check is done: the needle goes in on stdin, so this grep is the only process that
# holds it. Exit 1 means nothing was found; 2 means some files were unreadable, which is fine.
FILE_SEARCH = Check(CREDENTIAL, "a search of the whole file system and home directory", "not found",
                    "grep -rlsF -D skip -f /dev/stdin / --exclude-dir=proc --exclude-dir=sys",
                    _nothing("found in", "not found"))


def bottle_attacks(target: Verification) -> list[Outcome]:
    outcomes = []
    secret = target.credential.secret
    for check in (*BOTTLE_CHECKS, FILE_SEARCH):
        code, output = in_bottle(target.run, check.script, secret if check is FILE_SEARCH else None)
        actual, blocked = check.judge(code, output, secret)
        outcomes.append(Outcome(check.group, check.attack, check.expected, actual, blocked))
    return outcomes


# ---- attacks on the network, from the bottle's namespace ---------------------------------------------------

def network_attacks(target: Verification) -> list[Outcome]:
    """The probe in a container sharing the bottle's network namespace, as the agent user, unprivileged."""
    run = target.run
    assert run.bottle is not None and run.gate is not None
    targets = {
        "gate": run.gate_ip, "api_port": 8080, "proxy_port": 3128,
        "canary_ip": _address(target.canary), "canary_port": STUB_PORT, "private_name": PRIVATE_NAME,
        "api_host": f"stub:{STUB_PORT}", "unlisted_host": "exfiltrate.example", "attacker_key": target.attacker_key,
        "host_port": target.host.port, "host_addresses": list(target.host_addresses),
        "public_ipv4": list(PUBLIC_IPV4), "public_ipv6": list(PUBLIC_IPV6),
        "front_host": FRONT, "front_port": STUB_PORT,
        "header_timeout": Limits().header_timeout, "max_connections": Limits().max_connections,
    }
    probe = run.client.containers.create(
        target.gate_image, entrypoint=["/opt/gate/bin/python", "-m", "claude_bottle.probe", json.dumps(targets)],
        name=f"claude-bottle-{run.id}-probe", labels=run.labels, network_mode=f"container:{run.bottle.id}",
        user=run.spec.user, cap_drop=["ALL"], security_opt=["no-new-privileges"],
        read_only=True)
    try:
        probe.start()
        status = probe.wait(timeout=PROBE_SECONDS)
        output = probe.logs(stdout=True, stderr=False).decode("utf-8", "replace")
        if status.get("StatusCode"):
            raise GateError(f"the network probe failed: {probe.logs(stdout=False, stderr=True).decode()[-500:]}")
    finally:
        with contextlib.suppress(docker.errors.NotFound):
            probe.remove(force=True)
    outcomes = [Outcome(**json.loads(line)) for line in output.splitlines() if line.startswith("{")]
    return [_judged_by_evidence(target, o) for o in outcomes] + [_host_arrivals(target)]


def _address(container: Container) -> str:
    container.reload()
    return str(next(iter(container.attrs["NetworkSettings"]["Networks"].values()))["IPAddress"])


def _judged_by_evidence(target: Verification, outcome: Outcome) -> Outcome:
    """What came back from the gate is the proof: the credential must never be in it, the attacker's key
    must never reach the upstream, which must get the real credential instead, and a request asking the
    provider to reach out for the bottle must never reach the upstream."""
    secret = target.credential.secret
    if secret in outcome.evidence:
        return dataclasses.replace(outcome, actual="the credential came back", blocked=False)
    if outcome.expected == "the credential never comes back":
        return dataclasses.replace(outcome, actual=f"not in the answer: {outcome.actual}", blocked=True)
    if outcome.expected == "refused before the upstream":
        forbidden = outcome.attack.rsplit(" ", 1)[-1]  # the field or server-tool type the attack adds
        got = [r for r in _stub_requests(target) if forbidden in r.get("fields", []) + r.get("tool_types", [])]
        if got:
            return dataclasses.replace(outcome, actual=f"the upstream got {forbidden}", blocked=False)
        return dataclasses.replace(outcome, blocked=True, actual=f"the upstream never got it: {outcome.actual}")
    if outcome.expected == "stripped before the upstream":
        seen = _stub_requests(target)
        attacker = [r for r in seen if target.attacker_key in json.dumps(r["headers"])]
        injected = [r for r in seen if f"Bearer {secret}" in json.dumps(r["headers"])]
        if attacker:
            return dataclasses.replace(outcome, actual="the upstream got the attacker's key", blocked=False)
        return dataclasses.replace(outcome, blocked=bool(injected),
                                   actual="upstream got the real credential only" if injected else
                                   f"the upstream got no credential ({outcome.actual})")
    return outcome


def _stub_requests(target: Verification) -> list[dict[str, Any]]:
    lines = target.stub.logs(stdout=True, stderr=False).decode("utf-8", "replace").splitlines()
    return [json.loads(line) for line in lines if line.startswith("{")]


def _host_arrivals(target: Verification) -> Outcome:
    arrived = target.host.arrivals()
    return Outcome("direct egress", f"anything at a listener on the Docker host (port {target.host.port})",
                   "nothing arrives", ", ".join(arrived[:3]) if arrived else "nothing arrived", not arrived)


def inspect_outcome(target: Verification) -> Outcome:
    """Seen from the host: what `docker inspect` shows of the bottle and the gate."""
    run = target.run
    shown = ""
    for container in (run.bottle, run.gate):
        assert container is not None
        container.reload()
        shown += json.dumps(container.attrs)
    found = target.credential.secret in shown
    return Outcome(CREDENTIAL, "docker inspect of the bottle and the gate (from the host)", "no credential",
                   "the credential is shown" if found else "not shown", not found)


def attack(target: Verification) -> list[Outcome]:
    return [*network_attacks(target), *bottle_attacks(target), inspect_outcome(target)]


def verify(agent: AgentConfig, progress: Progress) -> list[Outcome]:
    """Every attack on one bottle of the agent, then the persistence group: what that bottle planted, judged
    on the host once it is gone, and in two later bottles (another project's, and the same project's)."""
    with tempfile.TemporaryDirectory(prefix="claude-bottle-verify-") as scratch, \
            stand_ins(agent, progress) as env:
        plants = Plants(Path(scratch), _scratch_workspace(scratch))
        try:
            with bottle_on(env, plants.workspace) as target:
                progress(f"attacking the bottle of agent {agent.name}")
                outcomes = attack(target)
                progress("planting what a hijacked agent would leave for later")
                in_bottle(target.run, plants.first_script())
                first = target.run.id
            outcomes += plants.after_first(first, env.credential.secret)
            plants.forget()  # as the user would, once they had reviewed the changes
            progress("the next bottle of the same project")
            with bottle_on(env, plants.workspace) as again:
                output = in_bottle(again.run, plants.next_script())[1]
            outcomes += plants.after_next(output)
            progress("a bottle of the same agent on another project")
            with bottle_on(env, plants.other) as other:
                output = in_bottle(other.run, plants.other_script())[1]
            outcomes += plants.after_other(output)
        finally:
            plants.forget()
        return outcomes


# ---- the report --------------------------------------------------------------------------------------------

def report(outcomes: list[Outcome]) -> str:
    width = max(len(o.attack) for o in outcomes)
    expected = max(len(o.expected) for o in outcomes)
    lines = []
    for group in dict.fromkeys(o.group for o in outcomes):
        lines.append(group.upper())
        for o in (o for o in outcomes if o.group == group):
            lines.append(f"  {'blocked' if o.blocked else 'LEAK   '}  {o.attack:<{width}}  {o.expected:<{expected}}  "
                         f"{o.actual}")
    leaks = sum(not o.blocked for o in outcomes)
    lines.append(f"{len(outcomes)} attacks: " + (f"{leaks} LEAKED" if leaks else "every one blocked"))
    return "\n".join(lines)


def as_json(agent: AgentConfig, outcomes: list[Outcome]) -> str:
    return json.dumps({
        "agent": agent.name, "attacks": len(outcomes), "leaks": sum(not o.blocked for o in outcomes),
        "results": [{k: v for k, v in dataclasses.asdict(o).items() if k != "evidence"} for o in outcomes],
    }, indent=2)
