"""A git server, a Python package index and a sliver of GitHub's API over HTTPS for bottle tests: ``git
http-backend`` behind TLS, on the tests' network, a simple index (PEP 503) of one wheel under ``/simple/``,
and ``/api/v3/user`` as GitHub Enterprise serves it (for ``gh``), that answer only requests
carrying one expected credential (Basic ``USER:TOKEN``) and log every request they get (method, Host, path,
Authorization) as a JSON line, so a test can see what reached them.

It runs from the bottle image with python3 (which has git), as an unprivileged user, with a leaf for its
names from a CA the test makes (``trustme``); the gate is given that CA as the agent's extra CA.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import secrets
import time
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import docker
import trustme
from docker.models.containers import Container

from tests.helpers import tar_archive

SERVER = r'''
import base64, http.server, json, os, ssl, subprocess, sys

ROOT = "/tmp/git"
EXPECTED = "Basic " + base64.b64encode(os.environ["GIT_AUTH"].encode()).decode()
for repo in sys.argv[1:]:
    path = f"{ROOT}/{repo}"
    subprocess.run(["git", "init", "-q", "--bare", "-b", "main", path], check=True)
    subprocess.run(["git", "-C", path, "config", "http.receivepack", "true"], check=True)

class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def body(self):
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            data = b""
            while (size := int(self.rfile.readline().strip(), 16)) > 0:
                data += self.rfile.read(size)
                self.rfile.readline()
            self.rfile.readline()
            return data
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def answer(self, status, headers, body):
        self.send_response(status)
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def serve(self):
        body = self.body()
        auth = self.headers.get_all("Authorization") or []
        print(json.dumps({"method": self.command, "host": self.headers.get("Host"), "path": self.path,
                          "authorization": auth, "body_has": [w for w in ("want", "report-status") if w.encode() in body]}),
              flush=True)
        if auth != [EXPECTED]:
            return self.answer(401, [("WWW-Authenticate", 'Basic realm="git"')], b"credentials refused\n")
        path, _, query = self.path.partition("?")
        if path == "/api/v3/user":  # the one GitHub API call the tests make (gh api user)
            return self.answer(200, [("Content-Type", "application/json")], b'{"login": "the-route-owner"}')
        if path.startswith(("/simple/", "/packages/")):
            file = os.path.normpath("/opt/git-server/index" + path + ("index.html" if path.endswith("/") else ""))
            if not file.startswith("/opt/git-server/index/") or not os.path.isfile(file):
                return self.answer(404, [], b"no such package\n")
            kind = "text/html" if file.endswith(".html") else "application/octet-stream"
            return self.answer(200, [("Content-Type", kind)], open(file, "rb").read())
        env = {"PATH": os.environ["PATH"], "GIT_PROJECT_ROOT": ROOT, "GIT_HTTP_EXPORT_ALL": "1",
               "REQUEST_METHOD": self.command, "PATH_INFO": path, "QUERY_STRING": query,
               "CONTENT_TYPE": self.headers.get("Content-Type", ""), "CONTENT_LENGTH": str(len(body)),
               "REMOTE_USER": "agent", "HTTP_CONTENT_ENCODING": self.headers.get("Content-Encoding", ""),
               "GIT_PROTOCOL": self.headers.get("Git-Protocol", "")}
        done = subprocess.run(["git", "http-backend"], input=body, env=env, capture_output=True)
        head, _, out = done.stdout.partition(b"\r\n\r\n")
        status, headers = 200, []
        for line in head.decode().split("\r\n"):
            name, _, value = line.partition(": ")
            if name.lower() == "status":
                status = int(value.split()[0])
            elif name:
                headers.append((name, value))
        self.answer(status, headers, out)

    do_GET = do_POST = serve

context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
context.load_cert_chain("/opt/git-server/leaf.pem")
server = http.server.ThreadingHTTPServer(("0.0.0.0", 8443), Handler)
server.socket = context.wrap_socket(server.socket, server_side=True)
print("git server serving", flush=True)
server.serve_forever()
'''


@dataclass
class GitServer:
    container: Container
    ca: trustme.CA
    names: tuple[str, ...]
    port: int = 8443

    def requests(self) -> list[dict[str, Any]]:
        lines = self.container.logs(stdout=True, stderr=False).decode().splitlines()
        return [json.loads(line) for line in lines if line.startswith("{")]

    def log(self, repo: str) -> str:
        """``git log`` of a repository on the server (empty when it has no commits)."""
        code, output = self.container.exec_run(["git", "-C", f"/tmp/git/{repo}", "log", "--format=%s", "main"])
        return output.decode() if code == 0 else ""


PACKAGE = "demo-pkg"
WHEEL = "demo_pkg-1.0-py3-none-any.whl"


def wheel() -> bytes:
    """A minimal wheel of ``demo_pkg`` 1.0, its RECORD with the right hashes."""
    files = {"demo_pkg/__init__.py": b"VALUE = 'installed through the gate'\n",
             "demo_pkg-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: demo-pkg\nVersion: 1.0\n",
             "demo_pkg-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                             b"Tag: py3-none-any\n"}
    record = "".join(f"{name},sha256={base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()},"
                     f"{len(data)}\n" for name, data in files.items()) + "demo_pkg-1.0.dist-info/RECORD,,\n"
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, data in {**files, "demo_pkg-1.0.dist-info/RECORD": record.encode()}.items():
            archive.writestr(name, data)
    return buffer.getvalue()


def index_files() -> dict[str, bytes]:
    data = wheel()
    page = f'<a href="/packages/{WHEEL}#sha256={hashlib.sha256(data).hexdigest()}">{WHEEL}</a>\n'
    return {f"git-server/index/simple/{PACKAGE}/index.html": page.encode(), f"git-server/index/packages/{WHEEL}": data}


@contextmanager
def git_server(client: docker.DockerClient, image: str, network: str, names: tuple[str, ...], auth: str,
               repos: tuple[str, ...], labels: dict[str, str]) -> Iterator[GitServer]:
    """The server, reachable on ``network`` as each of ``names`` (port 8443), accepting only Basic ``auth``
    (``USER:TOKEN``), with empty bare ``repos``. ``image``: the bottle image with python3."""
    ca = trustme.CA()
    leaf = ca.issue_cert(*names)
    pem = b"".join(blob.bytes() for blob in leaf.cert_chain_pems) + leaf.private_key_pem.bytes()
    container = client.containers.create(
        image, command=["python3", "/opt/git-server/server.py", *repos], environment={"GIT_AUTH": auth},
        name=f"claude-bottle-test-{secrets.token_hex(3)}-git", labels=labels, network=network,
        networking_config={network: client.api.create_endpoint_config(aliases=list(names))},
        cap_drop=["ALL"], security_opt=["no-new-privileges"], working_dir="/tmp", entrypoint=[])
    try:
        container.put_archive("/opt", tar_archive({"git-server/server.py": SERVER.encode(), "git-server/leaf.pem": pem,
                                                **index_files()}, mode=0o644))
        container.start()
        deadline = time.monotonic() + 30
        while b"git server serving" not in container.logs():
            container.reload()
            if container.status == "exited" or time.monotonic() > deadline:
                raise RuntimeError(f"the git server did not start: {container.logs().decode()[-2000:]}")
            time.sleep(0.1)
        yield GitServer(container, ca, names)
    finally:
        container.remove(force=True)
