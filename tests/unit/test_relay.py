"""The relay between the user's terminal and the engine's client's, on real pseudo-terminals: a program
stands in for the engine's client (what it writes is the bottle's)."""

from __future__ import annotations

import fcntl
import os
import pty
import select
import struct
import subprocess
import sys
import termios
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"

# The stand-in: its terminal's size, a clipboard write among its text, a line it reads, the resizes it is told
# of, and an exit code of its own once a last line is typed. It waits for a line in a loop that wakes, as a
# terminal program's event loop does: in input(), a SIGWINCH that arrives just before the read begins is
# handled only once a line comes.
CLIENT = r"""
import os, select, signal, sys
signal.signal(signal.SIGWINCH, lambda *_: print("resized to %dx%d" % os.get_terminal_size()[::-1], flush=True))
def line():
    typed = b""
    while not typed.endswith(b"\n"):
        if select.select([0], [], [], 0.2)[0]:
            typed += os.read(0, 1024)
    return typed.decode().strip()
print("size %dx%d" % os.get_terminal_size()[::-1], flush=True)
sys.stdout.write("before \x1b]52;c;cHduZWQ=\x07\x1b[1mafter\x1b[0m\n"); sys.stdout.flush()
print("got", line(), flush=True)
line()
sys.exit(7)
"""

RELAY = """
import sys
from claude_bottle.relay import TerminalRelay
with TerminalRelay(sys.argv[1:]) as relay:
    sys.exit(relay.wait())
"""


def on_terminal(leader: int, until: bytes, seconds: float = 20) -> bytes:
    seen, deadline = b"", time.monotonic() + seconds
    while until not in seen and time.monotonic() < deadline:
        if select.select([leader], [], [], 0.5)[0]:
            try:
                seen += os.read(leader, 65536)
            except OSError:
                break
    assert until in seen, seen
    return seen


def set_size(fd: int, rows: int, columns: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))


@pytest.fixture
def user_terminal() -> Iterator[tuple[int, int]]:
    leader, follower = pty.openpty()
    set_size(follower, 40, 140)
    yield leader, follower
    os.close(leader)
    os.close(follower)


def test_keys_go_in_as_typed_the_screen_comes_back_without_the_clipboard_and_the_terminal_is_restored(
        user_terminal: tuple[int, int]) -> None:
    leader, follower = user_terminal
    cooked = termios.tcgetattr(follower)

    def own_terminal() -> None:
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    cli = subprocess.Popen([sys.executable, "-c", RELAY, sys.executable, "-c", CLIENT], stdin=follower,
                           stdout=follower, stderr=follower, env={**os.environ, "PYTHONPATH": str(SRC)},
                           start_new_session=True, preexec_fn=own_terminal)
    try:
        shown = on_terminal(leader, b"after")
        assert b"size 40x140" in shown
        assert b"before \x1b[1mafter" in shown and b"52;" not in shown
        assert termios.tcgetattr(follower)[3] & termios.ECHO == 0, "the user's terminal is not raw"
        os.write(leader, b"hello\r")
        assert b"got hello" in on_terminal(leader, b"got hello")
        set_size(follower, 50, 100)  # the window resized: the kernel tells the relay, the relay the stand-in
        on_terminal(leader, b"resized to 50x100")
        os.write(leader, b"\r")
        assert cli.wait(20) == 7
    finally:
        if cli.poll() is None:
            cli.kill()
            cli.wait()
    assert termios.tcgetattr(follower) == cooked
