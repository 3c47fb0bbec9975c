"""Every name and label a run gives the engine, made and read back here only.

A run's containers are ``claude-bottle-<run>-<role>`` (``gate``, ``bottle``, ...), and everything it creates
carries its labels (``claude-bottle.run=<run>`` among them): removal and listing find a run by them. An
internal network kept between runs is ``claude-bottle-internal-<hex>``, held by a container named after it
with ``-claim``; Claude Code's state of one agent on one workspace is a volume named after both.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from pathlib import Path

from claude_bottle.paths import workspace_key

PREFIX = "claude-bottle"
LABEL = "claude-bottle"  # on everything claude-bottle creates
RUN_LABEL = "claude-bottle.run"
AGENT_LABEL = "claude-bottle.agent"
WORKSPACE_LABEL = "claude-bottle.workspace"
EGRESS_LABEL = "claude-bottle.egress"
POOL_LABEL = "claude-bottle.pool"  # an internal network kept between runs (runtime/pool.py), on Docker
EGRESS_NETWORK = "claude-bottle-egress"  # every gate's way out
INTERNAL_PREFIX = "claude-bottle-internal-"
CLAIM_SUFFIX = "-claim"
GATE = "gate"
BOTTLE = "bottle"


@dataclass(frozen=True)
class RunNames:
    """One run's id (``<agent>-<hex>``, or any other word for runs that are not an agent's: ``verify-<hex>``)
    and every name and label made from it. ``agent`` and ``workspace`` are empty where the run has none."""

    id: str
    agent: str = ""
    workspace: str = ""

    @classmethod
    def new(cls, agent: str, workspace: Path | str = "") -> RunNames:
        return cls(f"{agent}-{secrets.token_hex(4)}", agent, str(workspace))

    @classmethod
    def from_labels(cls, labels: dict[str, str]) -> RunNames:
        """The run a container's labels name; empty fields for labels missing."""
        return cls(labels.get(RUN_LABEL, ""), labels.get(AGENT_LABEL, ""), labels.get(WORKSPACE_LABEL, ""))

    @property
    def hex(self) -> str:
        """The id's last word: the run's part of its bridge's name (15 characters at most, the kernel's)."""
        return self.id.rsplit("-", 1)[-1]

    def container(self, role: str) -> str:
        return f"{PREFIX}-{self.id}-{role}"

    @property
    def gate(self) -> str:
        return self.container(GATE)

    @property
    def bottle(self) -> str:
        return self.container(BOTTLE)

    @property
    def internal(self) -> str:
        """The run's own internal network, where it makes one (Podman)."""
        return self.container("internal")

    @property
    def labels(self) -> dict[str, str]:
        """What every container and network of the run carries; the agent and workspace only when set."""
        labels = {LABEL: "1", RUN_LABEL: self.id}
        if self.agent:
            labels[AGENT_LABEL] = self.agent
        if self.workspace:
            labels[WORKSPACE_LABEL] = self.workspace
        return labels

    @property
    def volume_labels(self) -> dict[str, str]:
        """The labels of the state volume (``state_volume``), which outlives the run: no run id."""
        return {LABEL: "1", AGENT_LABEL: self.agent, WORKSPACE_LABEL: self.workspace}

    @property
    def selector(self) -> str:
        """The label filter that finds everything of the run."""
        return f"{RUN_LABEL}={self.id}"


def role_of(container: str) -> str:
    """The role a run's container name ends with (``gate``, ``bottle``, ``claim``, ...)."""
    return container.rsplit("-", 1)[-1]


def run_of(container: str) -> str:
    """The run id in a run's container name (``claude-bottle-<run>-<role>``)."""
    return container.removeprefix(f"{PREFIX}-").rsplit("-", 1)[0]


def new_internal_network() -> str:
    return f"{INTERNAL_PREFIX}{secrets.token_hex(4)}"


def network_hex(network: str) -> str:
    """A pooled internal network's own part of its bridge's name."""
    return network.rsplit("-", 1)[-1]


def claim_container(network: str) -> str:
    """The container that holds ``network`` for a run."""
    return f"{network}{CLAIM_SUFFIX}"


def is_claim(container: str) -> bool:
    return container.endswith(CLAIM_SUFFIX)


def state_volume(agent: str, workspace: Path) -> str:
    """Claude Code's ~/.claude for one agent on one workspace: sessions and history, kept across runs for
    --continue and --resume, and seen by no other project's bottle."""
    return f"{PREFIX}-{agent}-{workspace_key(workspace)}-state"


def agent_selector(agent: str) -> str:
    return f"{AGENT_LABEL}={agent}"


def image_repository(kind: str) -> str:
    """Where the images of ``kind`` (``bottle``, ``gate``) are tagged, one tag per build's inputs."""
    return f"{PREFIX}-{kind}"
