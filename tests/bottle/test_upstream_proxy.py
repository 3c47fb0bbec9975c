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
from collections.abc import Iterator
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
from claude_bottle.runtime.docker_engine import open_engine
from claude_bottle.runtime.images import ImageSpec
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


@dataclass
class Egress:
    """The internal network the module's gates join, and what is on it besides them."""

    network: str
    gateway: str  # the host's address on it: squid listens there
    direct_url: str  # a stub on it, reached without squid (the NO_PROXY case)


@dataclass
class Squid:
    url: str  # with the credentials
    folder: Path
    stub_url: str  # the stub Messages API by address

    def log(self) -> str:
        path = self.folder / "access.log"
        return path.read_text() if path.exists() else ""


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
        yield Egress(name, gateway, f"http://{direct.address}:8000")
    finally:
        with contextlib.suppress(docker.errors.NotFound):
            client.containers.get(f"{name}-direct").remove(force=True)
        network.remove()


@pytest.fixture(scope="module")
def squid(client: docker.DockerClient, upstream: Upstream, egress: Egress) -> Iterator[Squid]:
    binary = shutil.which("squid") or ("/usr/sbin/squid" if Path("/usr/sbin/squid").exists() else None)
    if binary is None:
        missing("no squid on this host", "apt-get install squid (scripts/test installs it)")
    gateway = egress.gateway
    # Not under pytest's temporary folder: squid, started as root, writes its logs as the user 'proxy'.
    folder = Path(tempfile.mkdtemp(prefix="claude-bottle-squid-"))
    folder.chmod(0o777)
    hashed = subprocess.run(["openssl", "passwd", "-apr1", PASSWORD], capture_output=True, text=True, check=True)
    (folder / "passwd").write_text(f"{USER}:{hashed.stdout.strip()}\n")
    with socket.socket() as probe:
        probe.bind((gateway, 0))
        port = probe.getsockname()[1]
    (folder / "squid.conf").write_text(f"""
http_port {gateway}:{port}
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
        yield Squid(f"http://{USER}:{PASSWORD}@{gateway}:{port}", folder, f"http://{stub}:8000")
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        shutil.rmtree(folder, ignore_errors=True)


@dataclass
class Https:
    address: str  # on the upstream network, which the gates do not join
    ca_file: Path  # its CA, for the gate to trust toward it


@pytest.fixture(scope="module")
def https(client: docker.DockerClient, upstream: Upstream, built_images: tuple[str, str],
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[Https]:
    """A stub on HTTPS ports TERMINATED and OPAQUE, its leaf for its address (known once it runs, so the leaf
    is written then, and the stubs wait for it)."""
    folder = tmp_path_factory.mktemp("https")
    folder.chmod(0o755)
    serve = " & ".join(f"/opt/gate/bin/python -m claude_bottle stub-upstream --listen $HOSTNAME:{port} --log "
                       "--tls /opt/stub/tls.pem" for port in (TERMINATED, OPAQUE))
    container = client.containers.run(
        built_images[1], ["-c", f"while [ ! -s /opt/stub/tls.pem ]; do sleep 0.1; done; {serve} & wait"],
        entrypoint=["/bin/sh"], detach=True, network=upstream.network, labels={TEST_LABEL: "1"},
        name=f"{upstream.network}-https-{secrets.token_hex(2)}", read_only=True,
        volumes={str(folder): {"bind": "/opt/stub", "mode": "ro"}})
    try:
        address = _address(container, upstream.network)
        ca = RunCA.generate(Allowlist.parse([address]).patterns)
        (folder / "ca.pem").write_bytes(ca.certificate_pem)
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


def run_p(egress: Egress, workspace: Path, upstream_url: str, **environ: str) -> subprocess.CompletedProcess[str]:
    """``claude-bottle run -p`` against the stub at ``upstream_url``, its gate on ``egress`` only, with
    ``environ`` added."""
    write_agent(AGENT, "")
    return subprocess.run([sys.executable, "-m", "claude_bottle", "run", AGENT, "-p", "say hi", "--upstream",
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


def test_allowed_through_squid_refused_never_asked_and_the_password_in_the_gate_only(
        client: docker.DockerClient, upstream: Upstream, egress: Egress, squid: Squid, https: Https,
        tmp_path: Path) -> None:
    plain, terminated, opaque = (f"{upstream.target_ip}:8000", f"{https.address}:{TERMINATED}",
                                 f"{https.address}:{OPAQUE}")
    workspace = tmp_path / "project"
    (workspace / ".git").mkdir(parents=True)
    workspace.chmod(0o777)
    runtime = {"runtime": bottle_runtime()} if bottle_runtime() else {}
    agent = parse_agent(AGENT, {"version": 1, "allow": [plain, terminated], "allow_private": [upstream.subnet],
                                "egress": [{"host": opaque, "inspect": False}],
                                "claude": {"version": claude_version()}, **runtime}, "test")
    launch = Launch(agent, workspace, Credential.parse(make_token(), "test"), parse_upstream(squid.stub_url),
                    (egress.network,), upstream_ca_files=(https.ca_file,), routes=tokens.routes_for(agent.credentials),
                    upstream_proxy=UpstreamProxy.parse(squid.url, "test"))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
        patch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
        with started(launch, lambda line: None) as run:
            run.create_bottle(["sleep", "900"], tty=False)
            run.engine.start(run.names.bottle)
            bottle = client.containers.get(run.names.bottle)

            def inside(command: str) -> str:
                return bottle.exec_run(["sh", "-c", command]).output.decode("utf-8", "replace")

            def status(url: str, *options: str, of: str = "http_code") -> str:
                return inside(f"curl -s -m 20 {' '.join(options)} -o /dev/null -w '%{{{of}}}' {url} 2>/dev/null")

            # The gate itself has no way out but squid: the target it reaches through squid, dialled directly.
            direct = client.containers.get(run.names.gate).exec_run(
                ["/opt/gate/bin/python", "-c", "import socket; socket.create_connection"
                 f"(('{upstream.target_ip}', 8000), timeout=3)"])
            assert direct.exit_code != 0, "the gate reached the target without squid"
            assert status(f"http://{plain}/v1/models") == "200"
            assert status(f"https://{terminated}/v1/models") == "200"
            assert status(f"https://{opaque}/v1/models", "-k") == "200"
            assert status("http://refused.example/") == "403"
            assert status(f"https://{upstream.target_ip}:{TERMINATED}/", "-k", of="http_connect") == "403"
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
    assert leftovers(client, AGENT) == []


@pytest.mark.parametrize(("case", "words"), [("wrong password", "refused the credentials (407"),
                                             ("no squid", "cannot reach the upstream proxy")])
def test_a_wrong_password_or_no_squid_gives_its_error_and_leaves_nothing(
        client: docker.DockerClient, egress: Egress, squid: Squid, workspace: Path, token: str, case: str,
        words: str) -> None:
    url = squid.url.replace(PASSWORD, "wrong-password") if case == "wrong password" else \
        squid.url.rsplit(":", 1)[0] + ":9"  # nothing listens there
    result = run_p(egress, workspace, squid.stub_url, HTTPS_PROXY=url)
    assert result.returncode == EXIT_GATE, result.stderr
    assert words in result.stderr and f"http://{USER}@" in result.stderr
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
    tag = images.build(open_engine(client), spec, lambda line: None, UpstreamProxy.parse(squid.url, "test").environment())
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
