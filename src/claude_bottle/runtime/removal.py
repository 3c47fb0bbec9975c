"""A run's removal, whatever step it reached: its containers, its audit kept on the host first, its claim on
its internal network (or the network), and the files its bottle was given."""

from __future__ import annotations

import contextlib
import shutil
from concurrent.futures import ThreadPoolExecutor

from claude_bottle import records
from claude_bottle.errors import BottleError, DockerError
from claude_bottle.runtime.files import bottle_files
from claude_bottle.runtime.gate import GATE_STOP_SECONDS
from claude_bottle.runtime.names import (
    GATE,
    RunNames,
    is_claim,
    role_of,
)
from claude_bottle.runtime.pool import trim_pool
from claude_bottle.runtime.seam import ContainerInfo, Engine


def keep_audit(engine: Engine, gate: ContainerInfo) -> None:
    """Stop the gate, then copy its audit to the host (``claude_bottle.records``).

    The copy is taken here, at removal, because removal is the one step every ending of a run goes through:
    ``run -p``, the end or Ctrl-C of ``start``, ``stop`` from another terminal, ``start --keep`` then ``stop``,
    ``verify``. The gate writes a connection's line when it closes, so it is stopped first (SIGTERM: it
    finishes what is in flight, the bottle being gone). Its log is bounded by the engine (LOG_CONFIG) and the
    copy by the records' caps. A run whose CLI was killed outright is copied when its reaper removes it
    (runtime/reaper.py), or else `stop`."""
    with contextlib.suppress(DockerError):
        engine.stop(gate.name, timeout=GATE_STOP_SECONDS)
    run = RunNames.from_labels(gate.labels)
    started = gate.created[:23] + "Z"  # to the millisecond, like the end
    try:
        # followed to its end, which has come: the gate is stopped
        records.save(run.id, run.agent, run.workspace, started,
                     engine.logs(gate.name, stdout=False, stderr=True, follow=True))
    except OSError as exc:
        raise BottleError(f"cannot keep the audit of run {run.id or None} in {records.runs_dir()}: "
                          f"{exc.strerror or exc}; its gate stays, so nothing is lost: fix that, then run "
                          f"`claude-bottle stop {run.agent or None}`") from None


def remove_run(engine: Engine, run_id: str) -> None:
    """Remove a run: its bottle (and any other container), then its gate once its audit is kept on the host,
    then its claim on its internal network (which stays for a later run) or the network itself, and the
    files its bottle was given; each kind at once. A bottle that no longer runs has closed its connections to
    the gate, so then its removal and the gate's stop go together. Safe to call at any point and more than
    once."""
    selector = RunNames(run_id).selector

    def remove(container: ContainerInfo) -> None:
        engine.remove_container(container.name)

    def audit(gate: ContainerInfo) -> None:
        keep_audit(engine, gate)

    containers = engine.containers(label=selector)
    gates = [c for c in containers if role_of(c.name) == GATE]
    claims = [c for c in containers if is_claim(c.name)]
    others = [c for c in containers if c not in gates and c not in claims]
    with ThreadPoolExecutor(4) as pool:
        if any(c.active for c in others):
            list(pool.map(remove, others))  # its connections stay open until it is gone
            others = []
        removed = [pool.submit(remove, c) for c in others]
        list(pool.map(audit, gates))
        for future in removed:
            future.result()
        list(pool.map(remove, gates))
        list(pool.map(remove, claims))  # the network is free once nothing of the run is on it
        names = [c.name for c in containers]
        list(pool.map(lambda network: engine.remove_network(network, names),
                      [n.name for n in engine.networks(selector)]))
    if claims:
        with contextlib.suppress(DockerError):  # housekeeping: a later run's end trims again
            trim_pool(engine, claims[0].image)
    shutil.rmtree(bottle_files(run_id), ignore_errors=True)
