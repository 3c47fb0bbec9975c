"""HTTPS servers on the tests' own network for clients in a real bottle: a static npm registry, a PEP 503
("simple") package index, and a collector that takes any request. Each logs every request it reads, as far
as it got (a request cut off mid-body is logged with what arrived), in a file the test reads, so a test can tell what reached it.

They run stdlib Python in a container of the gate image, with leaves from a CA the test makes; the real gate
trusts that CA toward them (``Launch.upstream_ca_files``) and terminates the bottle's tunnels to them with
leaves of its own CA, so the bottle's clients (npm, pip, curl) talk to the gate and the gate to these.

Why static servers and not verdaccio or pypiserver: npm and pip are the real clients either way, and what
is tested is the gate between them and the registry (which methods and paths it lets through, what it
refuses). Static documents built in the test (a package document with its tarball's URL and integrity, an
index page with the wheel's hash) are what those servers would answer to an install; a publish (npm's PUT,
twine's POST) is accepted and logged, so a write that got past the gate would show.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import secrets
import tarfile
import time
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker
from cryptography.hazmat.primitives import serialization
from docker.models.containers import Container

from claude_bottle.gate import ca as ca_module
from claude_bottle.gate.ca import RunCA
from claude_bottle.policy.hosts import Allowlist
from tests.bottle.conftest import TEST_LABEL
from tests.helpers import tar_archive

NPM, PYPI, COLLECT = "npm-registry", "pypi-registry", "collect"
PORTS = {NPM: 8443, PYPI: 9443, COLLECT: 7443}

SERVER = r'''
import http.server, json, os, socket, ssl, sys, threading, urllib.parse

ROOT = "/opt/srv"
LOG = "/tmp/requests.jsonl"
WRITES = {"PUT", "POST", "DELETE", "PATCH"}
lock = threading.Lock()

class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = 60

    def log_message(self, *args):
        pass

    def read_body(self, got):
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            while True:
                line = self.rfile.readline()
                if not line.endswith(b"\n"):
                    raise ConnectionError("cut off")
                size = int(line.split(b";")[0].strip(), 16)
                if size == 0:
                    if self.rfile.readline() != b"\r\n":
                        raise ConnectionError("cut off")
                    return
                while size:
                    piece = self.rfile.read(min(size, 65536))
                    if not piece:
                        raise ConnectionError("cut off")
                    got.append(piece)
                    size -= len(piece)
                if self.rfile.readline() != b"\r\n":
                    raise ConnectionError("cut off")
        length = int(self.headers.get("Content-Length") or 0)
        while length:
            piece = self.rfile.read(min(length, 65536))
            if not piece:
                raise ConnectionError("cut off")
            got.append(piece)
            length -= len(piece)

    def handle_one(self):
        got, complete = [], False
        try:
            self.read_body(got)
            complete = True
        except (OSError, ValueError, ssl.SSLError):
            pass
        finally:
            line = json.dumps({"server": self.server.name, "method": self.command, "target": self.path,
                               "headers": [[k, v] for k, v in self.headers.items()],
                               "body": b"".join(got).decode("latin-1"), "complete": complete})
            with lock, open(LOG, "a") as log:
                log.write(line + "\n")
        if not complete:
            self.close_connection = True
            return
        if self.server.name in REQUIRED and self.headers.get("Authorization") != REQUIRED[self.server.name]:
            self.answer(401, b'{"error": "authentication required"}\n', "application/json")
            return
        if self.server.name == "collect" or self.command in WRITES:
            self.answer(201 if self.command in WRITES and self.server.name != "collect" else 200,
                        b'{"ok": true}\n', "application/json")
            return
        path = os.path.normpath(ROOT + "/" + self.server.name + urllib.parse.unquote(self.path.split("?")[0]))
        if os.path.isdir(path):
            path += "/index"
        if not path.startswith(ROOT + "/") or not os.path.isfile(path):
            self.answer(404, b"not found\n", "text/plain")
            return
        with open(path, "rb") as f:
            data = f.read()
        kind = ("application/json" if data.startswith(b"{") else "text/html" if data.startswith(b"<")
                else "application/octet-stream")
        self.answer(200, data if self.command != "HEAD" else b"", kind, len(data))

    def answer(self, status, data, kind, length=None):
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data) if length is None else length))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = do_PATCH = handle_one

def serve(name, port):
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(f"/opt/tls/{name}.pem")
    server = http.server.ThreadingHTTPServer(("0.0.0.0", port), Handler)
    server.name = name
    server.socket = context.wrap_socket(server.socket, server_side=True)
    server.serve_forever()

ports = json.loads(sys.argv[1])
REQUIRED = json.loads(sys.argv[2])  # server name -> the Authorization header it accepts, else 401
for name, port in list(ports.items())[1:]:
    threading.Thread(target=serve, args=(name, port), daemon=True).start()
print("https servers serving", flush=True)
serve(*list(ports.items())[0])
'''


def leaf_pem(ca: RunCA, host: str) -> bytes:
    """A leaf for ``host`` from ``ca``, with its key, as one PEM file for a server."""
    name, ip = ca_module.normalize_host(host)
    leaf, key = ca._mint(name, ip, time.time())
    return leaf.public_bytes(serialization.Encoding.PEM) + key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())


# ---- what the registries serve, built here --------------------------------------------------------------

@dataclass(frozen=True)
class Package:
    name: str
    version: str
    greeting: str  # what the installed package says, so a test knows it was installed from here


def npm_files(package: Package) -> dict[str, bytes]:
    """A package tarball as ``npm pack`` makes it (``package/`` inside a gzip'd tar) and its package
    document, whose ``dist`` names the tarball's URL on the registry and its sha512 integrity."""
    manifest = {"name": package.name, "version": package.version, "main": "index.js"}
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for name, data in (("package/package.json", json.dumps(manifest).encode()),
                           ("package/index.js", f"exports.greeting = {json.dumps(package.greeting)};\n".encode())):
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o644, 499162500
            archive.addfile(info, io.BytesIO(data))
    tarball = buffer.getvalue()
    filename = f"{package.name}-{package.version}.tgz"
    url = f"https://{NPM}:{PORTS[NPM]}/{package.name}/-/{filename}"
    document = {"name": package.name, "dist-tags": {"latest": package.version}, "versions": {package.version: {
        **manifest, "_id": f"{package.name}@{package.version}", "dist": {
            "tarball": url, "shasum": hashlib.sha1(tarball).hexdigest(),
            "integrity": "sha512-" + base64.b64encode(hashlib.sha512(tarball).digest()).decode()}}}}
    return {f"srv/{NPM}/{package.name}/index": json.dumps(document).encode(),
            f"srv/{NPM}/{package.name}/-/{filename}": tarball}


def pypi_files(package: Package) -> dict[str, bytes]:
    """A wheel of one module and the PEP 503 pages that list it, linking it with its sha256."""
    module = package.name.replace("-", "_")
    info = f"{module}-{package.version}.dist-info"
    files = {
        f"{module}/__init__.py": f"GREETING = {package.greeting!r}\n".encode(),
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {package.name}\nVersion: {package.version}\n".encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: claude-bottle-tests\nRoot-Is-Purelib: true\n"
                         b"Tag: py3-none-any\n",
    }

    def digest(data: bytes) -> str:
        return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()

    record = "".join(f"{name},{digest(data)},{len(data)}\n" for name, data in files.items()) + f"{info}/RECORD,,\n"
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as wheel:
        for name, data in {**files, f"{info}/RECORD": record.encode()}.items():
            wheel.writestr(name, data)
    data = buffer.getvalue()
    wheel_name = f"{module}-{package.version}-py3-none-any.whl"
    page = (f'<!DOCTYPE html><html><body><a href="../../packages/{wheel_name}#sha256='
            f'{hashlib.sha256(data).hexdigest()}">{wheel_name}</a></body></html>\n')
    return {f"srv/{PYPI}/simple/index": f'<!DOCTYPE html><html><body><a href="{package.name}/">{package.name}</a>'
                                        f"</body></html>\n".encode(),
            f"srv/{PYPI}/simple/{package.name}/index": page.encode(),
            f"srv/{PYPI}/packages/{wheel_name}": data}


# ---- the container ---------------------------------------------------------------------------------------

@dataclass
class Servers:
    container: Container
    ca_file: Path  # the servers' CA, for the gate to trust toward them (Launch.upstream_ca_files)

    def requests(self, server: str | None = None) -> list[dict[str, Any]]:
        """Every request the servers read (a log file: bodies make lines longer than the engine's log keeps
        whole), oldest first."""
        _, output = self.container.exec_run(["sh", "-c", "cat /tmp/requests.jsonl 2>/dev/null; true"])
        found = [json.loads(line) for line in output.decode("utf-8").splitlines() if line]
        return [r for r in found if server is None or r["server"] == server]

    def log(self) -> str:
        return self.container.logs(stdout=True, stderr=True).decode("utf-8", "replace")


@contextmanager
def https_servers(client: docker.DockerClient, gate_image: str, network: str, ca_dir: Path,
                  files: dict[str, bytes] | None = None, required: dict[str, str] | None = None) -> Iterator[Servers]:
    """The three servers in one container known on ``network`` by their names, serving ``files``
    (paths under ``srv/<server>/``; a directory's document is its ``index``). A server named in ``required``
    answers 401 to every request without exactly that Authorization header."""
    ca = RunCA.generate(Allowlist.parse(list(PORTS)).patterns)
    ca_file = ca_dir / "https-servers-ca.pem"
    ca_file.write_bytes(ca.certificate_pem)
    ca_file.chmod(0o644)  # read by the gate's user
    container = client.containers.create(
        gate_image, entrypoint=["/opt/gate/bin/python", "/opt/srv.py", json.dumps(PORTS), json.dumps(required or {})],
        name=f"claude-bottle-test-{secrets.token_hex(3)}-https", labels={TEST_LABEL: "1"}, network=network,
        networking_config={network: client.api.create_endpoint_config(aliases=list(PORTS))},
        cap_drop=["ALL"], security_opt=["no-new-privileges"])
    try:
        container.put_archive("/opt", tar_archive({"srv.py": SERVER.encode(), **(files or {}),
                                           **{f"tls/{name}.pem": leaf_pem(ca, name) for name in PORTS}}, mode=0o644))
        container.start()
        deadline = time.monotonic() + 30
        while b"https servers serving" not in container.logs():
            container.reload()
            if container.status == "exited" or time.monotonic() > deadline:
                raise AssertionError(container.logs().decode())
            time.sleep(0.1)
        yield Servers(container, ca_file)
    finally:
        container.remove(force=True)
