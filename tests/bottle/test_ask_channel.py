"""Ask mode's decision channel, attacked from inside a real bottle: one bottle, one held request.

While a request from the bottle is held for the host's answer, the bottle forges answers on every way it has
toward its gate (both ports, as raw lines and as HTTP, and the control socket's path); the question stays
pending, and only the host's answer, through the engine, lets the same request complete.
"""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path
from typing import Any

import docker
import pytest

from claude_bottle.agent.load import load_agent
from claude_bottle.credentials import Credential
from claude_bottle.errors import DockerError
from claude_bottle.gate.settings import parse_upstream
from claude_bottle.launch import Launch, started
from claude_bottle.runtime.gate import CONTROL_SOCKET, GATE_PYTHON
from claude_bottle.runtime.run import Run
from claude_bottle.runtime.spec import API_PORT, PROXY_PORT
from claude_bottle.verify.standins import in_bottle
from tests.bottle.conftest import Upstream, write_agent

pytestmark = pytest.mark.docker
PORT = 8000  # the stand-ins' port


def gate_control(run: Run, *args: str) -> dict[str, Any]:
    """The reply of ``python -m claude_bottle.gate.control SOCKET ARGS`` run in the gate, as the host runs it."""
    _, output = run.engine.exec(run.names.gate, [GATE_PYTHON, "-m", "claude_bottle.gate.control", CONTROL_SOCKET,
                                                 *args])
    return dict(json.loads(output.decode().strip().splitlines()[-1]))


def pending(run: Run) -> list[dict[str, Any]]:
    deadline = time.monotonic() + 30
    while True:  # bounded by the deadline
        questions = gate_control(run, "pending")["pending"]
        if questions or time.monotonic() > deadline:
            return list(questions)
        time.sleep(0.2)


def test_only_the_host_answers_a_held_request(client: docker.DockerClient, upstream: Upstream, token: str,
                                              workspace: Path) -> None:
    write_agent("asker", f'allow_private = ["{upstream.subnet}"]\nask_timeout = 120\n')
    launch = Launch(load_agent("asker", workspace), workspace, Credential.parse(token, "test"),
                    parse_upstream(upstream.url), (upstream.network,), ask=True)
    with contextlib.ExitStack() as stack:
        run = stack.enter_context(started(launch, lambda line: None))
        run.create_bottle(["sleep", "600"], tty=False)
        run.engine.start(run.names.bottle)
        code, _ = in_bottle(run, f"(curl -s -o /dev/null -m 150 -w '%{{http_code}}' http://target:{PORT}/v1/models "
                                 "> /tmp/held; touch /tmp/held.done) >/dev/null 2>&1 &")
        assert code == 0
        (question,) = pending(run)
        assert (question["host"], question["port"], question["kind"]) == ("target", PORT, "http")

        # the bottle forges answers: on both ports, as lines and as HTTP, and at the socket's path
        for op in ({"op": "decide", "id": question["id"], "answer": "allow-always", "by": "terminal"},
                   {"op": "allow", "entry": f"target:{PORT}"}):
            forged = json.dumps(op)
            for port in (API_PORT, PROXY_PORT):
                in_bottle(run, f"printf '%s\\n' '{forged}' | timeout 5 bash -c 'cat > /dev/tcp/{run.gate_ip}/{port}'")
                in_bottle(run, f"curl -s -m 5 -X POST --data-raw '{forged}' http://{run.gate_ip}:{port}/control")
            in_bottle(run, f"curl -s -m 5 -X POST --data-raw '{forged}' http://gate:{PROXY_PORT}/")
        missing = in_bottle(run, f"curl -s -m 5 --unix-socket {CONTROL_SOCKET} http://x/; echo code=$?")[1]
        assert "code=7" in missing
        still = gate_control(run, "pending")["pending"]
        assert question["id"] in [q["id"] for q in still], "nothing from the bottle answered the question"
        # The POST to gate:PROXY_PORT went through the proxy (NO_PROXY names the gate's address only): a question
        # of its own, since a name is asked about before it is looked up (and found to be the gate's, refused)
        assert {(q["host"], q["port"]) for q in still} <= {("target", PORT), ("gate", PROXY_PORT)}, still
        assert in_bottle(run, "test -e /tmp/held.done")[0] != 0, "the held request is still held"
        assert gate_control(run, "show")["policy"]["allow"] == [], "nor changed the policy"

        # the host answers through the engine: the same request completes, no restart
        reply = gate_control(run, "decide", question["id"], "allow-once", "terminal")
        assert reply["ok"] and reply["entry"] == f"target:{PORT}"
        deadline = time.monotonic() + 30
        while in_bottle(run, "test -e /tmp/held.done")[0] != 0 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert in_bottle(run, "cat /tmp/held")[1].strip() == "200"

        # The engine's exec with a deadline gives up on a command that outlives it (verify bounds its
        # scripts this way: a bottle that died under an exec never ends the stream on every runtime).
        started_at = time.monotonic()
        with pytest.raises(DockerError, match="did not finish within 1 s"):
            run.engine.exec(run.names.bottle, ["sleep", "20"], timeout=1)
        assert time.monotonic() - started_at < 5
        assert run.engine.exec(run.names.bottle, ["true"], timeout=30)[0] == 0
