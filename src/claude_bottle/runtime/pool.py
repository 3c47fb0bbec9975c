"""The networks of runs: the egress network every gate shares, and the internal networks kept between runs
on Docker, each held by one run at a time through a claim."""

from __future__ import annotations

import secrets

from claude_bottle.errors import DockerError
from claude_bottle.runtime.interrupts import uninterrupted
from claude_bottle.runtime.names import (
    EGRESS_LABEL,
    EGRESS_NETWORK,
    LABEL,
    POOL_LABEL,
    RunNames,
    claim_container,
    network_hex,
    new_internal_network,
)
from claude_bottle.runtime.seam import ContainerInfo, Engine, NameTaken, NetworkInfo, NetworkSpec

POOL_KEPT = 2  # internal networks no run uses that are kept for the next runs
# The host-side name of every internal network's bridge: this prefix and the network's (Podman: the run's)
# hex, 15 characters (the kernel's limit). A firewall rule on the prefix covers every bottle's bridge
# (docs/engines.md, "Podman").
BRIDGE_PREFIX = "bottle-"


def egress_network(engine: Engine) -> NetworkInfo:
    """The network through which every gate reaches the world: one for all runs, made on first use and kept.
    Sharing it opens no path: bottles never join it, a gate listens on its internal address only, and the
    address guard refuses the others' (private) addresses like any. Two runs that made it at once are
    told apart by age, the older one used by all."""
    try:
        found = engine.networks(EGRESS_LABEL)
        if found:
            return min(found, key=lambda network: (network.created, network.id))
        with uninterrupted():
            return engine.create_network(NetworkSpec(EGRESS_NETWORK, {LABEL: "1", EGRESS_LABEL: "1"}))
    except DockerError as exc:
        raise DockerError(f"cannot create the egress network {EGRESS_NETWORK}: {exc}") from None


def claim_internal(engine: Engine, image: str, labels: dict[str, str]) -> NetworkInfo:
    """An internal network for one run, on Docker: one kept from an earlier run that no container is on, or a
    new one. Making one and removing it cost the engine about a fifth of a second of every run.

    A run holds its network by a claim: a container named after the network, never started, with the run's
    labels (so removing the run removes it). The engine lets one container have a name, so of two runs
    claiming at once one gets it; and a network is taken only once, after the claim, no container is found on
    it, in any state: a run that ended without its claim removed, or a container someone else connected,
    keeps it out of use. Two runs never share one, which would put one's bottle in the other's reach."""
    for network in engine.networks(POOL_LABEL):
        claim = _claim(engine, network.name, image, labels)
        if claim is None:
            continue
        if not on_network(engine, network):
            return network
        engine.remove_container(claim.name)
    name = new_internal_network()
    if _claim(engine, name, image, labels) is None:  # a new name: claimed before anyone can see the network
        raise DockerError(f"cannot claim the new internal network {name}: a container {claim_container(name)} exists")
    try:
        with uninterrupted():
            return engine.create_network(NetworkSpec(name, {LABEL: "1", POOL_LABEL: "1"}, internal=True, isolated=True,
                                                     bridge=BRIDGE_PREFIX + network_hex(name)))
    except DockerError as exc:
        raise DockerError(f"cannot create the internal network: {exc}") from None


def on_network(engine: Engine, network: NetworkInfo) -> list[ContainerInfo]:
    """The containers on ``network``, in any state (a container created but never started included)."""
    return engine.containers(network=network)


def _claim(engine: Engine, network: str, image: str, labels: dict[str, str]) -> ContainerInfo | None:
    """The claim on ``network`` (``claim_internal``); None when another run holds it."""
    try:
        with uninterrupted():
            return engine.create_placeholder(image, claim_container(network), labels)
    except NameTaken:  # another run's claim
        return None
    except DockerError as exc:
        raise DockerError(f"cannot claim the internal network {network}: {exc}") from None


def trim_pool(engine: Engine, image: str, kept: int = POOL_KEPT) -> None:
    """Remove the kept internal networks beyond ``kept`` that no run uses: each claimed first (with ``image``,
    any image present), so none is removed under a run that has just taken it."""
    pooled = engine.networks(POOL_LABEL)
    if len(pooled) <= kept:
        return
    free = 0
    for network in pooled:
        # a run of its own, so a claim left by a trim cut short is listed, and removed by `stop --all`
        claim = _claim(engine, network.name, image, RunNames(f"trim-{secrets.token_hex(4)}").labels)
        if claim is None:
            continue
        try:
            if on_network(engine, network):
                continue
            free += 1
            if free > kept:
                engine.remove_network(network.name)
        finally:
            engine.remove_container(claim.name)
