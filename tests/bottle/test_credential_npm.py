"""npm in a real bottle installs a private package from a registry that requires a token, through a credential
route: the bottle holds only the run's sentinel (where npm reads a registry's token), the gate sends the real
one, and a token the agent brings of its own never reaches the registry.

The registry (tests/bottle/https_servers.py) answers 401 to every request without the real token's header,
so an install proves the gate authenticated it; it logs every request's headers, so the test sees what each
one carried.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from dataclasses import dataclass

import docker
import pytest

from claude_bottle.runtime.run import Run
from claude_bottle.verify.standins import in_bottle
from tests.bottle.conftest import ImagesFor, Upstream, bottle_against, gate_log
from tests.bottle.https_servers import NPM, PORTS, Package, Servers, https_servers, npm_files
from tests.bottle.test_inspection_registries import PACKAGES

pytestmark = pytest.mark.docker
PRIVATE = Package("private-bottle", "1.0.0", "a private package " + secrets.token_hex(4))
REGISTRY = f"https://{NPM}:{PORTS[NPM]}/"
REAL = "npm_" + secrets.token_hex(18)  # npm's token format, so DLP would know it anywhere else too
TOKEN_VARIABLE = f"npm_config_//{NPM}:{PORTS[NPM]}/:_authToken"  # npm's per-registry token, as a variable


@pytest.fixture(scope="module")
def images(images_for: ImagesFor) -> tuple[str, str]:
    return images_for(*PACKAGES)


@pytest.fixture(scope="module")
def servers(client: docker.DockerClient, upstream: Upstream, images: tuple[str, str],
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[Servers]:
    with https_servers(client, images[1], upstream.network, tmp_path_factory.mktemp("ca"), npm_files(PRIVATE),
                       required={NPM: f"Bearer {REAL}"}) as found:
        yield found


@dataclass
class Bottle:
    run: Run
    sentinel: str


@pytest.fixture(scope="module")
def bottle(client: docker.DockerClient, upstream: Upstream, images: tuple[str, str], servers: Servers,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bottle]:
    agent = (f'version = 1\nallow_private = ["{upstream.subnet}"]\nextra_packages = {json.dumps(PACKAGES)}\n'
             f'[credentials.registry]\nhosts = ["{NPM}:{PORTS[NPM]}"]\nscheme = "bearer"\nenv = "TEST_NPM_TOKEN"\n'
             f'bottle_env = ["{TOKEN_VARIABLE}"]\n')
    with bottle_against(client, upstream, "npmroute", agent, tmp_path_factory.mktemp("npm-route"),
                        (servers.ca_file,), {"TEST_NPM_TOKEN": REAL}) as run:
        yield Bottle(run, run.spec.routes[0].spec.sentinel)


def install(bottle: Bottle, folder: str, npm: str = "npm") -> tuple[int, str]:
    return in_bottle(bottle.run, f"mkdir -p {folder} && cd {folder} && timeout 120 {npm} install "
                                 f"--registry {REGISTRY} --no-audit --no-fund {PRIVATE.name} 2>&1 && "
                                 f"node -e 'console.log(require(\"{PRIVATE.name}\").greeting)'")


def authorizations(servers: Servers) -> set[str]:
    return {value for r in servers.requests(NPM) for name, value in r["headers"] if name.lower() == "authorization"}


def test_npm_installs_a_private_package_with_the_sentinel_the_registry_sees_the_real_token(
        bottle: Bottle, servers: Servers) -> None:
    code, environment = in_bottle(bottle.run, "printenv")
    assert code == 0 and f"{TOKEN_VARIABLE}={bottle.sentinel}" in environment
    assert REAL not in environment
    code, output = install(bottle, "/tmp/app")
    assert code == 0 and PRIVATE.greeting in output, output
    seen = {(r["method"], r["target"]) for r in servers.requests(NPM)}
    assert ("GET", f"/{PRIVATE.name}/-/{PRIVATE.name}-{PRIVATE.version}.tgz") in seen
    assert authorizations(servers) == {f"Bearer {REAL}"}, "the registry saw another credential than the route's"


def test_a_token_the_agent_brings_is_replaced_by_the_routes_own(bottle: Bottle, servers: Servers) -> None:
    """A hijacked agent with a registry token of its own (an attacker's account) cannot use it on the bound
    host: the gate sends the route's token instead, so whatever it does there is the user's account, under the
    route's rules."""
    own = "npm_" + secrets.token_hex(18)
    assert in_bottle(bottle.run, f"printf '//{NPM}:{PORTS[NPM]}/:_authToken={own}\\n' > /tmp/own.npmrc")[0] == 0
    # without the sentinel's variable, which npm would prefer to any file
    code, output = install(bottle, "/tmp/own", f"env -u '{TOKEN_VARIABLE}' npm --userconfig /tmp/own.npmrc")
    assert code == 0 and PRIVATE.greeting in output, output
    assert authorizations(servers) == {f"Bearer {REAL}"}
    assert not any(own in json.dumps(r) for r in servers.requests())


def test_the_real_token_is_nowhere_the_bottle_or_the_audit_can_see(client: docker.DockerClient,
                                                                   bottle: Bottle) -> None:
    run = bottle.run
    code, found = in_bottle(run, f"grep -rlsF -D skip '{REAL}' / --exclude-dir=proc --exclude-dir=sys")
    assert code in (1, 2) and found == "", f"the real token in the bottle: {found}"
    inspected = [json.dumps(client.api.inspect_container(name)) for name in (run.names.gate, run.names.bottle)]
    assert all(REAL not in text for text in inspected)
    assert REAL not in gate_log(run)
