"""The egress policy in effect, as the gate's control channel answers it and as a bottle reads it
(``/etc/claude-bottle/policy.toml``, written by the host)."""

from __future__ import annotations

import json
from typing import Any

from claude_bottle.policy.decide import EgressPolicy
from claude_bottle.policy.rules import RequestPolicy


def policy_view(policy: EgressPolicy, rules: RequestPolicy, ask: bool = False) -> dict[str, Any]:
    """What the reply (and the bottle's read-only policy file) shows of the egress policy in effect: the
    allowlist, raw-TCP targets, what the user denied while it runs, learn mode, ask mode (``ask``: the gate
    holds the rest until the host answers), and the ``[[egress]]`` rules as ``--egress-rule`` / ``--no-inspect``
    flags."""
    flags = rules.args()
    return {"learn": policy.learn, "ask": ask, "allow": [str(p) for p in policy.allowlist.patterns],
            "allow_tcp": [str(p) for p in policy.raw_tcp.patterns], "deny": [str(p) for p in policy.denied.patterns],
            "rules": [f"{flag} {value}" for flag, value in zip(flags[::2], flags[1::2], strict=True)]}


def policy_toml(view: dict[str, Any]) -> str:
    """The policy file a bottle sees (read-only) at /etc/claude-bottle/policy.toml, from ``policy_view``."""
    def strings(values: list[str]) -> str:
        return "[" + ", ".join(json.dumps(v) for v in values) + "]"

    return (
        "# The egress policy in effect for this bottle, kept up to date by the host (read-only here).\n"
        "# Destinations not allowed here are refused by the user's policy, not by the network: retrying or\n"
        "# another route will not get through. The user can allow one on the host: claude-bottle allow HOST[:PORT]\n"
        "# In ask mode such a request waits instead while the user decides; a refusal then is the user's answer.\n"
        "# The Anthropic API is reached through ANTHROPIC_BASE_URL, never through the proxy.\n"
        f"learn = {'true' if view.get('learn') else 'false'}  # true: the rest passes, as would_deny\n"
        f"ask = {'true' if view.get('ask') else 'false'}  # true: the rest waits for the user's answer on the host\n"
        f"allow = {strings(view.get('allow', []))}\n"
        f"allow_tcp = {strings(view.get('allow_tcp', []))}\n"
        f"deny = {strings(view.get('deny', []))}  # denied by the user while the bottle runs\n"
        f"rules = {strings(view.get('rules', []))}  # method and path rules on inspected requests\n"
    )
