"""Internal networks kept between runs (Docker): a later run takes one, two runs never share one.

A run's internal network is its bottle's only network; a bottle that shared it with another run would reach
that run's gate and bottle. The attacks here leave things on a kept network (another run still on it without
its claim, a container someone connected) and check that no later run is given it.
"""

from __future__ import annotations

import contextlib
import secrets
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import docker
import pytest
from docker.models.networks import Network

from claude_bottle.agent.load import load_agent
from claude_bottle.credentials import Credential
from claude_bottle.gate.settings import parse_upstream
from claude_bottle.launch import Launch, started
from claude_bottle.runtime.docker_engine import DockerEngine
from claude_bottle.runtime.names import POOL_LABEL, RUN_LABEL, claim_container
from claude_bottle.runtime.pool import POOL_KEPT, claim_internal, trim_pool
from claude_bottle.runtime.run import Run
from claude_bottle.verify.standins import in_bottle as inside
from tests.bottle.conftest import Upstream, leftovers, write_agent

pytestmark = pytest.mark.docker


def pooled(client: docker.DockerClient) -> dict[str, Network]:
    return {n.id: n for n in client.networks.list(filters={"label": POOL_LABEL})}


def on_network(client: docker.DockerClient, network: Network) -> list[str]:
    """Containers on ``network`` in any state, created ones included (which only a filter by name finds)."""
    return [c.name for c in client.containers.list(all=True, filters={"network": network.name})]


@contextlib.contextmanager
def run_of(name: str, workspace: Path, token: str, upstream: Upstream) -> Iterator[Run]:
    write_agent(name, "")
    launch = Launch(load_agent(name, workspace), workspace, Credential.parse(token, "t"), parse_upstream(upstream.url),
                    (upstream.network,))
    with started(launch, lambda line: None) as run:
        run.start_bottle(["sleep", "600"])
        yield run


def release_claims(client: docker.DockerClient, runs: list[dict[str, str]]) -> None:
    """Remove the claims these runs (their labels) made, as the end of a run does."""
    for labels in runs:
        for claim in client.containers.list(all=True, filters={"label": f"{RUN_LABEL}={labels[RUN_LABEL]}"}):
            claim.remove(force=True)


def bottle_ip(run: Run) -> str:
    assert run.internal is not None
    return run.engine.address(run.names.bottle, run.internal.name)


def test_claims_made_at_once_never_share_a_network(
    client: docker.DockerClient, built_images: tuple[str, str]
) -> None:
    """Eight runs claim at the same moment, with networks free in the pool: each gets its own."""
    _, gate_image = built_images
    runs = [{RUN_LABEL: f"pool-test-{secrets.token_hex(4)}"} for _ in range(8)]
    try:
        with ThreadPoolExecutor(len(runs)) as pool:
            networks = list(pool.map(lambda labels: claim_internal(DockerEngine(client), gate_image, labels), runs))
        assert len({n.id for n in networks}) == len(runs)
        for network in networks:
            attrs = client.networks.get(network.id).attrs
            assert attrs["Internal"] is True
            assert attrs["Options"]["com.docker.network.bridge.inhibit_ipv4"] == "true"
    finally:
        release_claims(client, runs)
        trim_pool(DockerEngine(client), gate_image)


def test_a_network_anything_is_on_goes_to_no_other_run(
    client: docker.DockerClient, upstream: Upstream, token: str, workspace: Path, built_images: tuple[str, str],
) -> None:
    """The attack: a run still on its network after its claim is gone (removed by hand, or never made by an
    older claude-bottle), and a container someone connected to a free kept network. A run started then must
    get another network, from which the first run's gate and bottle are out of reach."""
    _, gate_image = built_images
    trim_pool(DockerEngine(client), gate_image)  # what earlier runs left: at most the kept number free
    with run_of("left", workspace, token, upstream) as left:
        assert left.internal is not None
        client.containers.get(claim_container(left.internal.name)).remove(force=True)
        with run_of("right", workspace, token, upstream) as right:
            assert right.internal is not None and right.internal.id != left.internal.id
            for address in (left.gate_ip, bottle_ip(left)):
                code, _ = inside(right, f"curl --noproxy '*' -sS -m 5 http://{address}:8080/")
                assert code != 0, f"right reached {address} of the run on the network it was refused"
    assert leftovers(client, "left") == [] and leftovers(client, "right") == []

    free = pooled(client)  # theirs, or as many others that were free: the number kept is the same
    assert len(free) == POOL_KEPT and all(on_network(client, n) == [] for n in free.values())
    strangers = [client.containers.create(gate_image, network=n.name, name=f"stranger-{secrets.token_hex(3)}")
                 for n in free.values()]
    try:
        with run_of("later", workspace, token, upstream) as later:
            assert later.internal is not None and later.internal.id not in free, "given a network with a stranger"
    finally:
        for stranger in strangers:
            stranger.remove(force=True)
    free = pooled(client)
    with run_of("later", workspace, token, upstream) as later:
        assert later.internal is not None and later.internal.id in free, "a new network made while one was free"
        assert sorted(on_network(client, later.internal)) == sorted([later.names.gate, later.names.bottle])
    assert leftovers(client, "later") == []


def test_free_networks_beyond_the_kept_number_are_removed_but_never_a_claimed_one(
    client: docker.DockerClient, built_images: tuple[str, str]
) -> None:
    _, gate_image = built_images
    runs = [{RUN_LABEL: f"pool-test-{secrets.token_hex(4)}"} for _ in range(POOL_KEPT + 3)]
    try:
        networks = [claim_internal(DockerEngine(client), gate_image, labels) for labels in runs]
        held, released = networks[0], networks[1:]
        release_claims(client, runs[1:])
        trim_pool(DockerEngine(client), gate_image)
        left = pooled(client)
        assert held.id in left, "a claimed network was removed"
        assert len([n for n in released if n.id in left]) <= POOL_KEPT
        assert len([n for n in left.values() if not on_network(client, n) and n.id != held.id]) <= POOL_KEPT
    finally:
        release_claims(client, runs)
        trim_pool(DockerEngine(client), gate_image)


def test_stop_all_removes_the_kept_networks_with_every_bottle(
    client: docker.DockerClient, upstream: Upstream, token: str, workspace: Path,
) -> None:
    with run_of("ended", workspace, token, upstream) as ended:
        assert ended.internal is not None
    with run_of("running", workspace, token, upstream) as running:
        assert ended.internal.id in pooled(client)
        stopped = subprocess.run([sys.executable, "-P", "-m", "claude_bottle", "stop", "--all"], capture_output=True,
                                 text=True, timeout=120)
        assert stopped.returncode == 0 and running.id in stopped.stdout, stopped.stderr
        assert pooled(client) == {}, "kept networks outlived stop --all"
    assert leftovers(client, "running") == []
