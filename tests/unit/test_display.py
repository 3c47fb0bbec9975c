"""Text a bottle chose, as the host's terminal shows it."""

from __future__ import annotations

import io
import os

import pytest

from claude_bottle.display import TerminalInterface, TerminalText, printable, printable_lines
from claude_bottle.launch import shown_on


def test_one_line_shows_every_control_character_as_its_escape() -> None:
    assert printable("a\x1b[2Jb\n\tc\x07\u202ed") == "a\\x1b[2Jb\\n\\tc\\x07\\u202ed"
    assert printable("a\x1b[2J", 3) == "a\\x"


def test_a_file_s_text_keeps_its_lines_and_tabs_only() -> None:
    assert printable_lines("a\x1b[2Jb\n\tc\x07\r\n") == "a\\x1b[2Jb\n\tc\\x07\\r\n"


def test_a_stream_is_shown_as_lines_whatever_its_reads() -> None:
    """An OSC 52 clipboard write, a C1 CSI (U+009B) and a byte that is not UTF-8 are shown, not obeyed; a
    character split between two reads is whole."""
    written = "é\x1b]52;c;cHduZWQ=\x07\u009b2J\tok\n".encode() + b"\xff"
    for cut in range(len(written) + 1):
        shown = TerminalText()
        assert shown.feed(written[:cut]) + shown.feed(written[cut:], final=True) == \
            "é\\x1b]52;c;cHduZWQ=\\x07\\x9b2J\tok\n\\xff"


def test_a_pipe_is_copied_to_the_terminal_as_it_comes_until_its_end() -> None:
    read, write = os.pipe()
    terminal = io.TextIOWrapper(io.BytesIO(), encoding="utf-8")
    copy = shown_on(os.fdopen(read, "rb"), terminal)
    os.write(write, "Tool said: \x1b[2Jok \xe2".encode("latin-1"))
    os.write(write, b"\x82\xac\n")  # the rest of a euro sign
    os.close(write)
    copy.join(5)
    assert not copy.is_alive()
    assert terminal.buffer.getvalue() == "Tool said: \\x1b[2Jok €\n".encode()  # type: ignore[attr-defined]


def test_prose_keeps_every_script_s_spaces_and_the_joiners() -> None:
    """Japanese text's ideographic space, a no-break space, Persian's zero-width non-joiner and an emoji's
    zero-width joiner are drawn, not obeyed: shown as written. A bidi override and a tag character are not."""
    prose = "東京\u3000大阪 10\u00a0MB \u0645\u06cc\u200c\u062e\u0648\u0627\u0647\u0645 👨\u200d👩\u200d👧\n"
    assert TerminalText().feed(prose.encode(), final=True) == prose
    assert TerminalText().feed("a\u202eb\U000e0041\u2028".encode(), final=True) == "a\\u202eb\\U000e0041\\u2028"


# Claude Code 2.1's first screen and its exit, as written to its terminal (shortened).
INTERFACE = (b"\x1b7\x1b[r\x1b8\x1b[?25h\x1b[?25l\x1b[?2004h\x1b[?1004h\x1b[?2031h\x1b[31mWelcome\x1b[9Gto\x1b[12G"
             b"Claude\x1b[39m\r\r\n\x1b[6G*\x1b[46G\xe2\x96\x88\xe2\x96\x93\r\r\n\x1b]0;\xe2\x9c\xb3 Claude Code\x07"
             b"\x1b]8;;file:///workspace/a.py\x1b\\a.py\x1b]8;;\x1b\\\x1b]11;?\x07\x1b]9;4;3;\x07\x1b[22;0t"
             b"\x1b[?2026h\x1b[2K\x1b[1A\x1b[G\x1b[?2026l\x1b[>1u\x1b[>0q\x1b[c\x1b[?25h\x1b[?1006l\x1b[?1003l"
             b"\x1b(B\x0f\x1b[>4m\x1b[<u\x1b[?1004l\x1b[?2031l\x1b[?2004l\x1b[23;0t\x1b[?25h\x07")


def test_an_interface_s_sequences_reach_the_terminal_as_written_whatever_its_reads() -> None:
    assert TerminalInterface().feed(INTERFACE, final=True) == INTERFACE
    for cut in range(len(INTERFACE) + 1):
        shown = TerminalInterface()
        assert shown.feed(INTERFACE[:cut]) + shown.feed(INTERFACE[cut:], final=True) == INTERFACE


@pytest.mark.parametrize("attack", [
    b"\x1b]52;c;cHduZWQ=\x07",  # the clipboard written
    b"\x1b]52;c;?\x1b\\",  # the clipboard read, as typed input
    b"\xc2\x9d52;c;cHduZWQ=\xc2\x9c",  # the same in C1 controls
    b"\x1b]1337;File=name=eA==;inline=0:cHduZWQ=\x07",  # iTerm2: a file to the host's disk
    b"\x1b]1337;SetUserVar=a=Yg==\x07",
    b"\x1b]5113;ac=send;id=1\x1b\\",  # kitty: a file transfer
    b"\x1b_Ga=T,t=f;L2V0Yy9wYXNzd2Q=\x1b\\",  # kitty graphics: a host file read by name
    b"\x1bPtmux;\x1b\x1b]52;c;cHduZWQ=\x07\x1b\\",  # a passthrough to the terminal around tmux
    b"\x1bP$qm\x1b\\",  # DECRQSS
    b"\xc2\x90$qm\xc2\x9c",
    b"\x1b[21t",  # the title, as typed input
    b"\x1b[8;200;200t",  # the window resized
    b"\x1b[5i",  # the printer
    b"\x1b%@",  # Latin-1: a character's second byte becomes a C1 control
    b"\x05",  # the answerback
    b"\x1bX" + b"x" * 10000 + b"\x1b\\",  # SOS
    b"\x1b]7;file://host/etc\x07",  # a working directory for the next tab
    b"\x1b]777;notify;a;b\x07",
    b"\x1b]8;;vscode://vscode.git/clone?url=x\x1b\\",  # a link that makes an application act
    b"\x1b]8;id=1;ssh://host\x07",
    b"\x1b]8;;file://host/share\x07",  # a file on another host (Windows signs in to it)
])
def test_what_reaches_past_the_screen_is_dropped_whatever_its_reads(attack: bytes) -> None:
    written = b"before " + attack + b" after\r\n"
    for cut in range(0, len(written) + 1, 1 if len(written) < 200 else 97):
        shown = TerminalInterface()
        assert shown.feed(written[:cut]) + shown.feed(written[cut:], final=True) == b"before  after\r\n", cut


def test_a_broken_or_overlong_sequence_shows_nothing_that_a_terminal_would_obey() -> None:
    shown = TerminalInterface()
    assert shown.feed(b"a\x1b]52;c;cHdu\nZWQ=\x07b\xc2\x9b2Jc\xff") == b"a52;c;cHdu\nZWQ=\x07b\x1b[2Jc\\xff"
    overlong = b"\x1b]52;c;" + b"A" * 20000
    shown = TerminalInterface()
    assert shown.feed(overlong[:9000]) + shown.feed(overlong[9000:]) + shown.feed(b"\x07next", final=True) == b"next"
    assert TerminalInterface().feed(b"a\x1b[12", final=True) == b"a12"
