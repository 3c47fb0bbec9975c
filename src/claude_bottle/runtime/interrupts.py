"""Holding Ctrl-C and its kin while the engine creates something, so removal never misses it."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator


@contextlib.contextmanager
def uninterrupted() -> Iterator[None]:
    """Hold Ctrl-C and friends until a create request returns. Interrupted mid-request, the engine would
    still create the resource after the removal had listed the run's resources and missed it."""
    stop = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, stop)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
