"""Holding Ctrl-C and its kin while the engine creates something, so removal never misses it."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType

STOP = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)  # what ends a run: held here, handled by launch.py


@contextlib.contextmanager
def uninterrupted() -> Iterator[None]:
    """Hold Ctrl-C and friends until a create request returns, then act on the first one that came. Interrupted
    mid-request, the engine would still create the resource after the removal had listed the run's resources
    and missed it.

    Held by the handlers, not by a signal mask: Python runs every handler in the main thread, whichever thread
    the kernel gave the signal to (the run's heartbeat and readers do not block it), so a mask on the main
    thread alone would not hold it. Only the main thread can set handlers; it holds them while its workers
    create (a no-op in a worker)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    came: list[int] = []

    def hold(signum: int, frame: FrameType | None) -> None:
        came.append(signum)

    previous = {sig: signal.signal(sig, hold) for sig in STOP}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
        if came:
            signal.raise_signal(came[0])  # to its own handler now, as if it came at this moment
