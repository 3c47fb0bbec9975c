"""`verify` on an agent with a credential route: the route's value is searched for wherever the credential is,
and its sentinel is sent out through the API route; both must be blocked, and both are reported as leaks
when the bottle is given the value or the gate is not told of the route."""

from __future__ import annotations

import docker
import pytest

from claude_bottle.agent.credential_config import CredentialConfig
from claude_bottle.agent.schema import AgentConfig
from claude_bottle.gate.options import GateOptions
from claude_bottle.gate.routes import Scheme
from claude_bottle.runtime import gate as runtime_gate
from claude_bottle.runtime import run as run_module
from claude_bottle.runtime.run import Run
from claude_bottle.runtime.spec import RunSpec
from claude_bottle.verify.attack import Outcome
from claude_bottle.verify.sentinels import SENTINELS
from claude_bottle.verify.standins import verification
from claude_bottle.verify.suite import attack
from tests.bottle.conftest import leftovers

pytestmark = pytest.mark.docker
ROUTE = CredentialConfig("tracker", (("api.tracker.example", 443),), Scheme.BEARER, bottle_env=("TRACKER_TOKEN",),
                         origin="test")
VALUE_CHECKS = {"environment variables", "every readable /proc/*/environ and cmdline",
                "docker inspect of the bottle and the gate (from the host)"}


def quiet(line: str) -> None:
    pass


def leaked(outcomes: list[Outcome]) -> set[str]:
    return {o.attack for o in outcomes if not o.blocked}


def test_a_credential_route_passes_verify(client: docker.DockerClient, built_images: tuple[str, str]) -> None:
    with verification(AgentConfig(name="routed", credentials=(ROUTE,)), quiet) as target:
        outcomes = attack(target)
    assert leaked(outcomes) == set()
    assert {o.attack for o in outcomes if o.group == SENTINELS} == {
        f"route {name}'s sentinel in a {where}" for name in ("tracker", "verify-tracker")
        for where in ("Messages body", "request header")}, "the agent's route, and that of verify's MCP server"
    assert leftovers(client, "routed") == []


def test_a_route_value_in_the_bottle_or_a_gate_without_the_route_fails_verify(
        client: docker.DockerClient, built_images: tuple[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    environment = Run.bottle_environment

    def handing_over_the_value(self: Run) -> dict[str, str]:
        return {**environment(self), "LEAKED": self.spec.routes[0].secret}

    def without_routes(spec: RunSpec, listen: str = runtime_gate.GATE_ALIAS, heartbeat: float = 0.0) -> GateOptions:
        return options(RunSpec(**{**spec.__dict__, "routes": ()}), listen, heartbeat)

    options = runtime_gate.gate_options
    monkeypatch.setattr(Run, "bottle_environment", handing_over_the_value)
    monkeypatch.setattr(run_module, "gate_options", without_routes)
    with verification(AgentConfig(name="leaky-route", credentials=(ROUTE,)), quiet) as target:
        outcomes = attack(target)
    sentinel_attacks = {o.attack for o in outcomes if o.group == SENTINELS}
    assert leaked(outcomes) >= VALUE_CHECKS | sentinel_attacks and len(sentinel_attacks) == 4
    assert "an allowed call (get_issue) (the control)" in leaked(outcomes), "the MCP server got no route's value"
    assert leftovers(client, "leaky-route") == []
