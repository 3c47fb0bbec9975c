"""A run's start, its interruption at every step, its end and --keep, on the in-memory engine: what the
engine is asked for, and that nothing of a run outlives its removal but its pooled network and its audit."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from claude_bottle import launch, records
from claude_bottle.agent.schema import parse_agent
from claude_bottle.credentials import Credential
from claude_bottle.errors import ConfigError, DockerError, GateError
from claude_bottle.gate.ca import RunCA
from claude_bottle.gate.ready import Ready
from claude_bottle.gate.settings import Endpoint
from claude_bottle.launch import Launch, interrupt, on_stop_signals, run_spec
from claude_bottle.runtime import lifeline, stillness
from claude_bottle.runtime.files import IMAGE_BUNDLE, bottle_files, policy_dir
from claude_bottle.runtime.gate import GATE_ALIAS
from claude_bottle.runtime.lifeline import SILENCE_SECONDS
from claude_bottle.runtime.listing import runs
from claude_bottle.runtime.names import POOL_LABEL
from claude_bottle.runtime.removal import remove_run
from claude_bottle.runtime.run import Run
from claude_bottle.runtime.seam import Engine
from tests.fake_engine import FakeEngine
from tests.helpers import make_token

ROOTS = b"-----BEGIN CERTIFICATE-----\nroot\n-----END CERTIFICATE-----\n"
CA = RunCA.generate()
LISTENING = Ready(Endpoint("gate", 8080), Endpoint("gate", 3128), "https://api.anthropic.com",
                  CA.certificate_der).line() + "\n"


def frame(data: bytes) -> bytes:
    """One standard-error frame of the engine's multiplexed attach stream."""
    return bytes([2, 0, 0, 0]) + len(data).to_bytes(4, "big") + data


@pytest.fixture(autouse=True)
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    return tmp_path / "state"


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    (tmp_path / "project").mkdir()
    return tmp_path / "project"


class BottleEngine(FakeEngine):
    """The fake engine as a booting gate and a built bottle image answer it: the gate announces its CA and
    that it listens once started, the bottle's image has its bundle."""

    def create_container(self, spec: Any) -> Any:
        created = super().create_container(spec)
        self.files[(spec.name, IMAGE_BUNDLE)] = ROOTS
        return created

    def start_attached(self, name: str) -> Any:
        ours = super().start_attached(name)
        self.attached[name].sendall(frame(LISTENING.encode()))
        self.output[name] = b'{"decision": "allow", "reason": "in the allowlist"}\n'
        return ours


def new_run(engine: FakeEngine, workspace: Path) -> Run:
    agent = parse_agent("dev", {"version": 1}, "dev.toml")
    spec = run_spec(Launch(agent, workspace, Credential.parse(make_token(), "t")), "bottle:1", "gate:1", "1000:1000")
    return Run(spec, engine)


def test_a_start_makes_the_gate_then_the_bottle_on_the_runs_own_network(workspace: Path) -> None:
    engine = BottleEngine()
    run = new_run(engine, workspace)
    run.start_gate()
    assert run.internal is not None and run.egress is not None
    assert engine.members[run.internal.name] == {run.names.gate} and run.gate_ip
    gate = engine.specs[run.names.gate]
    assert gate.network == run.egress.id and gate.stdin_open and gate.read_only and "--token-file" in gate.command
    assert f"{GATE_ALIAS}:8080" in gate.command, "listening on its name on the internal network"
    run.start_bottle(["sleep", "600"])
    bottle = engine.specs[run.names.bottle]
    assert (bottle.network, bottle.dns, bottle.user) == (run.internal.name, (run.gate_ip,), "1000:1000")
    assert bottle.no_ipv6 and bottle.host_user and bottle.bounded_logs
    assert engine.container(run.names.bottle) is not None and engine.container(run.names.bottle).active
    store = (bottle_files(run.id) / "ca-certificates.crt").read_bytes()
    assert store == ROOTS + CA.certificate_pem, "the image's bundle, then the gate's CA"
    assert (policy_dir(run.id) / "ready").exists(), "the bottle's command let go"
    assert [r["run"] for r in runs(engine)] == [run.id]


def test_a_start_without_names_on_the_internal_network_gives_the_gate_an_address(workspace: Path) -> None:
    engine = BottleEngine(internal_names=False, pooled_networks=False)
    run = new_run(engine, workspace)
    run.start_gate()
    assert run.internal is not None and run.internal.name == run.names.internal
    assert run.gate_listen == run.internal.subnets[0].replace("0/24", "2")
    assert f"{run.gate_listen}:8080" in engine.specs[run.names.gate].command
    run.remove()
    assert engine.networks(POOL_LABEL) == [] and engine.network(run.names.internal) is None


def test_the_end_of_a_run_keeps_its_audit_and_leaves_only_its_pooled_network(workspace: Path) -> None:
    engine = BottleEngine()
    run = new_run(engine, workspace)
    run.start_gate()
    run.start_bottle(["true"])
    run.stop_gate()
    run.remove()
    assert engine.containers() == [] and len(engine.networks(POOL_LABEL)) == 1
    assert records.find(run.id).lines == 1
    assert not bottle_files(run.id).exists()
    assert engine.volumes, "Claude's state stays for the next run of the agent on the workspace"


def test_a_run_holds_its_gates_stream_until_it_ends_and_then_lets_go(workspace: Path) -> None:
    """The gate stops when its stream closes (``--exit-with-stdin``): the run holds it open, and closing it on
    purpose is no loss."""
    engine = BottleEngine()
    run = new_run(engine, workspace)
    run.start_gate()
    run.start_bottle(["sleep", "600"])
    gates = engine.attached[run.names.gate]
    gates.settimeout(0.2)
    secrets = b""
    with pytest.raises(TimeoutError):
        while chunk := gates.recv(4096):  # the token's line, then nothing, and no end: open
            secrets += chunk
    assert secrets.count(b"\n") == 1 and secrets.endswith(b"\n")
    assert "--stdin-heartbeat" not in engine.specs[run.names.gate].command, "its end is enough on Docker"
    run.remove()
    gates.settimeout(5)
    assert gates.recv(1) == b"", "let go: the gate's standard input ends"
    assert not run.gate_lost.is_set()
    run.check_gate()


def test_where_the_engine_keeps_the_gates_input_open_the_run_beats_on_it(
        workspace: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Podman: the gate is told to stop when the beats stop, and they come until the run lets go."""
    monkeypatch.setattr(lifeline, "BEAT_SECONDS", 0.05)
    engine = BottleEngine(internal_names=False, pooled_networks=False)
    engine.stdin_ends_with_client = False
    run = new_run(engine, workspace)
    run.start_gate()
    command = engine.specs[run.names.gate].command
    assert command[command.index("--stdin-heartbeat") + 1] == str(SILENCE_SECONDS)
    run.start_bottle(["sleep", "600"])
    gates = engine.attached[run.names.gate]
    gates.settimeout(5)
    came = b""
    while came.count(b"\n") < 4:  # the token's line, then beats
        came += gates.recv(4096)
    run.remove()
    while chunk := gates.recv(4096):
        came += chunk
    assert not run.gate_lost.is_set()


def test_a_gate_gone_mid_run_removes_the_bottle_and_says_so(workspace: Path) -> None:
    engine = BottleEngine()
    run = new_run(engine, workspace)
    run.start_gate()
    run.start_bottle(["sleep", "600"])
    engine.attached[run.names.gate].close()  # the gate exited or was killed: its stream ends
    assert run.gate_lost.wait(5)
    deadline = time.monotonic() + 5
    while engine.container(run.names.bottle) is not None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert engine.container(run.names.bottle) is None, "the bottle is removed: what waits on it ends"
    with pytest.raises(GateError, match="the gate stopped while the run went on"):
        run.check_gate()
    run.remove()
    assert records.find(run.id).lines == 1, "its audit kept"


def test_a_gate_gone_before_the_bottle_starts_is_a_loss_too(workspace: Path) -> None:
    """``start``: the bottle is created, then started by the terminal's client once the gate listens."""
    engine = BottleEngine()
    run = new_run(engine, workspace)
    run.start_gate()
    run.create_bottle(["claude"], tty=True)
    engine.attached[run.names.gate].close()
    assert run.gate_lost.wait(5)
    with pytest.raises(GateError):
        run.check_gate()
    run.remove()


def test_a_run_stopped_from_another_terminal_lost_nothing(workspace: Path) -> None:
    """``stop`` removes the bottle, then the gate: the gate's end is then no loss."""
    engine = BottleEngine()
    run = new_run(engine, workspace)
    run.start_gate()
    run.start_bottle(["sleep", "600"])
    engine.remove_container(run.names.bottle)
    engine.attached[run.names.gate].close()
    time.sleep(0.2)
    assert not run.gate_lost.is_set()
    run.check_gate()
    run.remove()


def test_a_kept_run_stays_listed_until_stop_removes_it(workspace: Path) -> None:
    engine = BottleEngine()
    run = new_run(engine, workspace)
    run.start_gate()
    run.start_bottle(["sleep", "600"])  # --keep: the start ends without removing it
    assert [(r["run"], r["status"]) for r in runs(engine)] == [(run.id, "running")]
    remove_run(engine, run.id)  # `claude-bottle stop`
    assert runs(engine) == [] and records.find(run.id).run == run.id


def test_a_kept_run_ended_by_a_signal_is_stopped_before_the_workspace_is_checked(
    workspace: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A start with --keep ended by SIGTERM or SIGHUP while the agent holds Claude Code stopped: its bottle is
    stopped, not left running to write the workspace once the run's check of its protected files is over."""
    engine = BottleEngine()
    monkeypatch.setattr(launch, "open_engine", lambda: engine)
    monkeypatch.setattr(launch, "build_images", lambda *args: ("bottle:1", "gate:1"))
    monkeypatch.setattr(launch, "bottle_user", lambda *args: "1000:1000")
    monkeypatch.setattr(launch, "watch_over", lambda run_id, workspace: SimpleNamespace(release=lambda: None))
    agent = parse_agent("dev", {"version": 1}, "dev.toml")
    with pytest.raises(KeyboardInterrupt), \
            launch.started(Launch(agent, workspace, Credential.parse(make_token(), "t")), lambda line: None,
                           keep=True) as run:
        run.start_bottle(["sleep", "600"])
        raise KeyboardInterrupt  # forwarded_signals, 10 s after a SIGTERM Claude Code did not end on
    assert [(r["run"], r["status"]) for r in runs(engine)] == [(run.id, "exited")]  # kept stopped, for stop


class Interrupted(BottleEngine):
    """Ctrl-C at the ``at``-th request the runtime makes, before it reaches the engine or once it is done."""

    def __init__(self, at: int, after: bool) -> None:
        super().__init__()
        self.lock = threading.Lock()
        self.at, self.after, self.calls, self.inside = at, after, 0, threading.local()

    def __getattribute__(self, name: str) -> Any:
        found = super().__getattribute__(name)
        if name.startswith("_") or not callable(found) or not hasattr(Engine, name):
            return found

        def counted(*args: Any, **kwargs: Any) -> Any:
            if getattr(self.inside, "call", False):  # the fake's own use of itself
                return found(*args, **kwargs)
            with self.lock:
                self.calls += 1
                call = self.calls
            if call == self.at and not self.after:
                raise KeyboardInterrupt
            self.inside.call = True
            try:
                result = found(*args, **kwargs)
            finally:
                self.inside.call = False
            if call == self.at:
                raise KeyboardInterrupt
            return result
        return counted


def test_a_start_interrupted_at_any_step_leaves_nothing_once_removed(workspace: Path) -> None:
    """At every request of a start, before it reaches the engine and once it is done, until a start goes
    through uninterrupted (the image's bundle is read once: later starts make one request fewer)."""
    for at in range(1, 100):
        for after in (False, True):
            engine = Interrupted(at, after)
            run = new_run(engine, workspace)
            try:
                run.start_gate()
                run.start_bottle(["true"])
                interrupted = False
            except KeyboardInterrupt:
                interrupted = True
            engine.at = 0  # removal runs to its end (signals are ignored then)
            run.remove()
            where = f"interrupted at request {at} ({'after' if after else 'before'} it)"
            assert engine.containers() == [], where
            assert all(network.labels.get(POOL_LABEL) or network.name == "claude-bottle-egress"
                       for network in engine.networks_by_name.values()), where
            assert not bottle_files(run.id).exists(), where
        if not interrupted:
            break
    assert at > 10, "every step of a start was interrupted"


class CreatedAnyway(BottleEngine):
    """Ctrl-C reaches the CLI while the engine works on the ``at``-th create request of a start, and the
    engine finishes that request a moment later anyway, as a daemon does. ``overlapped``: the requests the CLI
    made meanwhile (its removal among them), which cannot know of what is being created."""

    CREATES = frozenset({"create_network", "create_placeholder", "create_container", "create_volume"})

    def __init__(self, at: int) -> None:
        super().__init__()
        self.at, self.creates, self.in_flight, self.overlapped, self.cut = at, 0, False, [], ""

    def __getattribute__(self, name: str) -> Any:
        found = super().__getattribute__(name)
        if name.startswith("_") or not callable(found) or not hasattr(Engine, name):
            return found

        def called(*args: Any, **kwargs: Any) -> Any:
            if self.in_flight and threading.current_thread() is threading.main_thread():
                self.overlapped.append(name)
            if name not in self.CREATES:
                return found(*args, **kwargs)
            self.creates += 1
            if self.creates != self.at:
                return found(*args, **kwargs)
            outcome: list[Any] = []

            def finish() -> None:
                time.sleep(0.2)
                try:
                    outcome.append(found(*args, **kwargs))
                except BaseException as exc:  # raised in the caller's thread, as the engine's answer
                    outcome.append(exc)
                self.in_flight = False

            self.in_flight, self.cut = True, name
            creating = threading.Thread(target=finish)
            creating.start()
            os.kill(os.getpid(), signal.SIGINT)
            creating.join()
            if isinstance(outcome[0], BaseException):
                raise outcome[0]
            return outcome[0]
        return called


def test_a_ctrl_c_while_the_engine_creates_is_held_until_the_create_returns(workspace: Path) -> None:
    """At every create request of a start: nothing is asked of the engine until that request has returned, so
    the removal that follows finds what it created."""
    for at in range(1, 20):
        engine = CreatedAnyway(at)
        run = new_run(engine, workspace)
        interrupted = False
        try:
            with on_stop_signals(interrupt):  # as the CLI's commands (Ctrl-C may be ignored where tests run)
                run.start_gate()
                run.start_bottle(["true"])
        except KeyboardInterrupt:
            interrupted = True
        run.remove()
        while engine.in_flight:
            time.sleep(0.05)
        assert interrupted == (engine.creates >= at), f"create request {at}"
        assert engine.overlapped == [], f"interrupted in {engine.cut}, create request {at}"
        if engine.creates < at:
            break
    assert at > 3, "every create request of a start was interrupted"


def neighbour(engine: FakeEngine, run: str, workspace: Path, status: str = "running", role: str = "bottle") -> str:
    """Another run's container with ``workspace`` at /workspace."""
    name = f"claude-bottle-{run}-{role}"
    engine.add_container(name, {"claude-bottle": "1", "claude-bottle.run": run}, status=status,
                         mounts={"/workspace": str(workspace), "/home/claude/.claude": "claude-state"})
    return name


def settled(engine: FakeEngine, names: list[str], status: str) -> bool:
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        if all(engine.containers_by_name[name].status == status for name in names):
            return True
        time.sleep(0.02)
    return False


class WatchedEngine(BottleEngine):
    """Records every container's status when the bottle is created and when it is started."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: dict[str, dict[str, str]] = {}

    def _look(self, moment: str) -> None:
        self.seen[moment] = {name: c.status for name, c in self.containers_by_name.items()}

    def create_container(self, spec: Any) -> Any:
        if spec.name.endswith("-bottle"):
            self._look("create")
        return super().create_container(spec)

    def start(self, name: str) -> None:
        if name.endswith("-bottle"):
            self._look("start")
        super().start(name)


def test_bottles_that_could_swap_its_mounts_are_paused_until_a_bottle_has_started(workspace: Path) -> None:
    """A running bottle that writes a folder on a starting bottle's paths could swap a folder there for a
    symlink between the start's checks and the engine's mount: every such bottle (on the same workspace, one
    inside it, one around it) is paused from before the checks until the new bottle runs, and no other."""
    engine = WatchedEngine()
    (workspace / "sub").mkdir()
    close = [neighbour(engine, "same", workspace), neighbour(engine, "inside", workspace / "sub"),
             neighbour(engine, "around", workspace.parent)]
    apart = [neighbour(engine, "apart", workspace.parent / "other"),
             neighbour(engine, "gate", workspace, role="gate"), neighbour(engine, "ended", workspace, "exited")]
    run = new_run(engine, workspace)
    run.start_gate()
    run.start_bottle(["sleep", "600"])
    for moment in ("create", "start"):
        assert [engine.seen[moment][name] for name in close] == ["paused"] * 3, moment
        assert [engine.seen[moment][name] for name in apart] == ["running", "running", "exited"], moment
    assert settled(engine, close, "running"), "resumed once the bottle runs"
    assert ("pause", apart[0]) not in engine.events
    run.remove()


def test_a_bottle_created_and_never_started_holds_them_until_its_run_ends(workspace: Path) -> None:
    engine = BottleEngine()
    same = neighbour(engine, "same", workspace)
    run = new_run(engine, workspace)
    run.start_gate()
    run.create_bottle(["claude"], tty=True)  # started by the engine's client, which here never comes
    time.sleep(0.2)
    assert engine.containers_by_name[same].status == "paused"
    run.remove()
    assert engine.containers_by_name[same].status == "running"


def test_a_bottle_not_seen_for_an_engine_error_holds_them_still(workspace: Path) -> None:
    """An engine that fails to answer while the bottle is created does not say it started: they stay paused."""
    engine = BottleEngine()
    same = neighbour(engine, "same", workspace)
    run = new_run(engine, workspace)
    run.start_gate()
    looked = threading.Event()

    def container(name: str) -> Any:
        if name == run.names.bottle:
            looked.set()
            raise DockerError("the engine is busy (fake)")
        return FakeEngine.container(engine, name)

    engine.container = container  # type: ignore[method-assign]
    run.create_bottle(["claude"], tty=True)
    assert looked.wait(5)
    time.sleep(0.2)
    assert engine.containers_by_name[same].status == "paused"
    run.remove()
    assert engine.containers_by_name[same].status == "running"


def test_a_bottle_the_engine_cannot_pause_stops_the_start_and_nothing_stays_paused(workspace: Path) -> None:
    engine = BottleEngine()
    first, second = neighbour(engine, "first", workspace), neighbour(engine, "second", workspace / "x")

    def pause(name: str) -> None:
        if name == second:
            raise DockerError("cgroups: cannot pause (fake)")
        FakeEngine.pause(engine, name)

    engine.pause = pause  # type: ignore[method-assign]
    run = new_run(engine, workspace)
    run.start_gate()
    with pytest.raises(DockerError, match=rf"cannot pause {second}, a bottle running on {workspace / 'x'}.*"
                                          r"claude-bottle stop"):
        run.start_bottle(["sleep", "600"])
    assert run.names.bottle not in engine.containers_by_name, "nothing created"
    assert engine.containers_by_name[first].status == "running"
    run.remove()
    assert [c.name for c in engine.containers()] == [second, first]


def test_a_ctrl_c_while_a_bottle_is_paused_leaves_it_running(workspace: Path, state: Path) -> None:
    """The engine pauses it, and the interrupt comes before its answer: the start ends, its neighbour runs."""
    engine = BottleEngine()
    same = neighbour(engine, "same", workspace)

    def pause(name: str) -> None:
        FakeEngine.pause(engine, name)
        raise KeyboardInterrupt

    engine.pause = pause  # type: ignore[method-assign]
    run = new_run(engine, workspace)
    run.start_gate()
    with pytest.raises(KeyboardInterrupt):
        run.start_bottle(["sleep", "600"])
    run.remove()
    assert engine.containers_by_name[same].status == "running"
    assert not (state / "claude-bottle" / stillness.PAUSED_FILE).exists()


def test_a_workspace_that_leads_elsewhere_by_the_bottles_start_is_refused(workspace: Path, tmp_path: Path) -> None:
    """What was resolved when the start began is looked at again once neighbours are still: a symlink made on
    the way since then (by a bottle on a folder around it) refuses the start."""
    engine = BottleEngine()
    run = new_run(engine, workspace)
    run.start_gate()
    elsewhere = tmp_path / "elsewhere"
    workspace.rename(elsewhere)
    workspace.symlink_to(elsewhere)
    with pytest.raises(ConfigError, match=f"{workspace} leads to {elsewhere} now"):
        run.start_bottle(["sleep", "600"])
    assert run.names.bottle not in engine.containers_by_name
    run.remove()


def test_bottles_a_killed_start_left_paused_are_resumed_at_the_next(workspace: Path, state: Path) -> None:
    engine = BottleEngine()
    left = neighbour(engine, "left", workspace.parent / "other", status="paused")
    by_hand = neighbour(engine, "by-hand", workspace.parent / "third", status="paused")
    state.mkdir(parents=True, exist_ok=True)
    (state / "claude-bottle" / stillness.PAUSED_FILE).parent.mkdir(parents=True, exist_ok=True)
    (state / "claude-bottle" / stillness.PAUSED_FILE).write_text(f"{left}\nclaude-bottle-gone-bottle\n")
    run = new_run(engine, workspace)
    run.start_gate()
    run.start_bottle(["sleep", "600"])
    assert engine.containers_by_name[left].status == "running"
    assert engine.containers_by_name[by_hand].status == "paused", "one paused by hand is the user's"
    assert not (state / "claude-bottle" / stillness.PAUSED_FILE).exists()
    run.remove()


def test_starts_take_turns(state: Path) -> None:
    with stillness.turn():
        began = time.monotonic()
        with pytest.raises(DockerError, match="another claude-bottle start has held its turn"), stillness.turn(0.3):
            pass
        assert time.monotonic() - began >= 0.3
    with stillness.turn():
        pass
