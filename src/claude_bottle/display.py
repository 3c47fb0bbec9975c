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
import re
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


# What a terminal interface needs, and nothing that reaches past the screen. Claude Code draws with cursor moves,
# colours, modes (the alternate screen, bracketed paste, focus and mouse reports, synchronized output), keyboard
# protocol settings and queries whose answers are fixed (its version, device attributes); it names the window (OSC
# 0-2), links to web pages and files (OSC 8), sets or asks colours (OSC 4, 10-19, 104, 110-119) and shows progress
# (OSC 9;4). Everything else is dropped: the clipboard (OSC 52, iTerm2's 1337), file transfers (kitty's 5113, its
# graphics' APC, which reads a host file by name), device control strings (a tmux passthrough carries any of these to
# the terminal around it; DECRQSS), the window's title or size reported back as typed input (CSI t), printing (CSI
# i), the encoding switched (ESC %: in Latin-1 a character's second byte is a C1 control), the answerback (ENQ) and
# any other control character.
_SPECIAL = re.compile(r"[\x00-\x06\x0b\x0c\x10-\x1f\x7f-\x9f]")
_SEQUENCE = re.compile(
    r"(?:\x1b\[|\x9b)(?P<params>[0-?]*)(?P<inter>[ -/]*)(?P<final>[@-~])"  # CSI
    r"|(?:\x1b\]|\x9d)(?P<osc>[^\x00-\x1f\x7f-\x9f]*)(?P<end>\x07|\x1b\\|\x9c)"  # OSC, its text printable
    r"|\x1b(?P<string>[PX^_])|(?P<c1string>[\x90\x98\x9e\x9f])"  # DCS, SOS, PM, APC: dropped to their end
    r"|\x1b(?P<esc>[ -/]*[0-~])")  # any other escape sequence
_PARTIAL = re.compile(r"(?:\x1b\[|\x9b)[0-?]*[ -/]*|(?:\x1b\]|\x9d)[^\x00-\x1f\x7f-\x9f]*\x1b?|\x1b[ -/]*")
_STRING_END = re.compile(r"\x1b\\?|[\x9c\x18\x1a]")  # ST, CAN, SUB; a lone ESC ends it too (and begins anew)
_OSC_END = re.compile(r"\x1b\\?|[\x07\x9c\x18\x1a]")
_OSC_ALLOWED = frozenset({"0", "1", "2", "4", "8", *map(str, range(10, 20)), "104", *map(str, range(110, 120))})
# A link's target: a web page or a local file, which a click opens in a viewer; never a scheme that makes an
# application act (``vscode://`` runs an extension's command, ``ssh:`` connects) or a file on another host (on
# Windows ``file://host/share`` signs in to that host) behind text the bottle chose.
_LINK_TARGET = re.compile(r"(?i)(?:https?://|file:///|file://localhost/)|$")
_ESC_ALLOWED = re.compile(r"[78=>DEHMNOc]|[()*+][ -/]*[0-~]")
_HELD_AT_MOST = 8192  # characters of an unfinished sequence waiting for its rest; past it, dropped


def interface_sequence(match: re.Match[str]) -> str:
    """What of one parsed sequence reaches the terminal: itself in its 7-bit form if allowed, else nothing."""
    if (final := match["final"]) is not None:
        params, inter = match["params"], match["inter"]
        if final == "i" or (final == "t" and (inter or params.split(";")[0] not in ("22", "23"))):
            return ""
        return f"\x1b[{params}{inter}{final}"
    if (text := match["osc"]) is not None:
        number = text.split(";", 1)[0]
        if number == "8" and not _LINK_TARGET.match(text.split(";", 2)[-1]):
            return ""
        if number in _OSC_ALLOWED or text.startswith("9;4;"):
            return f"\x1b]{text}" + ("\x07" if match["end"] == "\x07" else "\x1b\\")
        return ""
    if (esc := match["esc"]) is not None and _ESC_ALLOWED.fullmatch(esc):
        return f"\x1b{esc}"
    return ""


class TerminalInterface:
    """A bottle's terminal interface (``start``, ``exec``, the drop-in on a terminal) as it reaches the host's
    terminal: text as written, the sequences an interface draws with as written, everything else dropped (see
    above). Bytes in, bytes out (UTF-8; a byte that is not UTF-8 shows as ``\\xNN``); a sequence split between
    two reads waits for its rest."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")("backslashreplace")
        self._held = ""
        self._dropping: re.Pattern[str] | None = None  # within a dropped string: what ends it

    def feed(self, data: bytes, final: bool = False) -> bytes:
        text, self._held = self._held + self._decoder.decode(data, final), ""
        shown: list[str] = []
        at = 0
        while at < len(text):
            if self._dropping is not None:
                end = self._dropping.search(text, at)
                if end is None:
                    break
                if end[0] == "\x1b" and end.end() == len(text) and not final:  # a lone ESC, or ST's first half
                    self._held = "\x1b"
                    break
                self._dropping = None
                at = end.start() if end[0] == "\x1b" else end.end()  # a lone ESC begins what follows
                continue
            special = _SPECIAL.search(text, at)
            if special is None:
                shown.append(text[at:])
                break
            start = special.start()
            shown.append(text[at:start])
            if not final and _PARTIAL.fullmatch(text, start):  # a sequence's beginning: wait for its rest
                if len(text) - start <= _HELD_AT_MOST:
                    self._held = text[start:]
                elif text.startswith(("\x1b]", "\x9d"), start):  # an overlong OSC: dropped to its end
                    self._dropping = _OSC_END
                break
            match = _SEQUENCE.match(text, start)
            if match is None:  # a control character alone, or the first of a broken sequence: dropped
                at = start + 1
            elif match["string"] or match["c1string"]:
                self._dropping, at = _STRING_END, match.end()
            else:
                shown.append(interface_sequence(match))
                at = match.end()
        return "".join(shown).encode("utf-8", "backslashreplace")
