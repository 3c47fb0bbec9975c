"""Text a bottle chose, as the host's terminal shows it."""

from __future__ import annotations

from claude_bottle.display import printable, printable_lines


def test_one_line_shows_every_control_character_as_its_escape() -> None:
    assert printable("a\x1b[2Jb\n\tc\x07\u202ed") == "a\\x1b[2Jb\\n\\tc\\x07\\u202ed"
    assert printable("a\x1b[2J", 3) == "a\\x"


def test_a_file_s_text_keeps_its_lines_and_tabs_only() -> None:
    assert printable_lines("a\x1b[2Jb\n\tc\x07\r\n") == "a\\x1b[2Jb\n\tc\\x07\\r\n"
