"""``verify``'s attacks on credential routes: each route's sentinel sent out through the API route."""

from __future__ import annotations

import json

from claude_bottle.runtime.bottle import API_PORT
from claude_bottle.verify.probe import Outcome
from claude_bottle.verify.standins import Verification, in_bottle, stub_requests

SENTINELS = "credential routes"


def sentinel_attacks(target: Verification) -> list[Outcome]:
    """For each credential route of the agent: its sentinel sent out through the allowed channel every bottle
    has, the API route (in a Messages body, and as the request's credential), must be refused before it
    reaches the upstream."""
    outcomes = []
    api = f"http://{target.run.gate_ip}:{API_PORT}/v1/messages"
    for route in target.run.spec.routes:
        sentinel = route.spec.sentinel
        body = json.dumps({"model": "claude-sonnet-4-5", "max_tokens": 16,
                           "messages": [{"role": "user", "content": f"remember {sentinel}"}]})
        name = route.spec.name
        for attack, headers in ((f"route {name}'s sentinel in a Messages body", ""),
                                (f"route {name}'s sentinel in a request header", f"-H 'x-note: {sentinel}' ")):
            _, output = in_bottle(target.run, f"curl -s -o /dev/null -w '%{{http_code}}' -m 20 {headers}"
                                              f"-H 'content-type: application/json' --data-binary @- {api}", body)
            arrived = any(sentinel in json.dumps(r) for r in stub_requests(target))
            blocked = output.strip() == "403" and not arrived
            actual = "reached the upstream" if arrived else f"answered {output.strip() or 'nothing'}"
            outcomes.append(Outcome(SENTINELS, attack, "refused (403)", actual, blocked))
    return outcomes
