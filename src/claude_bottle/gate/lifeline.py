"""The stream a gate was started on as its lifeline: the host holds it open while the run lives, so its end
says the process that started the run is gone (even killed outright: the kernel closes its end, and the
engine then the gate's standard input). Where the engine keeps that input open after its client is gone
(Podman's Docker-compatible API), the host also writes a beat on it every second (runtime/lifeline.py), and
silence says the same as the end."""

from __future__ import annotations

import os
import select
import threading
from collections.abc import Callable

CHUNK = 4096


def watch(fd: int, closed: Callable[[], None], silence: float = 0.0) -> threading.Thread:
    """Read ``fd`` in a daemon thread, discarding what comes, until its end, a read error, or (``silence``
    above 0) nothing for ``silence`` seconds; then call ``closed`` once (from that thread). The host writes
    nothing after the secrets but beats; whatever comes, it only keeps the gate while it keeps coming."""

    def read_to_end() -> None:
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        try:
            while not silence or poller.poll(silence * 1000):
                if not os.read(fd, CHUNK):
                    break
        except OSError:
            pass
        closed()

    thread = threading.Thread(target=read_to_end, name="lifeline", daemon=True)
    thread.start()
    return thread
