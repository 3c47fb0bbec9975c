"""The gate as the host starts and drives it: its arguments and standard input, the start-up lines it
announces readiness and its CA in, and its control channel."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path
from typing import Any

from claude_bottle.errors import ConfigError, DockerError, GateError
from claude_bottle.gate.options import GateOptions
from claude_bottle.gate.ready import older_gate_said, parse_ready, ready_said
from claude_bottle.gate.settings import Endpoint
from claude_bottle.runtime.files import write_policy
from claude_bottle.runtime.names import RunNames
from claude_bottle.runtime.seam import ContainerInfo, Engine
from claude_bottle.runtime.spec import API_PORT, PROXY_PORT, RunSpec

CONTROL_SOCKET = "/tmp/claude-bottle-control.sock"  # in the gate's own tmpfs: see gate/control.py
GATE_PYTHON = "/opt/gate/bin/python"
# The gate container's bounds, with what every container gets (runtime/docker_values.py): a read-only root but
# for a small /tmp, and limits on its processes and memory.
GATE_TMPFS = {"/tmp": "size=16m"}
GATE_PIDS_LIMIT = 256
# Memory: about 55 MB in use, what each listener may hold of request bodies to judge (gate/settings.py
# ``Limits``: 96 and 64 MiB), and one join and one parse at a time of the largest body (32 MiB; a JSON array of
# 16 million small numbers parses to about 230 MB of objects).
GATE_MEMORY = "512m"
GATE_READY_SECONDS = 30
GATE_STOP_SECONDS = 3
# A run's gate stops once its bottle is gone: what is still in flight then has no client to answer (a request
# its upstream has not answered yet). It is cut after this, and its line written, before the engine's SIGKILL
# at GATE_STOP_SECONDS would lose that line.
GATE_DRAIN_SECONDS = 1.0
GATE_ALIAS = "gate"  # the gate's name on the internal network, where the engine resolves names there (Docker)


def gate_options(spec: RunSpec, listen: str = GATE_ALIAS, heartbeat: float = 0.0) -> GateOptions:
    """What the run's gate is told: where it listens (``listen``: its name or address on the internal network),
    its upstream, the agent's egress and API policy, and the secrets (which go on its stdin, never in argv).
    It stops when its standard input ends or (``heartbeat`` above 0) stays silent that long."""
    return GateOptions(
        api_listen=Endpoint(listen, API_PORT), proxy_listen=Endpoint(listen, PROXY_PORT), credential=spec.credential,
        upstream=spec.upstream, allow=spec.allow, allow_tcp=spec.allow_tcp, allow_private=spec.allow_private,
        allow_server_tool=spec.server_tools, request_policy=spec.request_policy, dlp=spec.dlp, routes=spec.routes,
        extra_ca=tuple(Path(path["bind"]) for path in upstream_ca_mounts(spec).values()), audit_log="-",
        learn=spec.learn, ask=spec.ask, ask_timeout=spec.ask_timeout, control_socket=Path(CONTROL_SOCKET),
        exit_with_stdin=True, stdin_heartbeat=heartbeat, drain_seconds=GATE_DRAIN_SECONDS,
        upstream_proxy=spec.upstream_proxy, mcp_servers=spec.mcp_rules,
    )


def upstream_ca_mounts(spec: RunSpec) -> dict[str, dict[str, str]]:
    """``spec.upstream_ca_files`` as read-only mounts into the gate."""
    return {str(path): {"bind": f"/opt/gate/upstream-ca/{i}.pem", "mode": "ro"}
            for i, path in enumerate(spec.upstream_ca_files)}


def control_gate(engine: Engine, gate: ContainerInfo, op: str, entry: str = "") -> dict[str, Any]:
    """Change (or with ``show`` read) a running gate's egress policy through its control socket, reached
    by running ``claude_bottle.gate.control`` inside the gate container; then the bottle's policy file is
    rewritten. The reply; a ConfigError naming what the gate refused."""
    reply = control_reply(engine, gate, [op, entry])
    if not reply.get("ok"):
        raise ConfigError(f"{op} {entry}: {reply.get('error', 'refused by the gate')}")
    return reply


def control_command(gate: ContainerInfo, args: list[str]) -> list[str]:
    """The argv inside the gate container that sends ``args`` (an operation and its words) to its control
    socket: ``python -m claude_bottle.gate.control SOCKET ARGS``."""
    return [GATE_PYTHON, "-m", "claude_bottle.gate.control", CONTROL_SOCKET, *args]


def control_reply(engine: Engine, gate: ContainerInfo, args: list[str]) -> dict[str, Any]:
    """The gate's reply to ``args`` on its control channel (``ok`` true or false, as the gate said); when it
    carries the policy in effect (a change), the bottle's policy file is rewritten. A DockerError when the gate
    cannot be reached, a GateError when it gives no reply."""
    try:
        _, output = engine.exec(gate.name, control_command(gate, args))
    except DockerError as exc:
        raise DockerError(f"cannot reach the gate {gate.name}: {exc}") from None
    text = output.decode("utf-8", "replace").strip()
    try:
        reply = json.loads(text.splitlines()[-1])
    except (ValueError, IndexError):
        reply = None
    if not isinstance(reply, dict):
        raise GateError(f"the gate {gate.name} gave no answer on its control channel ({text[:200] or 'nothing'}); "
                        "a bottle started by an older claude-bottle has none: restart it")
    if reply.get("ok") and isinstance(reply.get("policy"), dict) and args[:1] != ["show"]:
        write_policy(RunNames.from_labels(gate.labels).id, reply["policy"])
    return dict(reply)


def startup_lines(stream: socket.socket, seconds: float) -> str | None:
    """A starting gate's standard error, read from its attached ``stream`` (the engine's multiplexed frames:
    an 8-byte header, then the payload) until its ready line has come whole (``gate.ready``; with whatever came
    in the same read), or the line an older gate image says instead, or to its end if it stopped first. None
    when none of these came within ``seconds``."""
    deadline = time.monotonic() + seconds
    text = b""
    buffer = b""
    while not (ready_said(text) or older_gate_said(text)):
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        stream.settimeout(left)
        try:
            data = stream.recv(65536)
        except TimeoutError:
            return None
        except OSError:
            data = b""
        if not data:
            break
        buffer += data
        while len(buffer) >= 8 and len(buffer) >= 8 + int.from_bytes(buffer[4:8], "big"):
            size = int.from_bytes(buffer[4:8], "big")
            if buffer[0] == 2:  # standard error
                text += buffer[8 : 8 + size]
            buffer = buffer[8 + size :]
    return text.decode("utf-8", "replace")


def ca_from_ready_line(lines: str | None) -> bytes:
    """The CA certificate (PEM) in the ready line a starting gate said once it listens, taken from its start-up
    lines (``startup_lines``; None: nothing within ``GATE_READY_SECONDS``). A GateError saying why when it did
    not become ready: it said nothing in time, it stopped (with its last words), its image is older than this
    claude-bottle (it says another line, or announces no CA)."""
    if lines is None:
        raise GateError(f"the gate did not become ready within {GATE_READY_SECONDS}s")
    said = lines.encode()
    if not ready_said(said) and older_gate_said(said):
        raise GateError("the gate's image is older than this claude-bottle (it does not announce itself as this "
                        "version expects); run `claude-bottle build`")
    if not ready_said(said):
        raise GateError(f"the gate stopped at start: {lines.strip().splitlines()[-1:] or 'no output'}")
    ready = parse_ready(lines)
    certificate = ready.ca_pem() if ready is not None else None
    if certificate is None:
        raise GateError("the gate announced no CA certificate: its image is older than this "
                        "claude-bottle; run `claude-bottle build`")
    return certificate
