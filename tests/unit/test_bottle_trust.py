"""The gate's CA on its way into a bottle: the host's copy of the image's system bundle gains it in place (the
file a started bottle has mounted), every variable tools read for CA certificates names the whole bundle, and
the bottle is let go only once the gate listens and the CA is there."""

from __future__ import annotations

import os
import socket
import threading
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from claude_bottle.agent.schema import parse_agent
from claude_bottle.credentials import Credential
from claude_bottle.errors import DockerError, GateError
from claude_bottle.gate.ca import RunCA
from claude_bottle.gate.ready import Ready
from claude_bottle.gate.settings import Endpoint
from claude_bottle.launch import Launch, run_spec
from claude_bottle.runtime.files import (
    CA_ENV,
    IMAGE_BUNDLE,
    IMAGE_BUNDLES_KEPT,
    READY_FILE,
    SYSTEM_BUNDLE,
    add_ca,
    bottle_files,
    image_trust_store,
    policy_dir,
    write_for_bottle,
)
from claude_bottle.runtime.gate import startup_lines
from claude_bottle.runtime.run import Run
from claude_bottle.runtime.seam import ContainerInfo, ContainerSpec
from tests.fake_engine import FakeEngine
from tests.helpers import make_token

ROOTS = b"-----BEGIN CERTIFICATE-----\nMIIroot\n-----END CERTIFICATE-----\n"
def ready_line(ca: bytes = b"") -> str:
    """The line a gate says once it listens (gate/ready.py), with ``ca`` (DER) as its CA."""
    return Ready(Endpoint("gate", 8080), Endpoint("gate", 3128), "https://api.anthropic.com", ca).line() + "\n"


LISTENING = ready_line()


@pytest.fixture(autouse=True)
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    return tmp_path / "state"


def bottle_of_image(engine: FakeEngine, bundle: bytes | None, image: str = "ab" * 32) -> ContainerInfo:
    """A created bottle of image ``image`` whose system bundle is ``bundle`` (None: no such file; empty:
    not a regular file)."""
    bottle = engine.create_container(ContainerSpec(image, f"claude-bottle-a-{len(engine.specs)}-bottle", {}))
    if bundle is not None:
        # IMAGE_BUNDLE, not SYSTEM_BUNDLE: the run's file mount is over that one
        engine.files[(bottle.name, IMAGE_BUNDLE)] = bundle
    return bottle


def reads(engine: FakeEngine) -> int:
    return sum(1 for kind, _ in engine.events if kind == "read")


def test_the_images_bundle_is_read_once_per_image() -> None:
    engine = FakeEngine()
    first, again = bottle_of_image(engine, ROOTS), bottle_of_image(engine, ROOTS.replace(b"root", b"else"))
    assert image_trust_store(engine, first) == ROOTS
    assert image_trust_store(engine, again) == ROOTS
    assert reads(engine) == 1
    other = bottle_of_image(engine, ROOTS.replace(b"root", b"other"), image="cd" * 32)
    assert image_trust_store(engine, other) == ROOTS.replace(b"root", b"other")


def test_only_the_newest_images_bundles_are_kept(state: Path) -> None:
    engine = FakeEngine()
    for n in range(IMAGE_BUNDLES_KEPT + 3):
        image_trust_store(engine, bottle_of_image(engine, ROOTS, image=f"{n:064x}"))
    assert len(list((state / "claude-bottle" / "image-trust").glob("*.crt"))) == IMAGE_BUNDLES_KEPT


def test_bundles_another_start_removes_meanwhile_are_no_failure(state: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Starts of other images at once prune the kept bundles: one listed, or found, and gone when read."""
    engine = FakeEngine()
    for n in range(IMAGE_BUNDLES_KEPT):
        image_trust_store(engine, bottle_of_image(engine, ROOTS, image=f"{n:064x}"))
    kept = state / "claude-bottle" / "image-trust"
    listed = Path.glob
    monkeypatch.setattr(Path, "glob", lambda self, pattern: [*listed(self, pattern), kept / "gone.crt"])
    assert image_trust_store(engine, bottle_of_image(engine, ROOTS, image="ef" * 32)) == ROOTS
    read = Path.read_bytes

    def pruned(self: Path) -> bytes:
        self.unlink()
        return read(self)

    monkeypatch.setattr(Path, "read_bytes", pruned)
    assert image_trust_store(engine, bottle_of_image(engine, ROOTS, image="ef" * 32)) == ROOTS


@pytest.mark.parametrize("bundle", [b"", b"not a certificate\n"])
def test_a_bundle_without_certificates_is_refused_and_not_kept(bundle: bytes, state: Path) -> None:
    engine = FakeEngine()
    with pytest.raises(DockerError, match="holds no certificate: rebuild it"):
        image_trust_store(engine, bottle_of_image(engine, bundle))
    with pytest.raises(DockerError, match="the bottle image has no "):
        image_trust_store(engine, bottle_of_image(engine, None))
    assert not list(state.rglob("*.crt"))


def test_the_ca_is_added_to_the_very_file_the_bottle_has_mounted(tmp_path: Path) -> None:
    store = tmp_path / "ca-certificates.crt"
    write_for_bottle(store, ROOTS)
    mounted = os.stat(store).st_ino  # a started bottle holds this inode
    pem = RunCA.generate().certificate_pem
    add_ca(store, pem)
    assert os.stat(store).st_ino == mounted
    assert store.read_bytes() == ROOTS + pem
    assert store.stat().st_mode & 0o777 == 0o644


def test_every_ca_variable_names_the_whole_bundle_whatever_the_agent_sets(tmp_path: Path) -> None:
    agent = parse_agent("a", tomllib.loads('version = 1\n[env]\nSSL_CERT_FILE = "/tmp/mine.pem"\n'
                                           'NODE_EXTRA_CA_CERTS = "/tmp/mine.pem"\n'), "a.toml")
    run = Run(run_spec(Launch(agent, tmp_path, Credential.parse(make_token(), "t")), "b", "g", "1000:1000"),
              FakeEngine())
    environment = run.bottle_environment()
    assert {name: environment[name] for name in CA_ENV} == dict.fromkeys(CA_ENV, SYSTEM_BUNDLE)
    assert {"NODE_EXTRA_CA_CERTS", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "GIT_SSL_CAINFO",
            "PIP_CERT", "npm_config_cafile"} <= set(CA_ENV)


def frame(stream: int, data: bytes) -> bytes:
    """One frame of the engine's multiplexed attach stream."""
    return bytes([stream, 0, 0, 0]) + len(data).to_bytes(4, "big") + data


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    ours, gates = socket.socketpair()
    yield ours, gates
    ours.close()
    gates.close()


def test_the_start_up_lines_are_read_from_standard_error_as_they_come(
        pair: tuple[socket.socket, socket.socket]) -> None:
    ours, gates = pair
    stream = frame(1, b"on stdout: ignored\n") + frame(2, b"starting\n") + frame(2, LISTENING.encode())
    stream += frame(2, b'{"audit": "after it listens: read only if it came with the line before"}\n')

    def trickle() -> None:  # a byte at a time: frames split anywhere
        for i in range(len(stream)):
            gates.send(stream[i : i + 1])

    writer = threading.Thread(target=trickle)
    writer.start()
    lines = startup_lines(ours, 5)
    assert lines is not None and lines.startswith("starting\n" + LISTENING) and "stdout" not in lines
    writer.join()


def test_a_gate_that_stops_or_stays_silent_is_told_apart(pair: tuple[socket.socket, socket.socket]) -> None:
    ours, gates = pair
    gates.sendall(frame(2, b"error: --allow: bad pattern\n"))
    assert startup_lines(ours, 0.2) is None  # nothing more came: not ready in time
    gates.close()
    assert startup_lines(ours, 5) == ""  # the stream ended: it stopped


def started_run(tmp_path: Path, output: bytes, close: bool = True) -> tuple[Run, socket.socket]:
    """A run whose gate wrote ``output`` on its attached stream (then ended it, with ``close``)."""
    run = Run(run_spec(Launch(parse_agent("a", {"version": 1}, "a.toml"), tmp_path,
                              Credential.parse(make_token(), "t")), "b", "g", "1000:1000"), FakeEngine())
    ours, gates = socket.socketpair()
    gates.sendall(output)
    if close:
        gates.close()
    run.gate_started = True  # what it said is on ``ours``
    run._gate_output = ours
    return run, gates


def test_the_host_takes_the_ca_the_gate_announced(tmp_path: Path) -> None:
    ca = RunCA.generate()
    run, _ = started_run(tmp_path, frame(2, ready_line(ca.certificate_der).encode()), close=False)
    run.wait_for_gate()
    assert run.gate_ca == ca.certificate_pem


def test_a_gate_that_announces_no_ca_is_refused(tmp_path: Path) -> None:
    run, _ = started_run(tmp_path, frame(2, LISTENING.encode()))
    with pytest.raises(GateError, match="announced no CA certificate"):
        run.wait_for_gate()


def test_a_gate_image_older_than_the_ready_line_is_told_to_be_rebuilt_at_once(tmp_path: Path) -> None:
    """An image built before the ready line says where it listens in its old words, keeps running and never
    says ``ready``: the host stops reading there and says to rebuild, not that the gate timed out."""
    older = "claude-bottle gate: CA MIIB\nclaude-bottle gate: API on gate:8080, proxy on gate:3128, upstream x\n"
    run, _ = started_run(tmp_path, frame(2, older.encode()), close=False)
    started = time.monotonic()
    with pytest.raises(GateError, match=r"image is older than this claude-bottle.*run `claude-bottle build`"):
        run.wait_for_gate()
    assert time.monotonic() - started < 5


def test_a_gate_that_stops_at_start_is_reported_with_its_last_words(tmp_path: Path) -> None:
    run, _ = started_run(tmp_path, frame(2, b"claude-bottle: --allow 'x y': not a host\n"))
    with pytest.raises(GateError, match=r"the gate stopped at start:.*not a host"):
        run.wait_for_gate()


def test_the_bottle_is_let_go_only_once_its_trust_store_has_the_gates_ca(tmp_path: Path) -> None:
    ca = RunCA.generate()
    run, gates = started_run(tmp_path, frame(2, ready_line(ca.certificate_der).encode()), close=False)
    files, policy = bottle_files(run.id), policy_dir(run.id)
    files.mkdir(parents=True)
    policy.mkdir(parents=True)
    write_for_bottle(files / "ca-certificates.crt", ROOTS)
    ready = policy / READY_FILE.rsplit("/", 1)[1]
    assert not ready.exists()
    run.release()
    assert (files / "ca-certificates.crt").read_bytes() == ROOTS + ca.certificate_pem
    assert ready.is_file() and ready.stat().st_mode & 0o777 == 0o644
    gates.close()


def test_a_gate_that_fails_leaves_the_bottle_held(tmp_path: Path) -> None:
    run, _ = started_run(tmp_path, frame(2, b"claude-bottle: cannot listen on gate:8080\n"))
    policy_dir(run.id).mkdir(parents=True)
    with pytest.raises(GateError):
        run.release()
    assert not (policy_dir(run.id) / READY_FILE.rsplit("/", 1)[1]).exists()
