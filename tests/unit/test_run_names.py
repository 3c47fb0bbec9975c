"""A run's names and labels, made and read back in one place."""

from __future__ import annotations

from pathlib import Path

from claude_bottle.paths import workspace_key
from claude_bottle.runtime.names import (
    AGENT_LABEL,
    LABEL,
    RUN_LABEL,
    WORKSPACE_LABEL,
    RunNames,
    claim_container,
    is_claim,
    network_hex,
    new_internal_network,
    role_of,
    run_of,
    state_volume,
)


def test_a_runs_containers_are_named_after_it_and_read_back() -> None:
    run = RunNames.new("dev", Path("/src/app"))
    assert run.id.startswith("dev-") and len(run.hex) == 8
    assert (run.gate, run.bottle) == (f"claude-bottle-{run.id}-gate", f"claude-bottle-{run.id}-bottle")
    assert [(run_of(name), role_of(name)) for name in (run.gate, run.bottle, run.container("probe"))] == \
        [(run.id, "gate"), (run.id, "bottle"), (run.id, "probe")]


def test_labels_carry_the_run_and_parse_back() -> None:
    run = RunNames.new("dev", Path("/src/app"))
    assert run.labels == {LABEL: "1", RUN_LABEL: run.id, AGENT_LABEL: "dev", WORKSPACE_LABEL: "/src/app"}
    assert RunNames.from_labels(run.labels) == run
    assert run.selector == f"{RUN_LABEL}={run.id}"
    assert RunNames("verify-1234abcd", "dev").labels == {LABEL: "1", RUN_LABEL: "verify-1234abcd", AGENT_LABEL: "dev"}
    assert RunNames.from_labels({}) == RunNames("")


def test_the_state_volume_outlives_the_run_and_carries_no_run_label() -> None:
    run = RunNames.new("dev", Path("/src/app"))
    assert RUN_LABEL not in run.volume_labels and run.volume_labels[AGENT_LABEL] == "dev"
    assert state_volume("dev", Path("/src/app")) == f"claude-bottle-dev-{workspace_key(Path('/src/app'))}-state"


def test_a_pooled_network_is_held_by_a_claim_named_after_it() -> None:
    network = new_internal_network()
    assert network.startswith("claude-bottle-internal-") and len(network_hex(network)) == 8
    assert is_claim(claim_container(network)) and not is_claim(network)
