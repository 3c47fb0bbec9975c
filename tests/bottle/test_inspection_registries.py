"""npm and pip in a real bottle install from registries over HTTPS through the real gate, which terminates
their tunnels and holds the registries to read-only rules: installs work, publishes are refused before they
reach the registry.

The registries (tests/bottle/https_servers.py) are static servers on the tests' own network serving a
package built here; they accept a publish, so one that got past the gate would show in their log and in
the client's exit code. The rules are the read-only presets' own (``npm-read``, ``pypi-read``) for these
hosts, as an agent would write them in ``[[egress]]``.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator

import docker
import pytest

from claude_bottle.agent.presets import READ_PRESETS
from claude_bottle.runtime.run import Run
from claude_bottle.verify.standins import in_bottle
from tests.bottle.conftest import ImagesFor, Upstream, bottle_against, gate_audit
from tests.bottle.https_servers import NPM, PORTS, PYPI, Package, Servers, https_servers, npm_files, pypi_files

pytestmark = pytest.mark.docker
PACKAGES = ("python3-pip", "nodejs", "npm")  # not in the bottle image by default
PACKAGE = Package("hello-bottle", "1.0.0", "installed through the gate " + secrets.token_hex(4))
NPM_URL, PYPI_URL = f"https://{NPM}:{PORTS[NPM]}/", f"https://{PYPI}:{PORTS[PYPI]}/"


def read_only_rules(preset: str) -> list[str]:
    """The allow rules of a read-only preset, as [[egress]] writes them."""
    (entry, *_) = READ_PRESETS[preset]
    return [f"{rule.method} {rule.path}" for rule in entry.allow]


def agent_toml(subnet: str) -> str:
    return (f'version = 1\nallow_private = ["{subnet}"]\nextra_packages = {json.dumps(PACKAGES)}\n'
            f'[[egress]]\nhost = "{NPM}:{PORTS[NPM]}"\nallow = {json.dumps(read_only_rules("npm-read"))}\n'
            f'[[egress]]\nhost = "{PYPI}:{PORTS[PYPI]}"\nallow = {json.dumps(read_only_rules("pypi-read"))}\n')


@pytest.fixture(scope="module")
def images(images_for: ImagesFor) -> tuple[str, str]:
    return images_for(*PACKAGES)


@pytest.fixture(scope="module")
def servers(client: docker.DockerClient, upstream: Upstream, images: tuple[str, str],
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[Servers]:
    with https_servers(client, images[1], upstream.network, tmp_path_factory.mktemp("ca"),
                       {**npm_files(PACKAGE), **pypi_files(PACKAGE)}) as found:
        yield found


@pytest.fixture(scope="module")
def bottle(client: docker.DockerClient, upstream: Upstream, images: tuple[str, str], servers: Servers,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    with bottle_against(client, upstream, "registries", agent_toml(upstream.subnet),
                        tmp_path_factory.mktemp("registries"), (servers.ca_file,)) as run:
        yield run


def test_npm_installs_from_a_registry_through_the_terminating_gate(bottle: Run, servers: Servers) -> None:
    code, output = in_bottle(bottle, f"mkdir -p /tmp/app && cd /tmp/app && timeout 120 npm install "
                                         f"--registry {NPM_URL} --no-audit --no-fund {PACKAGE.name} 2>&1 && "
                                         f"node -e 'console.log(require(\"{PACKAGE.name}\").greeting)'")
    assert code == 0 and PACKAGE.greeting in output, output
    seen = {(r["method"], r["target"]) for r in servers.requests(NPM)}
    assert ("GET", f"/{PACKAGE.name}") in seen  # the package document, then the tarball it names
    assert ("GET", f"/{PACKAGE.name}/-/{PACKAGE.name}-{PACKAGE.version}.tgz") in seen
    allowed = [r for r in gate_audit(bottle) if r.get("target") == f"{NPM}:{PORTS[NPM]}" and r["method"] == "GET"]
    assert allowed and all(r["rule"] == f"[[egress]] {NPM}:{PORTS[NPM]} allow GET /**" for r in allowed), allowed


def test_pip_installs_from_an_index_through_the_terminating_gate(bottle: Run, servers: Servers) -> None:
    code, output = in_bottle(bottle, f"timeout 120 pip install --no-cache-dir --disable-pip-version-check "
                                         f"--target /tmp/site --index-url {PYPI_URL}simple/ {PACKAGE.name} 2>&1 && "
                                         "PYTHONPATH=/tmp/site python3 -c 'import hello_bottle; "
                                         "print(hello_bottle.GREETING)'")
    assert code == 0 and PACKAGE.greeting in output, output
    seen = {(r["method"], r["target"]) for r in servers.requests(PYPI)}
    assert ("GET", f"/simple/{PACKAGE.name}/") in seen
    assert ("GET", f"/packages/hello_bottle-{PACKAGE.version}-py3-none-any.whl") in seen


def test_npm_publish_is_refused_by_the_read_only_rule(bottle: Run, servers: Servers) -> None:
    """npm publish sends the package to the registry with PUT; the read-only rules allow no PUT."""
    script = ("mkdir -p /tmp/pub && cd /tmp/pub && "
              "printf '%s' '{\"name\": \"bottle-published\", \"version\": \"1.0.0\"}' > package.json && "
              f"printf '//{NPM}:{PORTS[NPM]}/:_authToken=not-a-credential\\n' > .npmrc && "
              f"timeout 120 npm publish --userconfig /tmp/pub/.npmrc --registry {NPM_URL} 2>&1")
    code, output = in_bottle(bottle, script)
    assert code != 0 and "403" in output, output
    assert [r for r in servers.requests(NPM) if r["method"] != "GET"] == []
    (refused,) = [r for r in gate_audit(bottle) if r["method"] == "PUT"]
    assert (refused["decision"], refused["status"], refused["path"]) == ("deny", 403, "/bottle-published")
    assert refused["rule"] == f"[[egress]] {NPM}:{PORTS[NPM]} allow list", refused
    assert refused["reason"].startswith(f"PUT matches no allow rule of [[egress]] {NPM}:{PORTS[NPM]}"), refused


def test_an_upload_to_the_index_is_refused_by_the_read_only_rule(bottle: Run, servers: Servers) -> None:
    """An upload as twine sends it (a form POST to the legacy upload API), with the wheel just installed."""
    wheel = f"/tmp/hello_bottle-{PACKAGE.version}-py3-none-any.whl"
    script = (f"curl -sS -o {wheel} {PYPI_URL}packages/{wheel.rsplit('/', 1)[1]} && "
              f"curl -sS --suppress-connect-headers -D - -o /dev/null --max-time 30 -F ':action=file_upload' -F name={PACKAGE.name} "
              f"-F version=2.0.0 -F content=@{wheel} {PYPI_URL}legacy/ 2>&1")
    code, output = in_bottle(bottle, script)
    assert code == 0 and output.startswith("HTTP/1.1 403"), output
    assert f"x-deny-reason: POST matches no allow rule of [[egress]] {PYPI}:{PORTS[PYPI]}" in output, output
    assert [r for r in servers.requests(PYPI) if r["method"] == "POST"] == []
    (refused,) = [r for r in gate_audit(bottle) if r["method"] == "POST" and r.get("target") == f"{PYPI}:{PORTS[PYPI]}"]
    assert (refused["decision"], refused["status"], refused["path"]) == ("deny", 403, "/legacy/")
    assert refused["rule"] == f"[[egress]] {PYPI}:{PORTS[PYPI]} allow list", refused
