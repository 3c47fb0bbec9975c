"""The runtime's removal, listing and network pool on the in-memory engine: what is removed and in which order,
the audit kept first, what `ls` lists (orphans included), and claims that keep two runs off one network."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from claude_bottle import records
from claude_bottle.commands import allow
from claude_bottle.errors import BottleError, DockerError
from claude_bottle.runtime.files import bottle_files
from claude_bottle.runtime.listing import bottle_of, gates_of, running_run, runs
from claude_bottle.runtime.names import EGRESS_NETWORK, POOL_LABEL, RunNames, claim_container
from claude_bottle.runtime.pool import POOL_KEPT, claim_internal, egress_network, trim_pool
from claude_bottle.runtime.removal import remove_run
from claude_bottle.runtime.seam import ContainerInfo, NetworkSpec
from tests.fake_engine import FakeEngine

AUDIT = json.dumps({"decision": "allow", "reason": "in the allowlist", "target": "pypi.org:443"}).encode() + b"\n"


@pytest.fixture(autouse=True)
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    return tmp_path / "state"


def started_run(engine: FakeEngine, agent: str = "dev", workspace: str = "/src/app",
                bottle: str = "running") -> RunNames:
    """A run as a start leaves it: its claimed network with the gate and the bottle on it."""
    run = RunNames.new(agent, workspace)
    network = claim_internal(engine, "sha256:gate", run.labels)
    engine.add_container(run.gate, run.labels, output=AUDIT)
    engine.connect(network.name, run.gate, alias="gate")
    if bottle:
        engine.add_container(run.bottle, run.labels, status=bottle)
        engine.connect(network.name, run.bottle)
    return run


def test_removal_keeps_the_audit_then_removes_the_bottle_before_the_gate_and_frees_the_network() -> None:
    engine = FakeEngine()
    run = started_run(engine)
    bottle_files(run.id).mkdir(parents=True)
    engine.events.clear()
    remove_run(engine, run.id)
    assert engine.containers() == [] and len(engine.networks(POOL_LABEL)) == 1, "the network stays for later runs"
    order = [event for event in engine.events if event[0] in ("stop", "remove")]
    assert order.index(("remove", run.bottle)) < order.index(("stop", run.gate)) < order.index(("remove", run.gate))
    record = records.find(run.id)
    assert (record.agent, record.workspace, record.started) == ("dev", "/src/app", "2026-11-25T10:00:00.123Z")
    assert list(records.audit_lines(record)) == [AUDIT.decode().strip()]
    assert not bottle_files(run.id).exists()


def test_removal_is_safe_at_any_step_and_again() -> None:
    engine = FakeEngine()
    run = started_run(engine, bottle="")  # cut short before the bottle
    remove_run(engine, run.id)
    remove_run(engine, run.id)
    assert engine.containers() == []
    remove_run(engine, RunNames.new("dev").id)  # nothing of it was made


def test_a_network_of_the_run_goes_even_where_the_engine_still_counts_a_removed_container_on_it() -> None:
    engine = FakeEngine()
    run = started_run(engine)
    outside = engine.create_network(NetworkSpec(f"{run.gate}-outside", run.labels, internal=True))
    engine.connect(outside.name, run.gate)
    engine.stale[outside.name] = {run.gate}  # Docker 20.10 now and then, once the gate is removed
    remove_run(engine, run.id)
    assert engine.network(outside.name) is None and engine.containers() == []


def test_a_run_whose_audit_cannot_be_kept_keeps_its_gate(state: Path) -> None:
    engine = FakeEngine()
    run = started_run(engine)
    state.parent.mkdir(parents=True, exist_ok=True)
    state.write_text("not a folder")
    with pytest.raises(BottleError, match=f"cannot keep the audit of run {run.id}"):
        remove_run(engine, run.id)
    assert engine.container(run.gate) is not None, "the gate, and its audit, stay"


def test_runs_lists_every_run_with_a_container_orphans_included() -> None:
    engine = FakeEngine()
    kept = started_run(engine, "dev", "/src/app", bottle="exited")
    cut_short = started_run(engine, "ops", "/src/ops", bottle="")
    orphan = RunNames("dev-0badc0de", "dev")  # an older run without the workspace label
    engine.add_container(orphan.bottle, orphan.labels, status="exited", mounts={"/workspace": "/src/old"})
    listed = {r["run"]: r for r in runs(engine)}
    assert listed[kept.id] == {"agent": "dev", "run": kept.id, "status": "exited", "workspace": "/src/app"}
    assert listed[cut_short.id]["status"] == "running", "the gate's status where there is no bottle"
    assert listed[orphan.id]["workspace"] == "/src/old", "the bottle's workspace mount names it"
    assert not any(claim_container("") in r for r in listed), "claims carry no label of a run of their own"


def test_a_runs_containers_are_found_by_workspace_then_agent() -> None:
    engine = FakeEngine()
    here = started_run(engine, "dev", "/src/app")
    other = started_run(engine, "ops", "/src/ops")
    assert running_run(engine, None, Path("/src/app")) == here.id
    assert bottle_of(engine, "ops", Path("/src/app")).name == other.bottle
    assert [g.name for g in gates_of(engine, None, Path("/src/ops"))] == [other.gate]
    with pytest.raises(DockerError, match="several bottles are running"):
        running_run(engine, None, None)
    remove_run(engine, here.id)
    remove_run(engine, other.id)
    with pytest.raises(DockerError, match="no running bottle"):
        gates_of(engine, None, Path("/src/app"))


def test_a_deny_reaches_every_bottle_of_the_agent_on_the_workspace(monkeypatch: pytest.MonkeyPatch) -> None:
    """Parallel runs of one agent on one workspace: a destination refused is refused in each, not in one."""
    engine = FakeEngine()
    both = [started_run(engine, "dev", "/src/app") for _ in range(2)]
    elsewhere = started_run(engine, "dev", "/src/other")
    asked: list[str] = []

    def control_gate(engine: FakeEngine, gate: ContainerInfo, op: str, entry: str = "") -> dict[str, Any]:
        asked.append(gate.name)
        return {"ok": True, "message": f"denied {entry}"}

    monkeypatch.setattr("claude_bottle.runtime.engines.open_engine", lambda: engine)
    monkeypatch.setattr("claude_bottle.runtime.gate.control_gate", control_gate)
    allow.deny("dev", "evil.example", "/src/app", save=False, yes=True)
    assert sorted(asked) == sorted(run.gate for run in both)
    asked.clear()
    allow.allow(None, "pypi.org", "/src/other", save=False, yes=True)
    assert asked == [elsewhere.gate]
    with pytest.raises(DockerError, match="several bottles are running; name the AGENT"):
        allow.deny(None, "evil.example", "/src/app", save=False, yes=True)


def test_a_network_someone_is_on_goes_to_no_other_run() -> None:
    engine = FakeEngine()
    first = started_run(engine)
    network = engine.networks(POOL_LABEL)[0]
    engine.remove_container(claim_container(network.name))  # its claim gone, its gate and bottle still on it
    second = RunNames.new("dev")
    assert claim_internal(engine, "sha256:gate", second.labels).name != network.name
    assert engine.container(claim_container(network.name)) is None, "the claim on the busy network is let go"
    remove_run(engine, first.id)


def test_runs_at_once_get_networks_of_their_own_and_the_free_ones_are_trimmed_but_never_a_claimed_one() -> None:
    engine = FakeEngine()
    held, *ended = (started_run(engine) for _ in range(POOL_KEPT + 3))
    assert len(engine.networks(POOL_LABEL)) == POOL_KEPT + 3
    for run in ended:
        remove_run(engine, run.id)  # each removal trims the pool to the kept number of free networks
    assert len(engine.networks(POOL_LABEL)) == POOL_KEPT + 1, "the kept free ones, and the held one"
    trim_pool(engine, "sha256:gate", kept=0)
    (left,) = engine.networks(POOL_LABEL)
    assert engine.container(claim_container(left.name)) is not None, "the held one stays, with its claim"
    assert [c.name for c in engine.containers()] == [held.bottle, held.gate, claim_container(left.name)], \
        "trimming leaves no claim of its own"


def test_the_egress_network_is_made_once_and_the_oldest_is_used() -> None:
    engine = FakeEngine()
    first = egress_network(engine)
    assert first.name == EGRESS_NETWORK and egress_network(engine) == first
    engine.fail.add("networks")
    with pytest.raises(DockerError, match=f"cannot create the egress network {EGRESS_NETWORK}"):
        egress_network(engine)
