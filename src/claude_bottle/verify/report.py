"""The report of ``claude-bottle verify``: a table by group, or JSON (what the table shows: never the evidence).

What an attack got back may quote an answer from the bottle's side: its control characters are shown as escapes.
"""

from __future__ import annotations

import json

from claude_bottle.agent.schema import AgentConfig
from claude_bottle.display import printable
from claude_bottle.verify.attack import Outcome


def report(outcomes: list[Outcome]) -> str:
    width = max(len(o.attack) for o in outcomes)
    expected = max(len(o.expected) for o in outcomes)
    lines = []
    for group in dict.fromkeys(o.group for o in outcomes):
        lines.append(group.upper())
        for o in (o for o in outcomes if o.group == group):
            lines.append(f"  {'blocked' if o.blocked else 'LEAK   '}  {o.attack:<{width}}  {o.expected:<{expected}}  "
                         f"{printable(o.actual)}")
    leaks = sum(not o.blocked for o in outcomes)
    lines.append(f"{len(outcomes)} attacks: " + (f"{leaks} LEAKED" if leaks else "every one blocked"))
    return "\n".join(lines)


def as_json(agent: AgentConfig, outcomes: list[Outcome]) -> str:
    return json.dumps({
        "agent": agent.name, "attacks": len(outcomes), "leaks": sum(not o.blocked for o in outcomes),
        "results": [{"group": o.group, "attack": o.attack, "expected": o.expected, "actual": o.actual,
                     "blocked": o.blocked} for o in outcomes],
    }, indent=2)
