"""The gate's attached stream, held by the host for the run's life: the run's lifeline both ways.

The gate is started with ``--exit-with-stdin`` (gate/lifeline.py): when this process ends, even killed
outright, the kernel closes its end of the stream, the engine closes the gate's standard input, and the gate
stops. That is Docker's way. Podman's Docker-compatible API keeps the standard input of a container whose
client went away open (measured on 4.3.1: it closes it on a half-close only), so there the host also beats on
the stream (``Heartbeat``) and the gate, started with ``--stdin-heartbeat``, stops when the beats stop, however
this process ended. Not on Docker: there a host stopped for a while (Ctrl-Z) keeps its run.

The other way, the stream's end while the host still holds it says the gate is gone (exited, killed, the
engine lost it, or another terminal's ``stop`` removed the run): ``on_end`` is called, to end the run instead
of leaving Claude Code retrying against nothing. Nothing in the bottle can reach this stream: it is between
the host and the engine.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable

CHUNK = 65536
JOIN_SECONDS = 10.0  # how long ``close`` waits for ``on_end`` to finish (the bottle's removal)
BEAT = b"\n"
BEAT_SECONDS = 1.0
# The gate's --stdin-heartbeat: it stops after this long without a beat, within the seconds invariant 11
# allows, with room for a host whose threads are slow to be scheduled.
SILENCE_SECONDS = 5.0


class Heartbeat:
    """Writes ``BEAT`` on ``stream`` every ``BEAT_SECONDS`` from a daemon thread, from ``start`` until ``stop``
    or a write fails (the stream closed). The gate discards what it reads there after its secrets."""

    def __init__(self, stream: socket.socket) -> None:
        self.stream = stream
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="gate-heartbeat", daemon=True)

    def start(self) -> None:
        """Start beating; call once, after the secrets are written."""
        self._thread.start()

    def _beat(self) -> None:
        while not self._stopped.wait(BEAT_SECONDS):
            try:
                self.stream.sendall(BEAT)
            except OSError:  # closed, or the gate gone: the lifeline's reader says what that means
                return

    def stop(self) -> None:
        """Stop beating (before the stream is closed). Safe to call more than once."""
        self._stopped.set()


class Lifeline:
    """Holds ``stream`` open and reads it to its end in a daemon thread (what the gate writes there after its
    ready line, its audit, is read by the records from the engine's log, not here). ``on_end`` is called once,
    from that thread, when the stream ends before ``close``."""

    def __init__(self, stream: socket.socket, on_end: Callable[[], None]) -> None:
        self.stream = stream
        self.on_end = on_end
        self._ended = threading.Event()
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._follow, name="gate-lifeline", daemon=True)

    def follow(self) -> None:
        """Start reading; call once."""
        self.stream.settimeout(None)
        self._thread.start()

    def _follow(self) -> None:
        with contextlib.suppress(OSError):
            while self.stream.recv(CHUNK):
                pass
        if not self._closing.is_set():
            self._ended.set()
            self.on_end()

    def close(self) -> None:
        """The run ends on purpose: let go of the stream (the gate then stops), after ``on_end`` if it runs.
        Safe to call more than once."""
        self._closing.set()
        if self._thread.is_alive() and self._ended.is_set():
            self._thread.join(JOIN_SECONDS)
        with contextlib.suppress(OSError):
            self.stream.shutdown(socket.SHUT_RDWR)
        self.stream.close()
