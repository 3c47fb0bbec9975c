"""The gate's CA in a real bottle: every client there trusts what it signs, the bottle cannot change that, and
its key is nowhere but the gate's memory.

The key never leaves the gate, so no server outside it can present a leaf of the real CA. The TLS server here
presents a leaf minted by the same code (``RunCA``) from a CA the test makes, and that CA's certificate rides
the same plumbing as the gate's: it is appended to what the gate announced, before the host adds the
announcement to the bottle's trust store and sets the variables. The store is checked to hold the gate's
own certificate, byte for byte. A second port presents a leaf of a CA nobody installed: every client must
refuse that one, so the test proves verification, not just connectivity.

The target is on the tests' own network, reached through the gate's proxy as a raw tunnel (``allow_tcp``):
the client's TLS ends at the test server whatever the gate does with other tunnels.

The real path is the last test: the same target allowed for inspection, so the gate terminates the tunnel
with a leaf of its own CA and verifies the target itself (the test's CA as the agent's extra CA, which builds
images of their own); curl and git in the bottle must trust that leaf, issued by the CA this gate announced.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import docker
import pytest
from cryptography import x509
from cryptography.x509.oid import NameOID
from docker.models.containers import Container

from claude_bottle.agent.load import load_agent
from claude_bottle.credentials import Credential
from claude_bottle.gate.ca import RunCA
from claude_bottle.gate.ready import parse_ready
from claude_bottle.gate.settings import parse_upstream
from claude_bottle.launch import Launch, started
from claude_bottle.policy.hosts import Allowlist
from claude_bottle.runtime import run as run_module
from claude_bottle.runtime.files import SYSTEM_BUNDLE
from claude_bottle.runtime.gate import CONTROL_SOCKET
from claude_bottle.runtime.run import Run
from claude_bottle.verify.standins import in_bottle as inside
from tests.bottle.conftest import TEST_LABEL, ImagesFor, Upstream, gate_audit, gate_log, leftovers, write_agent
from tests.bottle.https_servers import leaf_pem
from tests.helpers import tar_archive

pytestmark = pytest.mark.docker
TARGET = "tls-target"
TRUSTED, UNTRUSTED = 8443, 9443
PACKAGES = ("python3", "nodejs")  # not in the bottle image by default

SERVER = r'''
import http.server, ssl, threading

def pkt(text):
    data = text.encode()
    return b"%04x" % (len(data) + 4) + data

COMMIT = "1" * 40
REFS = (pkt("# service=git-upload-pack\n") + b"0000" + pkt(f"{COMMIT} HEAD\0symref=HEAD:refs/heads/main\n")
        + pkt(f"{COMMIT} refs/heads/main\n") + b"0000")

class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self):
        git = "info/refs" in self.path
        body = REFS if git else b"trusted by the bottle\n"
        self.send_response(200)
        self.send_header("Content-Type", "application/x-git-upload-pack-advertisement" if git else "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

def serve(port, name):
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(f"/opt/tls/{name}.pem")
    server = http.server.ThreadingHTTPServer(("0.0.0.0", port), Handler)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    server.serve_forever()

threading.Thread(target=serve, args=(9443, "untrusted"), daemon=True).start()
print("tls target serving", flush=True)
serve(8443, "trusted")
'''

NODE = r'''
const http = require("http"), tls = require("tls");
const proxy = new URL(process.env.HTTPS_PROXY);
const req = http.request({host: proxy.hostname, port: proxy.port, method: "CONNECT", path: process.env.TARGET});
req.on("connect", (res, socket) => {
  if (res.statusCode !== 200) { console.log("CONNECT answered " + res.statusCode); process.exit(3); }
  const s = tls.connect({socket, servername: process.env.TARGET.split(":")[0]}, () => {
    s.write("GET / HTTP/1.1\r\nHost: tls-target\r\nConnection: close\r\n\r\n");
  });
  let data = "";
  s.on("data", d => { data += d; });
  s.on("end", () => { console.log(data.split("\r\n\r\n")[1]); });
  s.on("error", e => { console.log("TLS error " + e.code); process.exit(2); });
});
req.on("error", e => { console.log("proxy error " + e.message); process.exit(4); });
req.end();
'''


@pytest.fixture(scope="module")
def images(images_for: ImagesFor) -> tuple[str, str]:
    """The bottle image with python3 and node, which it lacks by default."""
    return images_for(*PACKAGES)


@pytest.fixture(scope="module")
def test_ca() -> RunCA:
    return RunCA.generate(Allowlist.parse([f"{TARGET}:{TRUSTED}"]).patterns)


@pytest.fixture(scope="module")
def tls_target(client: docker.DockerClient, upstream: Upstream, images: tuple[str, str],
               test_ca: RunCA) -> Iterator[Container]:
    stranger = RunCA.generate(Allowlist.parse([TARGET]).patterns)  # a CA no bottle trusts
    container = client.containers.create(
        images[1], entrypoint=["/opt/gate/bin/python", "/opt/tls/server.py"],
        name=f"claude-bottle-test-{secrets.token_hex(3)}-tls", labels={TEST_LABEL: "1"}, network=upstream.network,
        networking_config={upstream.network: client.api.create_endpoint_config(aliases=[TARGET])},
        cap_drop=["ALL"], security_opt=["no-new-privileges"])
    try:
        container.put_archive("/opt", tar_archive({"tls/server.py": SERVER.encode(),
                                                   "tls/trusted.pem": leaf_pem(test_ca, TARGET),
                                                   "tls/untrusted.pem": leaf_pem(stranger, TARGET)}, mode=0o644))
        container.start()
        deadline = time.monotonic() + 30
        while b"tls target serving" not in container.logs():
            assert time.monotonic() < deadline, container.logs().decode()
            time.sleep(0.1)
        yield container
    finally:
        container.remove(force=True)


@dataclass
class Bottle:
    run: Run
    announced: bytes  # the CA certificate the real gate announced


@pytest.fixture
def bottle(client: docker.DockerClient, upstream: Upstream, token: str, workspace: Path, images: tuple[str, str],
           test_ca: RunCA, tls_target: Container, monkeypatch: pytest.MonkeyPatch) -> Iterator[Bottle]:
    announced: list[bytes] = []

    add_ca = run_module.add_ca

    def gate_ca_and_the_tests(store: Path, certificate_pem: bytes) -> None:
        announced.append(certificate_pem)
        add_ca(store, certificate_pem + test_ca.certificate_pem)

    monkeypatch.setattr(run_module, "add_ca", gate_ca_and_the_tests)
    write_agent("trusting", f'allow_tcp = ["{TARGET}:{TRUSTED}", "{TARGET}:{UNTRUSTED}"]\n'
                            f'allow_private = ["{upstream.subnet}"]\nextra_packages = {json.dumps(PACKAGES)}\n')
    launch = Launch(load_agent("trusting", workspace), workspace, Credential.parse(token, "test"),
                    parse_upstream(upstream.url), (upstream.network,))
    with started(launch, lambda line: None) as run:
        run.create_bottle(["sleep", "600"], tty=False)
        run.engine.start(run.names.bottle)
        yield Bottle(run, announced[-1])
    assert leftovers(client, "trusting") == []


CLIENTS = {
    "curl": ("curl -sS --max-time 20 https://{target}/", "trusted by the bottle"),
    "git": ("GIT_TERMINAL_PROMPT=0 timeout 30 git ls-remote https://{target}/repo.git", "refs/heads/main"),
    "python3": ("timeout 30 python3 -c 'import sys, urllib.request; "
                "print(urllib.request.urlopen(sys.argv[1], timeout=20).read().decode())' https://{target}/",
                "trusted by the bottle"),
    "node": (f"TARGET={{target}} timeout 30 node -e '{NODE}'", "trusted by the bottle"),
    # Node's own roots, as Claude Code's runtime has them: only NODE_EXTRA_CA_CERTS adds the gate's CA there
    "node --use-bundled-ca": (f"TARGET={{target}} timeout 30 node --use-bundled-ca -e '{NODE}'",
                              "trusted by the bottle"),
}


def test_every_client_trusts_the_run_ca_and_refuses_a_stranger(bottle: Bottle, test_ca: RunCA) -> None:
    code, store = inside(bottle.run, f"cat {SYSTEM_BUNDLE}")
    assert code == 0 and bottle.announced.decode() in store and test_ca.certificate_pem.decode() in store
    assert store.count("BEGIN CERTIFICATE") > 100, "the system's roots are still there"
    failures = []
    for client, (command, expected) in CLIENTS.items():
        code, output = inside(bottle.run, command.replace("{target}", f"{TARGET}:{TRUSTED}") + " 2>&1")
        if code != 0 or expected not in output:
            failures.append(f"{client} does not trust the run's CA (exit {code}): {output[-300:]}")
        code, output = inside(bottle.run, command.replace("{target}", f"{TARGET}:{UNTRUSTED}") + " 2>&1")
        if code == 0 or expected in output:
            failures.append(f"{client} accepted a leaf of a CA it was never given: {output[-300:]}")
    assert failures == []


def test_the_bottle_cannot_change_what_it_trusts(bottle: Bottle) -> None:
    """The bundle is a host file mounted read-only: owned by whoever started the bottle (whose uid the bottle
    runs as), so the mount, not the owner, is what stops a write."""
    assert inside(bottle.run, f"stat -c '%a' {SYSTEM_BUNDLE}")[1].strip() == "644"
    mount = inside(bottle.run, f"grep ' {SYSTEM_BUNDLE} ' /proc/self/mountinfo")[1].split()
    assert "ro" in mount[5].split(","), mount
    before = inside(bottle.run, f"sha256sum {SYSTEM_BUNDLE}")[1]
    for attack in (f"echo x >> {SYSTEM_BUNDLE}", f"cp /dev/null {SYSTEM_BUNDLE}", f"rm -f {SYSTEM_BUNDLE}",
                   f"mv {SYSTEM_BUNDLE} /tmp/x", "update-ca-certificates", f"chmod 666 {SYSTEM_BUNDLE}"):
        code, output = inside(bottle.run, attack + " 2>&1")
        assert code != 0, f"{attack}: {output}"
    assert inside(bottle.run, f"sha256sum {SYSTEM_BUNDLE}")[1] == before


def test_the_ca_key_is_nowhere_but_the_gates_memory(client: docker.DockerClient, bottle: Bottle,
                                                    images: tuple[str, str]) -> None:
    run = bottle.run
    gate = client.containers.get(run.names.gate)
    code, found = inside(run, "grep -rlsIE -D skip 'PRIVATE KEY|BEGIN EC' / --exclude-dir=proc --exclude-dir=sys")
    assert code in (1, 2) and found == "", f"private keys in the bottle: {found}"
    assert inside(run, f"grep -c CERTIFICATE {SYSTEM_BUNDLE}")[1].strip() != "0", "the search must find what is there"
    code, output = gate.exec_run(["find", "/tmp", "-mindepth", "1"])
    assert code == 0 and output.decode().split() == [CONTROL_SOCKET], f"the gate wrote files: {output!r}"
    code, output = gate.exec_run(["find", "/tmp", "-mindepth", "1", "!", "-type", "s"])
    assert code == 0 and output == b"", f"the gate wrote files: {output!r}"  # the control socket holds no data
    assert not gate.diff(), "the gate changed its file system"
    seen = [json.dumps(client.api.inspect_container(name)) for name in (run.names.gate, run.names.bottle)]
    seen += [json.dumps(client.api.inspect_image(image)) for image in images]
    seen.append(gate_log(run))
    assert all("PRIVATE KEY" not in text and "BEGIN EC" not in text for text in seen)
    assert bottle.announced.decode() not in seen[-1]  # the log carries it as one base64 line, not as PEM
    ready = parse_ready(seen[-1])
    assert ready is not None and ready.ca_pem() == bottle.announced


def test_clients_trust_the_leaves_the_real_gate_mints(client: docker.DockerClient, upstream: Upstream, token: str,
                                                      workspace: Path, test_ca: RunCA, tls_target: Container,
                                                      tmp_path: Path) -> None:
    """The real path: a tunnel to an allowed host, terminated by the gate with a leaf of its own CA (whose key
    never left it), the gate verifying the target against the agent's extra CA. curl and git in the bottle
    trust that leaf, and the gate reads their requests."""
    ca_file = tmp_path / "target-ca.pem"
    ca_file.write_bytes(test_ca.certificate_pem)  # trusted by the gate toward the target (and the images)
    write_agent("inspected", f'allow = ["{TARGET}:{TRUSTED}"]\nallow_private = ["{upstream.subnet}"]\n'
                             f'extra_ca_certificates = ["{ca_file}"]\n')
    launch = Launch(load_agent("inspected", workspace), workspace, Credential.parse(token, "test"),
                    parse_upstream(upstream.url), (upstream.network,))
    with started(launch, lambda line: None) as run:
        run.create_bottle(["sleep", "600"], tty=False)
        run.engine.start(run.names.bottle)
        (name,) = x509.load_pem_x509_certificate(run.gate_ca).subject.get_attributes_for_oid(NameOID.COMMON_NAME)
        code, curl = inside(run, f"curl -sS -v --max-time 20 https://{TARGET}:{TRUSTED}/ 2>&1")
        code_git, git = inside(run, f"GIT_TERMINAL_PROMPT=0 timeout 30 git ls-remote https://{TARGET}:{TRUSTED}/repo.git 2>&1")
        audit = gate_audit(run)
    assert code == 0 and "trusted by the bottle" in curl, curl
    assert f"issuer: O=claude-bottle; CN={name.value}" in curl, curl  # this gate's own CA
    assert code_git == 0 and "refs/heads/main" in git, git
    assert {(r["method"], r.get("path")) for r in audit if r["decision"] == "allow"} >= {
        ("GET", "/"), ("GET", "/repo.git/info/refs")}
    assert leftovers(client, "inspected") == []
