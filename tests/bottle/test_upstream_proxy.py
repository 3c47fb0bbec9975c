"""Through a real squid with Basic authentication: `run -p` answers with the gate's API route going through it,
an allowed host is reached through it, a refused one is never asked of it, and its password is in the gate
alone.

One squid for the module, on the host, listening on the gateway address of the tests' upstream network (which
the gates join): it reaches the stubs by their addresses, so the runs name those instead of the network's
aliases, which only Docker's resolver knows.
"""

from __future__ import annotations

import contextlib
import json
import os
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

from claude_bottle import tokens
from claude_bottle.agent.schema import parse_agent
from claude_bottle.credentials import Credential
from claude_bottle.errors import EXIT_GATE
from claude_bottle.gate.settings import parse_upstream
from claude_bottle.gate.upstream_proxy import UpstreamProxy
from claude_bottle.launch import Launch, started
from claude_bottle.stub import DEFAULT_TEXT
from tests.bottle.conftest import Upstream, bottle_runtime, claude_version, gate_audit, leftovers, write_agent
from tests.helpers import make_token
from tests.prerequisites import missing

pytestmark = pytest.mark.docker
AGENT = "upstream-proxy"
USER, PASSWORD = "gate", "squid-pass-0f9e8d7c6b"


@dataclass
class Squid:
    url: str  # with the credentials
    folder: Path
    stub_url: str  # the stub Messages API by address

    def log(self) -> str:
        path = self.folder / "access.log"
        return path.read_text() if path.exists() else ""


def _address(container: docker.models.containers.Container, network: str) -> str:
    container.reload()
    return str(container.attrs["NetworkSettings"]["Networks"][network]["IPAddress"])


@pytest.fixture(scope="module")
def squid(client: docker.DockerClient, upstream: Upstream) -> Iterator[Squid]:
    binary = shutil.which("squid") or ("/usr/sbin/squid" if Path("/usr/sbin/squid").exists() else None)
    if binary is None:
        missing("no squid on this host", "apt-get install squid (scripts/test installs it)")
    gateway = client.networks.get(upstream.network).attrs["IPAM"]["Config"][0]["Gateway"]
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
acl tunnel_ports port 443 8000
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


def run_p(upstream: Upstream, squid: Squid, workspace: Path, **environ: str) -> subprocess.CompletedProcess[str]:
    """``claude-bottle run -p`` against the stub by its address, with ``environ`` added."""
    write_agent(AGENT, "")
    return subprocess.run([sys.executable, "-m", "claude_bottle", "run", AGENT, "-p", "say hi", "--upstream",
                           squid.stub_url, "--upstream-network", upstream.network], env={**os.environ, **environ},
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=240, cwd=workspace)


def test_run_answers_through_squid(upstream: Upstream, squid: Squid, workspace: Path, token: str) -> None:
    result = run_p(upstream, squid, workspace, HTTPS_PROXY=squid.url)
    assert result.returncode == 0, result.stderr
    assert DEFAULT_TEXT in result.stdout
    assert f"CONNECT {squid.stub_url.removeprefix('http://')} " in squid.log(), squid.log()
    assert f" {USER} " in squid.log(), "squid saw the gate's credentials"
    assert PASSWORD not in result.stdout + result.stderr


def test_allowed_through_squid_refused_never_asked_and_the_password_in_the_gate_only(
        client: docker.DockerClient, upstream: Upstream, squid: Squid, tmp_path: Path) -> None:
    target = f"{upstream.target_ip}:8000"
    workspace = tmp_path / "project"
    (workspace / ".git").mkdir(parents=True)
    workspace.chmod(0o777)
    runtime = {"runtime": bottle_runtime()} if bottle_runtime() else {}
    agent = parse_agent(AGENT, {"version": 1, "allow": [target], "allow_private": [upstream.subnet],
                                "claude": {"version": claude_version()}, **runtime}, "test")
    launch = Launch(agent, workspace, Credential.parse(make_token(), "test"), parse_upstream(squid.stub_url),
                    (upstream.network,), routes=tokens.routes_for(agent.credentials),
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

            assert inside(f"curl -sS -m 20 -o /dev/null -w '%{{http_code}}' http://{target}/v1/models") == "200"
            assert inside("curl -sS -m 20 -o /dev/null -w '%{http_code}' http://refused.example/") == "403"
            seen = inside("env; cat /proc/*/environ 2>/dev/null; cat /proc/*/cmdline 2>/dev/null; "
                          "grep -rs . /home /etc/claude-bottle /tmp 2>/dev/null | head -c 2000000")
            inspected = json.dumps([client.api.inspect_container(name) for name in (run.names.gate, run.names.bottle)])
            audit = json.dumps(gate_audit(run))
    assert f"GET http://{target}/v1/models" in squid.log(), squid.log()
    assert "refused.example" not in squid.log()
    assert "refused.example" in audit
    for where, text in (("the bottle", seen), ("docker inspect", inspected), ("the audit", audit)):
        assert PASSWORD not in text, f"the proxy's password is in {where}"
    assert leftovers(client, AGENT) == []


@pytest.mark.parametrize(("case", "words"), [("wrong password", "refused the credentials (407"),
                                             ("no squid", "cannot reach the upstream proxy")])
def test_a_wrong_password_or_no_squid_gives_its_error_and_leaves_nothing(
        client: docker.DockerClient, upstream: Upstream, squid: Squid, workspace: Path, token: str, case: str,
        words: str) -> None:
    url = squid.url.replace(PASSWORD, "wrong-password") if case == "wrong password" else \
        squid.url.rsplit(":", 1)[0] + ":9"  # nothing listens there
    result = run_p(upstream, squid, workspace, HTTPS_PROXY=url)
    assert result.returncode == EXIT_GATE, result.stderr
    assert words in result.stderr and f"http://{USER}@" in result.stderr
    assert "wrong-password" not in result.stderr and PASSWORD not in result.stderr
    assert leftovers(client, AGENT) == []


def test_a_no_proxy_host_is_dialled_directly(upstream: Upstream, squid: Squid, workspace: Path, token: str) -> None:
    before = squid.log()
    stub = squid.stub_url.removeprefix("http://").split(":")[0]
    result = run_p(upstream, squid, workspace, https_proxy=squid.url, no_proxy=f"localhost,{stub}")
    assert result.returncode == 0, result.stderr
    assert DEFAULT_TEXT in result.stdout
    assert squid.log() == before, "nothing went through squid"
