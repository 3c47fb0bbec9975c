"""The run's lifeline at both ends, on pipes and socket pairs: the gate's watch of its standard input (its
end, and where the host beats, silence) and the host's heartbeat."""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time

import pytest

from claude_bottle.gate.lifeline import watch
from claude_bottle.runtime import lifeline
from claude_bottle.runtime.lifeline import BEAT, Heartbeat


def test_the_gate_is_kept_while_its_input_is_open_and_let_go_at_its_end() -> None:
    read, write = os.pipe()
    closed = threading.Event()
    watch(read, closed.set)
    os.write(write, b"anything\n")
    assert not closed.wait(0.3), "what comes does not end it"
    os.close(write)
    assert closed.wait(5)
    os.close(read)


def test_with_a_silence_the_beats_keep_the_gate_and_their_stop_lets_it_go() -> None:
    read, write = os.pipe()
    closed = threading.Event()
    watch(read, closed.set, silence=0.5)
    for _ in range(6):  # 1.2 s of beats, more than twice the silence
        os.write(write, BEAT)
        last = time.monotonic()
        assert not closed.wait(0.2), "a beat within the silence keeps it"
    assert closed.wait(5), "the input open, and silent"
    assert 0.45 < time.monotonic() - last < 2
    os.close(write)
    os.close(read)


def test_the_heartbeat_beats_until_stopped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lifeline, "BEAT_SECONDS", 0.05)
    ours, gates = socket.socketpair()
    with ours, gates:
        beat = Heartbeat(ours)
        beat.start()
        gates.settimeout(5)
        assert gates.recv(1) == BEAT and gates.recv(1) == BEAT
        beat.stop()
        time.sleep(0.2)
        gates.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            gates.recv(4096)  # what was written before the stop
        time.sleep(0.2)
        with pytest.raises(BlockingIOError):
            gates.recv(1)
