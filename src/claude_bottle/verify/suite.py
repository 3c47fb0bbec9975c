"""``claude-bottle verify``: start an agent's bottle against the stand-ins, attack it from inside, and judge
what it left behind for later bottles and for the host. Nothing here needs an Anthropic account or spends a
token."""

from __future__ import annotations

import tempfile
from pathlib import Path

from claude_bottle.agent.schema import AgentConfig
from claude_bottle.gate.upstream_proxy import UpstreamProxy
from claude_bottle.launch import Progress
from claude_bottle.persistence import Plants
from claude_bottle.verify.attack import Outcome
from claude_bottle.verify.checks import ENGINE_VIEW, bottle_attacks
from claude_bottle.verify.inspected import inspection_attacks
from claude_bottle.verify.mcp_attacks import mcp_attacks
from claude_bottle.verify.network import network_attacks
from claude_bottle.verify.sentinels import sentinel_attacks
from claude_bottle.verify.standins import Verification, bottle_on, in_bottle, scratch_workspace, stand_ins


def attack(target: Verification) -> list[Outcome]:
    """Every attack on one bottle; those that carry the credential into it (in a pipe) after the file search."""
    return [*network_attacks(target), *bottle_attacks(target), *sentinel_attacks(target), *mcp_attacks(target),
            *inspection_attacks(target), ENGINE_VIEW.outcome(target)]


def verify(agent: AgentConfig, progress: Progress, proxy: UpstreamProxy | None = None) -> list[Outcome]:
    """Every attack on one bottle of the agent, then the persistence group: what that bottle planted, judged
    on the host once it is gone, and in two later bottles (another project's, and the same project's). The
    images are built through ``proxy`` (the upstream proxy a run would use)."""
    with tempfile.TemporaryDirectory(prefix="claude-bottle-verify-") as scratch, \
            stand_ins(agent, progress, proxy=proxy) as env:
        plants = Plants(Path(scratch), scratch_workspace(scratch))
        try:
            with bottle_on(env, plants.workspace) as target:
                progress(f"attacking the bottle of agent {agent.name}")
                outcomes = attack(target)
                progress("planting what a hijacked agent would leave for later")
                in_bottle(target.run, plants.first_script())
                first = target.run.id
            outcomes += plants.after_first(first, env.credential.secret)
            plants.reviewed()
            progress("the next bottle of the same project")
            with bottle_on(env, plants.workspace) as again:
                output = in_bottle(again.run, plants.next_script())[1]
            outcomes += plants.after_next(output)
            progress("a bottle of the same agent on another project")
            with bottle_on(env, plants.other) as other:
                output = in_bottle(other.run, plants.other_script())[1]
            outcomes += plants.after_other(output)
        finally:
            plants.forget()
        return outcomes
