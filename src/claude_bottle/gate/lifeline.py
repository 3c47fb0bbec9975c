"""The stream a gate was started on as its lifeline: the host holds it open while the run lives, so its end
says the process that started the run is gone (even killed outright: the kernel closes its end, and the
engine then the gate's standard input)."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

CHUNK = 4096


def watch(fd: int, closed: Callable[[], None]) -> threading.Thread:
    """Read ``fd`` in a daemon thread, discarding what comes, until its end or a read error; then call
    ``closed`` once (from that thread). The host writes nothing more after the secrets; whatever it is, it
    does not keep the gate: only the stream's end counts."""

    def read_to_end() -> None:
        try:
            while os.read(fd, CHUNK):
                pass
        except OSError:
            pass
        closed()

    thread = threading.Thread(target=read_to_end, name="lifeline", daemon=True)
    thread.start()
    return thread
