"""Through a real squid with Basic authentication, squid the gates' only way out: `run -p` answers with the
gate's API route going through it; an allowed host is reached through it terminated, as an opaque tunnel and as
plain HTTP; a refused one is never asked of it; a `NO_PROXY` host is dialled directly; its password is in the
gate alone; an image build fetches through it and its password stays out of the image.

The module's gates join only an internal network it makes (Docker drops every packet from it to anything but
its own members and the host's address on its bridge): squid, one for the module on the host, listens on that
address and reaches the stubs on the tests' upstream network by their addresses. So the runs name the stubs
by address, not by the network's aliases, which only Docker's resolver knows.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import docker
import pytest
from docker.models.containers import Container

from claude_bottle import tokens
from claude_bottle.agent.schema import parse_agent
from claude_bottle.credentials import Credential
from claude_bottle.errors import EXIT_GATE
from claude_bottle.gate.ca import RunCA
from claude_bottle.gate.settings import parse_upstream
from claude_bottle.gate.upstream_proxy import UpstreamProxy
from claude_bottle.launch import Launch, started
from claude_bottle.policy.hosts import Allowlist
from claude_bottle.runtime import images
from claude_bottle.runtime.engines import open_engine
from claude_bottle.runtime.images import ImageSpec
from claude_bottle.runtime.run import Run
from claude_bottle.stub import DEFAULT_TEXT
from claude_bottle.verify.standins import stub_container
from tests.bottle.conftest import (
    TEST_LABEL,
    Upstream,
    bottle_runtime,
    claude_version,
    gate_audit,
    leftovers,
    write_agent,
)
from tests.bottle.https_servers import leaf_pem
from tests.helpers import make_token
from tests.prerequisites import missing

pytestmark = pytest.mark.docker
AGENT = "upstream-proxy"
USER, PASSWORD = "gate", "squid-pass-0f9e8d7c6b"
TERMINATED, OPAQUE = 8443, 9443  # the HTTPS stub's two ports: the gate terminates the first, relays the second
# The HTTPS stub's name, its leaf on port OPAQUE: squid 5 mimics a leaf for an address with a DNS name, which no
# client accepts, so the test through the inspecting squid names its host, as real traffic does.
HTTPS_NAME = "inspected.test"


@dataclass
class Egress:
    """The internal network the module's gates join, and what is on it besides them."""

    network: str
    gateway: str  # the host's address on it: squid listens there
    direct_url: str  # a stub on it, reached without squid (the NO_PROXY case)
    subnet: str


@dataclass
class Squid:
    url: str  # with the credentials
    folder: Path
    stub_url: str  # the stub Messages API by address
    bump_url: str  # the same squid's port that inspects TLS (ssl-bump), with the credentials
    bump_ca: Path  # the CA of the certificates it presents there

    def log(self) -> str:
        path = self.folder / "access.log"
        return path.read_text() if path.exists() else ""


def _free_port(address: str) -> int:
    with socket.socket() as probe:
        probe.bind((address, 0))
        return int(probe.getsockname()[1])


def _address(container: Container, network: str) -> str:
    container.reload()
    return str(container.attrs["NetworkSettings"]["Networks"][network]["IPAddress"])


@pytest.fixture(scope="module")
def egress(client: docker.DockerClient, built_images: tuple[str, str]) -> Iterator[Egress]:
    name = f"claude-bottle-test-egress-{secrets.token_hex(3)}"
    network = client.networks.create(name, driver="bridge", internal=True, labels={TEST_LABEL: "1"})
    try:
        gateway = client.networks.get(name).attrs["IPAM"]["Config"][0]["Gateway"]
        direct = stub_container(open_engine(client), built_images[1], name, "direct", f"{name}-direct",
                                {TEST_LABEL: "1"})
        yield Egress(name, gateway, f"http://{direct.address}:8000",
                     client.networks.get(name).attrs["IPAM"]["Config"][0]["Subnet"])
    finally:
        with contextlib.suppress(docker.errors.NotFound):
            client.containers.get(f"{name}-direct").remove(force=True)
        network.remove()


@dataclass
class Https:
    address: str  # on the upstream network, which the gates do not join
    ca_file: Path  # its CA, for the gate to trust toward it


@pytest.fixture(scope="module")
def https(client: docker.DockerClient, upstream: Upstream, egress: Egress, built_images: tuple[str, str],
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[Https]:
    """A stub on HTTPS ports TERMINATED (a leaf for its address, known once it runs, so the leaves are written
    then and the stubs wait for them) and OPAQUE (a leaf for HTTPS_NAME). Known on the egress network by that
    name too, for the gate to resolve and vet it: it still reaches it through squid."""
    folder = tmp_path_factory.mktemp("https")
    folder.chmod(0o755)
    serve = " & ".join(f"/opt/gate/bin/python -m claude_bottle stub-upstream --listen $HOSTNAME:{port} --log "
                       f"--tls /opt/stub/{leaf}" for port, leaf in ((TERMINATED, "tls.pem"), (OPAQUE, "name.pem")))
    container = client.containers.run(
        built_images[1], ["-c", f"while [ ! -s /opt/stub/tls.pem ]; do sleep 0.1; done; {serve} & wait"],
        entrypoint=["/bin/sh"], detach=True, network=upstream.network, labels={TEST_LABEL: "1"},
        name=f"{upstream.network}-https-{secrets.token_hex(2)}", read_only=True,
        volumes={str(folder): {"bind": "/opt/stub", "mode": "ro"}})
    try:
        client.networks.get(egress.network).connect(container, aliases=[HTTPS_NAME])
        address = _address(container, upstream.network)
        ca = RunCA.generate(Allowlist.parse([address, HTTPS_NAME]).patterns)
        (folder / "ca.pem").write_bytes(ca.certificate_pem)
        (folder / "name.pem").write_bytes(leaf_pem(ca, HTTPS_NAME))
        (folder / "name.pem").chmod(0o644)
        (folder / "tls.part").write_bytes(leaf_pem(ca, address))
        (folder / "tls.part").chmod(0o644)
        (folder / "tls.part").rename(folder / "tls.pem")
        deadline = time.monotonic() + 30
        while container.logs().decode().count("stub upstream on") < 2:
            container.reload()
            if container.status != "running" or time.monotonic() > deadline:
                pytest.fail(f"the HTTPS stub did not start: {container.logs().decode()[-2000:]}")
            time.sleep(0.2)
        yield Https(address, folder / "ca.pem")
    finally:
        container.remove(force=True)


@pytest.fixture(scope="module")
def squid(client: docker.DockerClient, upstream: Upstream, egress: Egress, https: Https) -> Iterator[Squid]:
    """One squid for the module: Basic authentication on two ports, the second inspecting TLS (ssl-bump: it
    terminates every tunnel with a leaf of its own CA and verifies the server against ``https``'s CA)."""
    binary = shutil.which("squid") or ("/usr/sbin/squid" if Path("/usr/sbin/squid").exists() else None)
    certgen = Path("/usr/lib/squid/security_file_certgen")
    if binary is None or not certgen.exists():
        missing("no squid with ssl-bump on this host", "apt-get install squid-openssl (scripts/test installs it)")
    gateway = egress.gateway
    # Not under pytest's temporary folder: squid, started as root, writes its logs as the user 'proxy'.
    folder = Path(tempfile.mkdtemp(prefix="claude-bottle-squid-"))
    folder.chmod(0o777)
    hashed = subprocess.run(["openssl", "passwd", "-apr1", PASSWORD], capture_output=True, text=True, check=True)
    (folder / "hosts").write_text(f"{https.address} {HTTPS_NAME}\n")
    (folder / "passwd").write_text(f"{USER}:{hashed.stdout.strip()}\n")
    port, bump_port = _free_port(gateway), _free_port(gateway)
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj",
                    "/CN=claude-bottle test TLS-inspecting proxy", "-keyout", str(folder / "bump-ca.key"), "-out",
                    str(folder / "bump-ca.pem"), "-addext", "basicConstraints=critical,CA:TRUE",
                    "-addext", "keyUsage=critical,keyCertSign,cRLSign"], capture_output=True, check=True)
    subprocess.run([str(certgen), "-c", "-s", str(folder / "ssl_db"), "-M", "4MB"], capture_output=True, check=True)
    subprocess.run(["chmod", "-R", "a+rwX", str(folder)], check=True)  # squid's helpers run as 'proxy'
    (folder / "squid.conf").write_text(f"""
http_port {gateway}:{port}
http_port {gateway}:{bump_port} ssl-bump tls-cert={folder}/bump-ca.pem tls-key={folder}/bump-ca.key \
    generate-host-certificates=on dynamic_cert_mem_cache_size=4MB
sslcrtd_program {certgen} -s {folder}/ssl_db -M 4MB
sslcrtd_children 2 startup=1 idle=1
acl step1 at_step SslBump1
acl step2 at_step SslBump2
ssl_bump peek step1
ssl_bump stare step2
ssl_bump bump all
on_unsupported_protocol tunnel all
tls_outgoing_options cafile={https.ca_file}
hosts_file {folder}/hosts
auth_param basic program /usr/lib/squid/basic_ncsa_auth {folder}/passwd
acl authed proxy_auth REQUIRED
acl tunnel_ports port 443 8000 {TERMINATED} {OPAQUE}
acl CONNECT method CONNECT
http_access deny CONNECT !tunnel_ports
http_access allow authed
http_access deny all
access_log stdio:{folder}/access.log
cache_log {folder}/cache.log
pid_filename {folder}/squid.pid
cache deny all
cache_mem 8 MB
shutdown_lifetime 1 seconds
cache_effective_user proxy
""")
    process = subprocess.Popen([binary, "-N", "-f", str(folder / "squid.conf")], stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(OSError), socket.create_connection((gateway, port), timeout=1):
                break
            if process.poll() is not None or time.monotonic() > deadline:
                log = (folder / "cache.log").read_text() if (folder / "cache.log").exists() else ""
                pytest.fail(f"squid did not start: {process.stderr.read() if process.stderr else b''!r} {log[-2000:]}")
            time.sleep(0.2)
        stub = _address(upstream.stub, upstream.network)
        yield Squid(f"http://{USER}:{PASSWORD}@{gateway}:{port}", folder, f"http://{stub}:8000",
                    f"http://{USER}:{PASSWORD}@{gateway}:{bump_port}", folder / "bump-ca.pem")
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        shutil.rmtree(folder, ignore_errors=True)


def run_p(egress: Egress, workspace: Path, upstream_url: str, **environ: str) -> subprocess.CompletedProcess[str]:
    """``claude-bottle run -p`` against the stub at ``upstream_url``, its gate on ``egress`` only, with
    ``environ`` added."""
    write_agent(AGENT, "")
    return subprocess.run([sys.executable, "-P", "-m", "claude_bottle", "run", AGENT, "-p", "say hi", "--upstream",
                           upstream_url, "--upstream-network", egress.network], env={**os.environ, **environ},
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=240, cwd=workspace)


def test_run_answers_through_squid_with_the_real_token(
        upstream: Upstream, egress: Egress, squid: Squid, workspace: Path, token: str) -> None:
    before = len(upstream.requests())  # the stub is the session's: earlier tests' requests came with their tokens
    result = run_p(egress, workspace, squid.stub_url, HTTPS_PROXY=squid.url)
    assert result.returncode == 0, result.stderr
    assert DEFAULT_TEXT in result.stdout
    assert f"CONNECT {squid.stub_url.removeprefix('http://')} " in squid.log(), squid.log()
    assert f" {USER} " in squid.log(), "squid saw the gate's credentials"
    assert PASSWORD not in result.stdout + result.stderr
    seen = [r for r in upstream.requests()[before:] if r["target"].startswith("/v1/messages")]
    assert seen, "the stub saw no /v1/messages call"
    assert all(["authorization", f"Bearer {token}"] in [[n.lower(), v] for n, v in r["headers"]] for r in seen)


@contextlib.contextmanager
def sleeping_bottle(client: docker.DockerClient, tmp_path: Path, agent: dict[str, object], squid: Squid,
                    egress: Egress, proxy_url: str, ca_files: tuple[Path, ...],
                    learn: bool = False) -> Iterator[tuple[Run, Callable[[str], str]]]:
    """A sleeping bottle of ``agent`` (more keys of an agent file), its gate on ``egress`` only, through
    ``proxy_url``, trusting ``ca_files`` upstream; with a function running a shell command in it."""
    workspace = tmp_path / "project"
    (workspace / ".git").mkdir(parents=True)
    workspace.chmod(0o777)
    runtime = {"runtime": bottle_runtime()} if bottle_runtime() else {}
    config = parse_agent(AGENT, {"version": 1, "claude": {"version": claude_version()}, **runtime, **agent}, "test")
    launch = Launch(config, workspace, Credential.parse(make_token(), "test"), parse_upstream(squid.stub_url),
                    (egress.network,), upstream_ca_files=ca_files, routes=tokens.routes_for(config.credentials),
                    upstream_proxy=UpstreamProxy.parse(proxy_url, "test"), learn=learn)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
        patch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
        with started(launch, lambda line: None) as run:
            run.create_bottle(["sleep", "900"], tty=False)
            run.engine.start(run.names.bottle)
            bottle = client.containers.get(run.names.bottle)

            def inside(command: str) -> str:
                return str(bottle.exec_run(["sh", "-c", command]).output.decode("utf-8", "replace"))

            yield run, inside
    assert leftovers(client, AGENT) == []


def status(inside: Callable[[str], str], url: str, *options: str, of: str = "http_code") -> str:
    """curl's ``of`` (the response's status, or the CONNECT answer's) for ``url`` from the bottle."""
    return inside(f"curl -s -m 20 {' '.join(options)} -o /dev/null -w '%{{{of}}}' {url} 2>/dev/null")


def test_allowed_through_squid_refused_never_asked_and_the_password_in_the_gate_only(
        client: docker.DockerClient, upstream: Upstream, egress: Egress, squid: Squid, https: Https,
        tmp_path: Path) -> None:
    plain, terminated, opaque = (f"{upstream.target_ip}:8000", f"{https.address}:{TERMINATED}",
                                 f"{https.address}:{OPAQUE}")
    agent: dict[str, object] = {"allow": [plain, terminated], "allow_private": [upstream.subnet],
                                "egress": [{"host": opaque, "inspect": False}]}
    with sleeping_bottle(client, tmp_path, agent, squid, egress, squid.url, (https.ca_file,)) as (run, inside):
        # The gate itself has no way out but squid: the target it reaches through squid, dialled directly.
        direct = client.containers.get(run.names.gate).exec_run(
            ["/opt/gate/bin/python", "-c", "import socket; socket.create_connection"
             f"(('{upstream.target_ip}', 8000), timeout=3)"])
        assert direct.exit_code != 0, "the gate reached the target without squid"
        assert status(inside, f"http://{plain}/v1/models") == "200"
        assert status(inside, f"https://{terminated}/v1/models") == "200"
        assert status(inside, f"https://{opaque}/v1/models", "-k") == "200"
        assert status(inside, "http://refused.example/") == "403"
        assert status(inside, f"https://{upstream.target_ip}:{TERMINATED}/", "-k", of="http_connect") == "403"
        seen = inside("env; cat /proc/*/environ 2>/dev/null; cat /proc/*/cmdline 2>/dev/null; "
                      "grep -rs . /home /etc/claude-bottle /tmp 2>/dev/null | head -c 2000000")
        inspected = json.dumps([client.api.inspect_container(name) for name in (run.names.gate, run.names.bottle)])
        audit = gate_audit(run)
    log = squid.log()
    assert f"GET http://{plain}/v1/models" in log, log
    assert f"CONNECT {terminated} " in log and f"CONNECT {opaque} " in log, log
    tunnels = {line.get("target"): line.get("tunnel") for line in audit if line.get("tunnel")}
    assert tunnels.get(terminated) == "terminated" and tunnels.get(opaque) == "opaque", tunnels
    assert "refused.example" not in log and f"{upstream.target_ip}:{TERMINATED}" not in log, log
    text = json.dumps(audit)
    assert "refused.example" in text and f"{upstream.target_ip}:{TERMINATED}" in text
    for where, found in (("the bottle", seen), ("docker inspect", inspected), ("the audit", text)):
        assert PASSWORD not in found, f"the proxy's password is in {where}"


def test_through_a_tls_inspecting_squid_in_learn_mode(
        client: docker.DockerClient, upstream: Upstream, egress: Egress, squid: Squid, https: Https,
        tmp_path: Path) -> None:
    """The gate trusts the inspecting squid's CA as an extra CA and reaches an allowed host through squid's own
    termination; learn mode lets a host no allowlist names through squid too, and records it."""
    allowed, unlisted = f"{HTTPS_NAME}:{OPAQUE}", f"{upstream.target_ip}:8000"
    agent: dict[str, object] = {"allow": [allowed], "allow_private": [upstream.subnet, egress.subnet]}
    with sleeping_bottle(client, tmp_path, agent, squid, egress, squid.bump_url, (squid.bump_ca,),
                         learn=True) as (run, inside):
        assert status(inside, f"https://{allowed}/v1/models") == "200"
        assert status(inside, f"http://{unlisted}/v1/models") == "200"
        audit = gate_audit(run)
    log = squid.log()
    assert f"GET https://{allowed}/v1/models" in log, "squid did not inspect the tunnel: " + log
    assert f"GET http://{unlisted}/v1/models" in log, log
    assert "terminated" in [line.get("tunnel") for line in audit if line.get("target") == allowed], audit
    learned = [line for line in audit if unlisted in json.dumps(line)]
    assert learned and all(line.get("unlisted") and line.get("would_deny") for line in learned), audit
    assert PASSWORD not in json.dumps(audit)


@pytest.mark.parametrize(("case", "words"), [("wrong password", "refused the credentials (407"),
                                             ("no squid", "cannot reach the upstream proxy")])
def test_a_wrong_password_or_no_squid_gives_its_error_and_leaves_nothing(
        client: docker.DockerClient, egress: Egress, squid: Squid, workspace: Path, token: str, case: str,
        words: str) -> None:
    url = squid.url.replace(PASSWORD, "wrong-password") if case == "wrong password" else \
        squid.url.rsplit(":", 1)[0] + ":9"  # nothing listens there
    result = run_p(egress, workspace, squid.stub_url, HTTPS_PROXY=url)
    assert result.returncode == EXIT_GATE, result.stderr
    assert words in result.stderr and "upstream proxy http://" in result.stderr
    assert f"{USER}@" not in result.stderr  # failures reach the bottle too: never the proxy's user name
    assert "wrong-password" not in result.stderr and PASSWORD not in result.stderr
    assert leftovers(client, AGENT) == []


def test_a_no_proxy_host_is_dialled_directly(egress: Egress, squid: Squid, workspace: Path, token: str) -> None:
    before = squid.log()
    direct = egress.direct_url.removeprefix("http://").split(":")[0]
    result = run_p(egress, workspace, egress.direct_url, https_proxy=squid.url, no_proxy=f"localhost,{direct}")
    assert result.returncode == 0, result.stderr
    assert DEFAULT_TEXT in result.stdout
    assert direct not in squid.log().removeprefix(before), "squid was asked for the NO_PROXY host"


def test_a_build_fetches_through_squid_and_keeps_its_password_out_of_the_image(
        client: docker.DockerClient, squid: Squid, built_images: tuple[str, str]) -> None:
    nonce = secrets.token_hex(8)  # a step of its own: never a cached layer
    fetch = f"import urllib.request; urllib.request.urlopen('{squid.stub_url}/{nonce}', timeout=30)"
    # The stub answers 404 to that path: squid's log, not the step's status, says whether the fetch went through.
    spec = ImageSpec(f"proxy-test-{nonce}", {"Dockerfile": f"FROM {built_images[1]}\n"
                                             f"RUN /opt/gate/bin/python -c \"{fetch}\" || true\n".encode()})
    proxy = UpstreamProxy.parse(squid.url, "test")
    tag = images.build(open_engine(client), spec, lambda line: None, proxy.environment())
    try:
        assert f"{squid.stub_url}/{nonce} " in squid.log() and f" {USER} " in squid.log(), squid.log()
        image = client.images.get(tag)
        described = json.dumps([image.attrs, image.history()])
        assert squid.url not in described and PASSWORD not in described, "the password is in the image's history"
        tail = b""
        for chunk in image.save(named=True):
            assert PASSWORD.encode() not in tail + chunk, "the password is in the image's layers"
            tail = chunk[-len(PASSWORD):]
    finally:
        client.images.remove(tag, force=True)
