"""The engine's client on a terminal of this process's own, between it and the user's terminal.

A bottle on a terminal (``start``, ``exec``, the drop-in) draws its interface with control sequences, and a
hijacked agent can write its own to the same terminal (``/proc/PID/fd/1`` of Claude Code). Handed the user's
terminal, the engine's client would pass them all on. So the client gets a pseudo-terminal instead, sized as
the user's and resized with it, and what it writes reaches the user's terminal through
``display.TerminalInterface``: the sequences an interface draws with, nothing that reaches past the screen
(the clipboard, files, answers typed back into the host's shell). Keys go the other way as typed, with the
user's terminal in raw mode for the run (so Ctrl-C is a key Claude Code reads) and restored at its end.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import select
import signal
import subprocess
import sys
import termios
import time
import tty
from types import FrameType, TracebackType

from claude_bottle.display import TerminalInterface

READ_BYTES = 65536
LAST_OUTPUT_SECONDS = 5  # for what the client wrote last to arrive once it has exited


def _own_terminal() -> None:
    """(In the client, after its new session began) its pseudo-terminal becomes its controlling terminal: the
    kernel sends it SIGWINCH when the size changes."""
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


class TerminalRelay:
    """``command`` (the engine's client attaching to a bottle) on a pseudo-terminal this process relays to
    and from its own (standard output a terminal; keys relayed while standard input is one too). Used as a
    context manager: the client starts on entry; ``wait`` relays until it exits; on exit the client is
    killed if still running and the user's terminal restored."""

    def __init__(self, command: list[str]) -> None:
        self.command = command
        self.shown = TerminalInterface()
        self._keys = sys.stdin.fileno() if sys.stdin.isatty() else None
        self._screen = sys.stdout.fileno()
        self._saved: list[object] | None = None
        self._previous_winch: object = None

    def __enter__(self) -> TerminalRelay:
        self.leader, follower = os.openpty()
        try:
            self._resize()
            self.client = subprocess.Popen(self.command, stdin=follower, stdout=follower, stderr=follower,
                                           start_new_session=True, preexec_fn=_own_terminal)
        except BaseException:
            os.close(self.leader)
            raise
        finally:
            os.close(follower)
        self._previous_winch = signal.signal(signal.SIGWINCH, self._resized)
        if self._keys is not None:
            self._saved = termios.tcgetattr(self._keys)
            tty.setraw(self._keys, termios.TCSANOW)
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        try:
            if self.client.poll() is None:
                self.client.kill()
                self.client.wait()
        finally:
            if self._saved is not None:
                # Discards what the terminal typed meanwhile and nobody read: nothing of it reaches the shell.
                with _gone_terminal():
                    termios.tcsetattr(self._keys, termios.TCSAFLUSH, self._saved)  # type: ignore[arg-type]
            signal.signal(signal.SIGWINCH, self._previous_winch)  # type: ignore[arg-type]
            os.close(self.leader)

    def wait(self) -> int:
        """Relay until the client has exited and its last output is shown; its exit code."""
        keys = b""  # typed, not yet taken by the client's terminal
        readers = [self.leader] if self._keys is None else [self.leader, self._keys]
        quiet_since: float | None = None
        while True:
            ready, writable, _ = select.select(readers, [self.leader] if keys else [], [], 0.5)
            if self.leader in ready:
                try:
                    data = os.read(self.leader, READ_BYTES)
                except OSError:  # EIO: the client's end is closed
                    data = b""
                if not data:
                    self._show(self.shown.feed(b"", final=True))
                    return self.client.wait()
                self._show(self.shown.feed(data))
            if self._keys is not None and self._keys in ready:
                typed = os.read(self._keys, READ_BYTES)
                if typed:
                    keys += typed
                else:
                    readers.remove(self._keys)
            if writable and keys:
                keys = keys[os.write(self.leader, keys):]
            if ready or writable or self.client.poll() is None:
                quiet_since = None
                continue
            # Exited, with its terminal still open: a process it left holds it. What it wrote is shown.
            now = time.monotonic()
            quiet_since = quiet_since or now
            if now - quiet_since > LAST_OUTPUT_SECONDS:
                self._show(self.shown.feed(b"", final=True))
                return self.client.returncode

    def _show(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(self._screen, view):]

    def _resized(self, signum: int, frame: FrameType | None) -> None:
        self._resize()

    def _resize(self) -> None:
        """The client's terminal takes the size of the user's (the kernel tells the client)."""
        with _gone_terminal():
            size = fcntl.ioctl(self._screen, termios.TIOCGWINSZ, b"\0" * 8)
            fcntl.ioctl(self.leader, termios.TIOCSWINSZ, size)


def _gone_terminal() -> contextlib.suppress:
    """Ignores the failure of a call on a terminal that has gone away (a closed window, a hung-up line)."""
    return contextlib.suppress(OSError, termios.error)
