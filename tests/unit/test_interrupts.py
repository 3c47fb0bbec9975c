"""Ctrl-C and its kin held while the engine creates something, then acted on."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator

import pytest

from claude_bottle.launch import interrupt, on_stop_signals
from claude_bottle.runtime.interrupts import uninterrupted


@pytest.fixture
def other_thread() -> Iterator[None]:
    """A thread that does not block the signals, as the run's heartbeat and readers: the kernel gives a
    process's signal to it when the main thread blocks that signal."""
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait, daemon=True)
    thread.start()
    yield
    stop.set()
    thread.join()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_a_stop_signal_is_held_to_the_end_of_the_block_whichever_thread_gets_it(
        sig: int, other_thread: None) -> None:
    reached = []
    with on_stop_signals(interrupt), pytest.raises(KeyboardInterrupt), uninterrupted():
        os.kill(os.getpid(), sig)
        time.sleep(0.2)  # the handler has run by now, had it not been held
        reached.append("the end of the block")
    assert reached == ["the end of the block"]


def test_a_held_signal_meets_the_handler_in_force_after_the_block(other_thread: None) -> None:
    before = signal.getsignal(signal.SIGINT)
    with on_stop_signals(signal.SIG_IGN):  # as removal: ignored, and so at the block's end
        with uninterrupted():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.1)
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    assert signal.getsignal(signal.SIGINT) == before


def test_in_a_worker_thread_the_block_leaves_the_handlers_to_the_main_thread() -> None:
    outcome: list[BaseException | None] = []

    def work() -> None:
        try:
            with uninterrupted():
                outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    worker = threading.Thread(target=work)
    worker.start()
    worker.join()
    assert outcome == [None]
