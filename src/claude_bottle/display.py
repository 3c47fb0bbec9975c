"""Text a bottle chose, shown on the host's terminal: the hosts, paths and reasons the gate audited and asks
about, the names of files a bottle changed in the workspace, a project file's text, and what a bottle writes
on its standard output and error when they are a terminal (``TerminalText``).

Shown as it is, such text could move the cursor, clear the screen, set the title or the clipboard, or forge
lines: a newline in a file's name starts what looks like another entry of the list around it. So every
control character is shown as its escape (``\\x1b``, ``\\n``, ``\\u202e``), and only a block of text that is a
file's own keeps its newlines and tabs.
"""

from __future__ import annotations

import codecs
import unicodedata

# In prose, what a terminal draws as spacing or joins, and never obeys: the spaces of other scripts (U+3000 in
# Japanese and Chinese, U+00A0, U+202F) and the joiners that Persian, the Indic scripts and emoji sequences
# need (U+200C, U+200D). A bidi override (U+202E) or a tag character stays escaped.
_JOINERS = frozenset("\u200c\u200d")


def printable(text: str, limit: int | None = None) -> str:
    """``text`` as one line: every character that is not printable (newline and tab included) shown as its
    escape; at most ``limit`` characters."""
    shown = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    return shown if limit is None else shown[:limit]


def printable_lines(text: str) -> str:
    """``text`` as lines (a file's text): newlines and tabs kept, every other control character escaped."""
    return "\n".join("\t".join(map(printable, line.split("\t"))) for line in text.split("\n"))


def _prose(c: str) -> str:
    """``c`` as a bottle's prose shows it on a terminal."""
    if c.isprintable() or c == "\n" or c == "\t" or c in _JOINERS or unicodedata.category(c) == "Zs":
        return c
    return repr(c)[1:-1]


class TerminalText:
    """A bottle's output stream, shown on a terminal: bytes decoded as UTF-8 as they come (a character split
    between two reads waits for its rest; a byte that is not UTF-8 shows as ``\\xNN``); newlines, tabs, every
    script's spaces and the joiners kept (``_prose``), every other control character shown as its escape. So a
    hijacked agent writing to the stream cannot set the clipboard, the title or the cursor, or have the
    terminal answer a query into what reads it next (the host's shell, once the run ends)."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")("backslashreplace")

    def feed(self, data: bytes, final: bool = False) -> str:
        text = self._decoder.decode(data, final)
        return text if text.isprintable() else "".join(map(_prose, text))
