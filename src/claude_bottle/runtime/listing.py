"""The runs present on the engine (running, kept, or left by a start cut short), and their containers."""

from __future__ import annotations

from pathlib import Path

from claude_bottle.errors import DockerError
from claude_bottle.runtime.names import (
    BOTTLE,
    GATE,
    LABEL,
    RunNames,
    role_of,
)
from claude_bottle.runtime.seam import ContainerInfo, Engine


def runs(engine: Engine) -> list[dict[str, str]]:
    """One entry per run that has a container: agent, run id, the bottle's (or gate's) status, workspace."""
    found: dict[str, dict[str, str]] = {}
    for container in engine.containers(label=LABEL):
        run = RunNames.from_labels(container.labels)
        entry = found.setdefault(run.id, {"agent": run.agent, "run": run.id, "status": container.status,
                                          "workspace": run.workspace})
        if role_of(container.name) == BOTTLE:
            entry["status"] = container.status
            if not entry["workspace"]:
                entry["workspace"] = container.mounts.get("/workspace", "")
    return sorted(found.values(), key=lambda r: (r["agent"], r["run"]))


def running_run(engine: Engine, agent: str | None, workspace: Path | None) -> str | None:
    """The run (still present: running, or kept) of ``agent`` on ``workspace``, None meaning any; None when
    there is none, a DockerError when several match and no agent was named."""
    matching = [r for r in runs(engine) if (agent is None or r["agent"] == agent)
                and (workspace is None or r["workspace"] == str(workspace))]
    if len(matching) > 1 and agent is None:
        raise DockerError("several bottles are running; name the AGENT (see `claude-bottle ls`)")
    return matching[-1]["run"] if matching else None


def _container_of(engine: Engine, agent: str | None, workspace: Path | None, role: str) -> ContainerInfo:
    """The workspace's bottle first, else any matching one (the only one, when no agent is named)."""
    run_id = (workspace and running_run(engine, agent, workspace)) or running_run(engine, agent, None)
    if run_id is None:
        raise DockerError(f"no running bottle{f' for agent {agent}' if agent else ''}; see `claude-bottle ls`")
    found = engine.container(RunNames(run_id).container(role))
    if found is None:
        raise DockerError(f"run {run_id} has no {role} container; remove it with `claude-bottle stop`")
    return found


def gates_of(engine: Engine, agent: str | None, workspace: Path | None = None) -> list[ContainerInfo]:
    """The gates of ``agent``'s runs on ``workspace``, else anywhere (None: any agent): runs of one agent at once on
    one workspace (parallel Agent SDK queries) are all changed by an ``allow`` or a ``deny``, not one of them. A
    DockerError when there is none, or several and no agent was named."""
    def matching(place: Path | None) -> list[str]:
        return [r["run"] for r in runs(engine) if (agent is None or r["agent"] == agent)
                and (place is None or r["workspace"] == str(place))]

    found = (workspace and matching(workspace)) or matching(None)
    if len(found) > 1 and agent is None:
        raise DockerError("several bottles are running; name the AGENT (see `claude-bottle ls`)")
    if not found:
        raise DockerError(f"no running bottle{f' for agent {agent}' if agent else ''}; see `claude-bottle ls`")
    gates = [engine.container(RunNames(run_id).container(GATE)) for run_id in found]
    if None in gates:
        raise DockerError(f"run {found[gates.index(None)]} has no gate container; remove it with `claude-bottle stop`")
    return [gate for gate in gates if gate is not None]


def bottle_of(engine: Engine, agent: str | None, workspace: Path | None = None) -> ContainerInfo:
    return _container_of(engine, agent, workspace, BOTTLE)
