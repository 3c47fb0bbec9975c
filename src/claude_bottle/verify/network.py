"""``verify``'s attacks on the network: the probe (``claude_bottle.verify.probe``) in the bottle's network
namespace, a name lookup in the bottle itself and the listener on the host; what the probe got back is judged
here against what the stub upstream received."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import socket
import threading
import time
from dataclasses import dataclass

from claude_bottle.gate.decode import reflected_forms
from claude_bottle.gate.settings import Limits
from claude_bottle.runtime.run import Run
from claude_bottle.verify.attack import Attack, Outcome, Proof, Verdict
from claude_bottle.verify.standins import (
    FRONT,
    PRIVATE_NAME,
    STUB_PORT,
    Verification,
    in_bottle,
    run_probe,
    stub_requests,
)

PUBLIC_IPV4 = ("1.1.1.1", "8.8.8.8")
PUBLIC_IPV6 = ("2606:4700:4700::1111",)
# Names the bottle looks up without the gate: the first one this host resolves, so that an address in the bottle
# proves a resolver there forwards what it does not know (a way out for any name the bottle makes up).
LOOKUP_NAMES = ("api.anthropic.com", "registry.npmjs.org", "pypi.org", "deb.debian.org")
LOOKUP_SECONDS = 5.0
# Resolvers a bottle may try without being told of them: Docker's embedded one, and slirp4netns's (rootless
# Podman's way out of its network namespace), whose address for the host, SLIRP_HOST, is the host's loopback
# when allow_host_loopback is set.
WELL_KNOWN_RESOLVERS = ("127.0.0.11", "10.0.2.3")
SLIRP_HOST = "10.0.2.2"
NO_ADDRESS = "no address"


def resolvable_name(names: tuple[str, ...] = LOOKUP_NAMES, seconds: float = LOOKUP_SECONDS) -> tuple[str, bool]:
    """The first of ``names`` that this host resolves (all looked up at once, for at most ``seconds``: a lookup
    still hanging then is left to finish on its own) and True; else the first name and False."""
    resolved: set[str] = set()

    def look(name: str) -> None:
        with contextlib.suppress(OSError):
            socket.getaddrinfo(name, 443, type=socket.SOCK_STREAM)
            resolved.add(name)

    lookups = [threading.Thread(target=look, args=(name,), daemon=True) for name in names]
    deadline = time.monotonic() + seconds
    for lookup in lookups:
        lookup.start()
    for lookup in lookups:
        lookup.join(max(0.0, deadline - time.monotonic()))
    return next(((name, True) for name in names if name in resolved), (names[0], False))


def bottle_nameservers(run: Run) -> list[str]:
    """The nameservers in the bottle's /etc/resolv.conf."""
    _, output = in_bottle(run, "cat /etc/resolv.conf")
    return [fields[1] for fields in (line.split() for line in output.splitlines())
            if len(fields) > 1 and fields[0] == "nameserver"]


@dataclass(frozen=True)
class Lookup(Attack[Verification, list[str]]):
    """``looked_up`` resolved the way any program in the bottle would (its resolver, through the C library):
    no address may come back."""

    looked_up: str

    def run(self, target: Verification) -> list[str]:
        _, output = in_bottle(target.run, f"getent ahostsv4 {self.looked_up}")
        return sorted({line.split()[0] for line in output.splitlines() if line.strip()})

    def judge(self, target: Verification, result: list[str]) -> Verdict:
        return f"resolved to {', '.join(result[:3])}" if result else NO_ADDRESS, not result


def lookup(name: str) -> Lookup:
    return Lookup("direct egress", f"a lookup of {name} through the bottle's resolver", NO_ADDRESS, name,
                  proof=Proof.NAME_LOOKUP)


@dataclass(frozen=True)
class HostListener(Attack[Verification, list[str]]):
    """Whatever the bottle sent to the host: nothing may have arrived at the listener there."""

    def run(self, target: Verification) -> list[str]:
        return target.host.arrivals()

    def judge(self, target: Verification, result: list[str]) -> Verdict:
        return ", ".join(result[:3]) if result else "nothing arrived", not result


def host_listener(target: Verification) -> HostListener:
    return HostListener("direct egress", f"anything at a listener on the Docker host (port {target.host.port})",
                        "nothing arrives")


def network_attacks(target: Verification) -> list[Outcome]:
    """The probe in a container sharing the bottle's network namespace, as the agent user, unprivileged; and a
    name lookup in the bottle itself."""
    run = target.run
    name, resolves_here = resolvable_name()
    targets = {
        "gate": run.gate_ip, "api_port": 8080, "proxy_port": 3128,
        "canary_ip": target.canary.address, "canary_port": STUB_PORT, "private_name": PRIVATE_NAME,
        "api_host": f"stub:{STUB_PORT}", "unlisted_host": "exfiltrate.example", "attacker_key": target.attacker_key,
        "host_port": target.host.port, "host_addresses": list(target.host_addresses),
        "public_ipv4": list(PUBLIC_IPV4), "public_ipv6": list(PUBLIC_IPV6),
        "front_host": FRONT, "front_port": STUB_PORT,
        "header_timeout": Limits().header_timeout, "max_connections": Limits().max_connections,
        "dns_name": name, "resolvers": [*bottle_nameservers(run), *WELL_KNOWN_RESOLVERS],
        "host_loopback": [SLIRP_HOST],
    }
    output = run_probe(target, targets)
    outcomes = [Outcome.from_json(line) for line in output.splitlines() if line.startswith("{")]
    outcomes.append(lookup(name).outcome(target))
    if not resolves_here:  # nothing resolved, but nothing would have: say so
        outcomes = [dataclasses.replace(o, actual=f"{o.actual} ({name} does not resolve on this host either)")
                    if o.blocked and o.proof is Proof.NAME_LOOKUP else o for o in outcomes]
    return [judged_by_evidence(target, o) for o in outcomes] + [host_listener(target).outcome(target)]


def judged_by_evidence(target: Verification, outcome: Outcome) -> Outcome:
    """What came back from the gate is the proof: the credential must never be in it (in any form a server
    may send it back in, gate/decode.py's ``reflected_forms``: as is, URL-encoded, base64, hex), the attacker's key
    must never reach the upstream, which must get the real credential instead, and a request asking the
    provider to reach out for the bottle must never reach the upstream. Which of these applies is the
    outcome's ``proof``."""
    secret = target.credential.secret
    if any(form.decode("ascii") in outcome.evidence for form in reflected_forms(secret.encode())):
        return dataclasses.replace(outcome, actual="the credential came back", blocked=False)
    if outcome.proof is Proof.ANSWER:
        return dataclasses.replace(outcome, actual=f"not in the answer: {outcome.actual}", blocked=True)
    if outcome.proof is Proof.UPSTREAM_NEVER_GOT:
        forbidden = outcome.forbidden
        got = [r for r in stub_requests(target) if forbidden in r.get("fields", []) + r.get("tool_types", [])]
        if got:
            return dataclasses.replace(outcome, actual=f"the upstream got {forbidden}", blocked=False)
        return dataclasses.replace(outcome, blocked=True, actual=f"the upstream never got it: {outcome.actual}")
    if outcome.proof is Proof.UPSTREAM_GOT_REAL_CREDENTIAL:
        seen = stub_requests(target)
        attacker = [r for r in seen if target.attacker_key in json.dumps(r["headers"])]
        injected = [r for r in seen if f"Bearer {secret}" in json.dumps(r["headers"])]
        if attacker:
            return dataclasses.replace(outcome, actual="the upstream got the attacker's key", blocked=False)
        return dataclasses.replace(outcome, blocked=bool(injected),
                                   actual="upstream got the real credential only" if injected else
                                   f"the upstream got no credential ({outcome.actual})")
    return outcome

