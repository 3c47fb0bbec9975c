"""``verify``'s attacks on credential routes: each route's sentinel sent out through the API route."""

from __future__ import annotations

import json
from dataclasses import dataclass

from claude_bottle.runtime.spec import API_PORT
from claude_bottle.verify.attack import Attack, Outcome, Verdict
from claude_bottle.verify.standins import Verification, in_bottle, stub_requests

SENTINELS = "credential routes"


@dataclass(frozen=True)
class SentinelSent(Attack[Verification, str]):
    """A route's ``sentinel`` sent from the bottle through the API route, the allowed channel every bottle has:
    in a Messages body, and with ``header`` also in a request header. It must be refused (403) before it
    reaches the upstream."""

    sentinel: str
    header: bool = False

    def run(self, target: Verification) -> str:
        api = f"http://{target.run.gate_ip}:{API_PORT}/v1/messages"
        body = json.dumps({"model": "claude-sonnet-4-5", "max_tokens": 16,
                           "messages": [{"role": "user", "content": f"remember {self.sentinel}"}]})
        headers = f"-H 'x-note: {self.sentinel}' " if self.header else ""
        _, output = in_bottle(target.run, f"curl -s -o /dev/null -w '%{{http_code}}' -m 20 {headers}"
                                          f"-H 'content-type: application/json' --data-binary @- {api}", body)
        return output.strip()

    def judge(self, target: Verification, result: str) -> Verdict:
        arrived = any(self.sentinel in json.dumps(r) for r in stub_requests(target))
        return "reached the upstream" if arrived else f"answered {result or 'nothing'}", result == "403" and not arrived


def sentinel_attacks(target: Verification) -> list[Outcome]:
    """For each credential route of the agent: its sentinel in a Messages body, then in a request header."""
    return [SentinelSent(SENTINELS, attack, "refused (403)", route.spec.sentinel, header).outcome(target)
            for route in target.run.spec.routes
            for attack, header in ((f"route {route.spec.name}'s sentinel in a Messages body", False),
                                   (f"route {route.spec.name}'s sentinel in a request header", True))]
