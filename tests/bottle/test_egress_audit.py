"""Every packet of a real interactive Claude Code session in a bottle, and every destination its gate refused.

tcpdump runs on the host in the bottle's network namespace (through nsenter), so it records what leaves the
bottle whatever sends it: the only peer must be the gate. The gate's audit log names what Claude Code tried
through the proxy and was refused; docs/refused-destinations.md must list each of those, with Claude Code's
switches (runtime.run.CLAUDE_ENV) and without them.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import re
import secrets
import selectors
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import docker
import docker.errors
import pexpect
import pytest
from docker.models.containers import Container

from claude_bottle.agent.load import load_agent
from claude_bottle.credentials import Credential
from claude_bottle.gate.settings import parse_upstream
from claude_bottle.launch import Launch, claude_command, started
from claude_bottle.runtime import run as run_module
from claude_bottle.runtime.docker_api import docker_cli
from claude_bottle.runtime.names import AGENT_LABEL
from claude_bottle.stub import DEFAULT_TEXT
from tests.bottle.conftest import Upstream, gate_audit, leftovers, on_screen, write_agent
from tests.prerequisites import require

pytestmark = pytest.mark.docker
DOC = Path(__file__).resolve().parents[2] / "docs" / "refused-destinations.md"
SETTINGS = {"with": "with the switches", "without": "without them"}  # test id: the doc's column


@pytest.fixture
def agent(client: docker.DockerClient) -> Iterator[str]:
    """A fresh agent name; its state volume is removed afterwards."""
    name = f"audit-{secrets.token_hex(3)}"
    yield name
    for volume in client.volumes.list(filters={"label": f"{AGENT_LABEL}={name}"}):
        with contextlib.suppress(docker.errors.NotFound):
            volume.remove(force=True)


@pytest.fixture(autouse=True)
def forget_state_volumes() -> None:
    """In place of conftest's, which removes every state volume created while a test runs: on an engine
    shared with other test runs, that includes theirs. Here ``agent`` removes just its own."""


@pytest.fixture(scope="session")
def capture_tools() -> None:
    """tcpdump and nsenter, as root; missing, the tests are skipped visibly, and under CI they fail."""
    absent = [tool for tool in ("tcpdump", "nsenter") if shutil.which(tool) is None]
    require(not absent, f"{' and '.join(absent)} not installed", "scripts/docker-engine installs tcpdump when run as root")
    require(os.geteuid() == 0, "entering a container's network namespace needs root")


@contextlib.contextmanager
def capturing(pid: int, path: Path) -> Iterator[None]:
    """tcpdump in the network namespace of process ``pid``, writing every packet to ``path`` as it comes;
    the block runs once it listens."""
    process = subprocess.Popen(["nsenter", "-t", str(pid), "-n", "tcpdump", "-i", "any", "-nn", "-U", "-w", str(path)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        assert process.stderr is not None
        with selectors.DefaultSelector() as selector:
            selector.register(process.stderr, selectors.EVENT_READ)
            started_output = b""
            deadline = time.monotonic() + 10
            while b"listening on" not in started_output:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not selector.select(remaining) or process.poll() is not None:
                    raise AssertionError(f"tcpdump did not start: {started_output.decode(errors='replace')}")
                started_output += os.read(process.stderr.fileno(), 4096)
        yield
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


def running_pid(container: Container) -> int:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        container.reload()
        if container.status == "running" and container.attrs["State"]["Pid"]:
            return int(container.attrs["State"]["Pid"])
        time.sleep(0.05)
    raise AssertionError(f"the bottle did not start: {container.status}")


def ask(child: pexpect.spawn, prompt: str, answer: str) -> None:
    child.send(prompt)
    time.sleep(0.5)  # a paste and its Enter in one read would be taken as a pasted newline
    child.send("\r")
    child.expect(on_screen(answer))


@dataclass
class Session:
    gate_ip: str
    bottle_ip: str
    packets: list[str]  # tcpdump's lines
    audit: list[dict[str, object]]

    def refused(self) -> set[str]:
        return {str(r["target"]) for r in self.audit if r["listener"] == "proxy" and r["decision"] == "deny"}


def interactive_session(client: docker.DockerClient, launch: Launch, capture: Path) -> Session:
    """Claude Code in a bottle, in a terminal: an answer, then a tool call that writes a file, then quit."""
    with started(launch, lambda line: None) as run:
        # The capture can enter the bottle's network namespace only once the container runs, yet must listen
        # before Claude Code sends anything; tcpdump started just after a plain start would race Claude Code's
        # first connections. So the bottle's command waits for a line on its terminal, sent once tcpdump
        # listens, and only then becomes Claude Code (exec: the same process on the same terminal). Until
        # then only this shell runs in the bottle, and it sends nothing; no shared file, extra mount or
        # process in the bottle is needed to release it.
        command = ["bash", "-c", 'read -r _ && exec "$@"', "wait-for-capture", *claude_command(launch.agent)]
        run.create_bottle(command, tty=True)
        bottle = client.containers.get(run.names.bottle)
        assert run.internal is not None
        child = pexpect.spawn(docker_cli(), ["start", "--attach", "--interactive", bottle.name], timeout=120,
                              dimensions=(40, 140), encoding="utf-8", codec_errors="replace")
        try:
            pid = running_pid(bottle)  # the address too: a stopped container has none
            bottle_ip = bottle.attrs["NetworkSettings"]["Networks"][run.internal.name]["IPAddress"]
            with capturing(pid, capture):
                child.send("\r")
                child.expect(on_screen("bypass permissions on"))
                ask(child, "say hi", DEFAULT_TEXT)
                ask(child, "run: echo tool-ran | tee /workspace/out.txt", "Tool said: tool-ran")
                child.sendcontrol("c")
                time.sleep(0.3)
                child.sendcontrol("c")
                child.expect(pexpect.EOF, timeout=60)  # the bottle has stopped: nothing more to capture
        finally:
            child.close(force=True)
        audit = gate_audit(run)
        gate_ip = run.gate_ip
    packets = subprocess.run(["tcpdump", "-nn", "-r", str(capture)], capture_output=True, text=True, timeout=60,
                             check=True).stdout.splitlines()
    return Session(gate_ip, bottle_ip, packets, audit)


# tcpdump -nn -r of a capture on "any": time, interface (a "?" once read back on the host, where the bottle's
# interface numbers mean nothing), direction (Out: sent; In, B, M: received as unicast, broadcast, multicast).
PACKET = re.compile(r"^\S+ +\S+ +(?P<direction>In|Out|B|M|P) +(?P<what>.*)$")
IP_PACKET = re.compile(r"^IP6? (\S+) > (\S+): ")
IPV4 = re.compile(r"\b\d+\.\d+\.\d+\.\d+\b")


def _address(endpoint: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """The address in tcpdump's ADDRESS.PORT (or a bare ADDRESS)."""
    with contextlib.suppress(ValueError):
        return ipaddress.ip_address(endpoint)
    return ipaddress.ip_address(endpoint.rsplit(".", 1)[0])


def _host_link_local_chatter(direction: str, what: str) -> bool:
    """Housekeeping of the host's own interfaces on the bottle's network (the bridge, the bottle's veth),
    received by the bottle as multicast: IPv6 duplicate address detection, multicast listener reports and
    router solicitations, sent to link-local groups from a link-local (or the unspecified) address, and IGMP
    membership reports from the bridge, which has no IPv4 address (so they come from 0.0.0.0). The bottle
    answers none: IPv6 is off in its namespace (the engine turns it off on a network without IPv6) and it has
    no capability to turn it on; a packet it sent would be "Out", and found."""
    match = IP_PACKET.match(what)
    if direction != "M" or match is None:
        return False
    source, destination = _address(match[1]), _address(match[2])
    if what.startswith("IP6 ") and " ICMP6, " in what:
        return (source.is_link_local or source.is_unspecified) and destination in ipaddress.ip_network("ff02::/16")
    return (what.startswith("IP ") and ": igmp " in what and source.is_unspecified
            and destination in ipaddress.ip_network("224.0.0.0/24"))


def strays(session: Session) -> list[str]:
    """Packets with another peer than the gate: IP sent or received between anything but the bottle and the
    gate, ARP that is not between them about the gate, and anything else, but for the host's IPv6 chatter."""
    bottle, gate = ipaddress.ip_address(session.bottle_ip), ipaddress.ip_address(session.gate_ip)
    found = []
    for line in session.packets:
        packet = PACKET.match(line)
        if packet is None:
            found.append(line)
            continue
        direction, what = packet["direction"], packet["what"]
        if ip := IP_PACKET.match(what):
            ends = (_address(ip[1]), _address(ip[2]))
            if ends != {"Out": (bottle, gate), "In": (gate, bottle)}.get(direction) \
                    and not _host_link_local_chatter(direction, what):
                found.append(line)
        elif what.startswith("ARP, "):
            addresses = {ipaddress.ip_address(a) for a in IPV4.findall(what)}
            if gate not in addresses or not addresses <= {gate, bottle}:
                found.append(line)
        else:
            found.append(line)
    return found


def documented_refusals() -> dict[str, set[str]]:
    """The table in docs/refused-destinations.md: per switch setting, the host:port it says are refused."""
    rows = [[cell.strip() for cell in line.strip().strip("|").split("|")]
            for line in DOC.read_text().splitlines() if line.startswith("|")]
    (header,) = [row for row in rows if row[0] == "host:port"]
    columns = {setting: header.index(title) for setting, title in SETTINGS.items()}
    return {setting: {row[0].strip("`") for row in rows if row[column] == "refused"}
            for setting, column in columns.items()}


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_a_session_talks_only_to_the_gate_and_its_refusals_are_documented(
    client: docker.DockerClient, upstream: Upstream, token: str, workspace: Path, tmp_path: Path,
    built_images: tuple[str, str], capture_tools: None, monkeypatch: pytest.MonkeyPatch, agent: str, setting: str,
) -> None:
    if setting == "without":
        monkeypatch.setattr(run_module, "CLAUDE_ENV", {})
    write_agent(agent, "")
    launch = Launch(load_agent(agent, workspace), workspace, Credential.parse(token, "test"),
                    parse_upstream(upstream.url), (upstream.network,))
    session = interactive_session(client, launch, tmp_path / "bottle.pcap")
    assert leftovers(client, agent) == []

    refused = session.refused()
    print(f"\n{setting} the switches: {len(session.packets)} packets; refused: {sorted(refused)}")
    assert (workspace / "out.txt").read_text() == "tool-ran\n", "the tool call did not run"
    api = [r for r in session.audit if r["listener"] == "api"]
    assert api and all(r["decision"] == "allow" for r in api), f"the API route refused the session: {api}"
    assert session.packets, "the capture recorded nothing"
    offending = strays(session)
    assert not offending, "packets with another peer than the gate:\n" + "\n".join(offending)
    undocumented = refused - documented_refusals()[setting]
    assert not undocumented, f"refused {setting} the switches but not in {DOC.name}: {sorted(undocumented)}"


@pytest.mark.parametrize(("line", "stray"), [
    ("21:40:19.813331 ?     Out ARP, Request who-has 172.27.0.2 tell 172.27.0.3, length 28", False),
    ("21:40:19.813392 ?     In  ARP, Reply 172.27.0.2 is-at 02:42:ac:1b:00:02, length 28", False),
    ("21:40:19.813394 ?     Out IP 172.27.0.3.55636 > 172.27.0.2.8080: Flags [S], seq 1, length 0", False),
    ("21:40:19.813438 ?     In  IP 172.27.0.2.8080 > 172.27.0.3.55636: Flags [S.], seq 3, length 0", False),
    ("21:40:18.324042 ?     M   IP6 :: > ff02::1:ff08:ebf1: ICMP6, neighbor solicitation, who has fe80::1, length 32", False),
    ("21:40:18.804097 ?     M   IP6 fe80::42:98ff:feab:aa1 > ff02::16: HBH ICMP6, multicast listener report v2, 2 group record(s), length 48", False),
    ("21:40:19.348101 ?     Out IP6 fe80::6005:15ff:fe08:ebf1 > ff02::2: ICMP6, router solicitation, length 16", True),
    ("21:40:19.348101 ?     M   IP6 fe80::1.5353 > ff02::fb.5353: 0 PTR (QM)? _x._tcp.local. (30)", True),
    ("19:07:38.037375 ?     M   IP 0.0.0.0 > 224.0.0.22: igmp v3 report, 1 group record(s)", False),
    ("19:07:38.037375 ?     Out IP 172.27.0.3 > 224.0.0.22: igmp v3 report, 1 group record(s)", True),
    ("19:07:38.037375 ?     M   IP 172.27.0.1 > 224.0.0.22: igmp v3 report, 1 group record(s)", True),
    ("21:40:19.813394 ?     Out IP 172.27.0.3.41000 > 10.0.0.1.443: Flags [S], seq 1, length 0", True),
    ("21:40:19.813394 ?     Out IP 172.27.0.3.41000 > 172.27.0.2.53: 1+ A? example.com. (29)", False),
    ("21:40:19.813438 ?     In  IP 172.27.0.3.8080 > 172.27.0.2.55636: Flags [S.], seq 3, length 0", True),
    ("21:50:07.046465 ?     Out ARP, Request who-has 172.27.0.99 tell 172.27.0.3, length 28", True),
    ("21:50:07.046465 ?     Out LLDP, length 44", True),
    ("garbage", True),
])
def test_packets_with_another_peer_than_the_gate_are_found(line: str, stray: bool) -> None:
    """Lines as tcpdump prints them, most from a real capture; the gate is 172.27.0.2, the bottle .3."""
    assert strays(Session("172.27.0.2", "172.27.0.3", [line], [])) == ([line] if stray else [])
