"""Text a bottle chose, as the host's terminal shows it."""

from __future__ import annotations

import io
import os

from claude_bottle.display import TerminalText, printable, printable_lines
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
