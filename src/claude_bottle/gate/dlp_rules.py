"""DLP's rules: the well-known credential formats, configured rules, and the needles of the secrets the gate
holds (every encoding searched for). What a matcher searches for; gate/dlp.py says how and where.
"""

from __future__ import annotations

import base64
import re
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field

from claude_bottle.policy.decide import Decision

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    import sre_parse  # the regex parser's width computation: how long a configured rule's match can be

HELD_SECRET = "held-secret"
MIN_SECRET_BYTES = 16  # shorter values would be found in ordinary traffic by chance
MAX_RULE_WIDTH = 4096  # the longest match a configured rule may have: the scanner keeps a bounded tail
MIN_RULE_WIDTH = 8  # the shortest: fewer bytes would match ordinary traffic
_NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,39}")
MARGIN = 16  # bytes of context kept beyond the longest match, for look-behind and look-ahead
_B64URL = bytes.maketrans(b"+/", b"-_")


class InvalidDlpRule(ValueError):
    """A DLP rule or rule name that cannot be used; the message says how to fix it."""


class DlpMatch(Exception):
    """A request carries what a DLP rule matches: it must not be forwarded (any more). ``reason`` names the
    rule and where it matched, never the matched bytes."""

    def __init__(self, rule: str, where: str, detail: str = "") -> None:
        self.rule, self.where = rule, where
        what = f"a secret the gate holds ({detail})" if rule == HELD_SECRET else "a credential"
        self.reason = f"{what} in the request {where}: DLP rule {rule}"
        super().__init__(self.reason)

    @property
    def decision(self) -> Decision:
        return Decision(False, self.reason, 403, rule=f"[dlp] {self.rule}")


@dataclass(frozen=True)
class DlpRule:
    """A named pattern. ``anchors``: literals of which every match contains at least one, searched first
    (fast) so the regex runs only around them; empty means the regex runs over the whole view. With
    ``fold_case`` (for a pattern that ignores case) the anchors are lower-case and found in any case."""

    name: str
    pattern: re.Pattern[bytes]
    anchors: tuple[bytes, ...] = ()
    fold_case: bool = False
    width: int = field(init=False)  # the longest match

    def __post_init__(self) -> None:
        if self.fold_case and any(anchor != anchor.lower() for anchor in self.anchors):
            raise ValueError(f"DLP rule {self.name}: a case-blind rule's anchors are written in lower case")
        object.__setattr__(self, "width", _widths(self.pattern.pattern)[1])

    def search(self, view: bytes, start: int, final: bool) -> bool:
        """Whether a match begins at or after ``start``. Before the stream ends, a match that reaches the end
        of ``view`` does not count yet: more bytes may show it is not one (a look-ahead, a longer token)."""
        if not self.anchors:
            return self._matches(view, [(start, len(view))], final)
        return self.search_around(view, start, final, self.anchors_in(view))

    def search_around(self, view: bytes, start: int, final: bool, anchors: Sequence[tuple[int, int]]) -> bool:
        """``search``, given where the anchors are in ``view`` (``anchors_in``: the start and end of each
        occurrence, in any order; a matcher that found them otherwise passes the same)."""
        return self._matches(view, self._regions(view, start, anchors), final)

    def anchors_in(self, view: bytes) -> list[tuple[int, int]]:
        """Every occurrence of an anchor (in any case for a case-blind rule), overlapping ones too; once there
        are so many that the regions cover the whole view (``_regions``), no more are looked for."""
        haystack = view.lower() if self.fold_case else view
        reach, found = self.width + MARGIN, []
        for anchor in self.anchors:
            at = haystack.find(anchor)
            while at != -1:
                found.append((at, at + len(anchor)))
                if len(found) * reach > len(view):
                    return found
                at = haystack.find(anchor, at + 1)
        return found

    def _matches(self, view: bytes, regions: list[tuple[int, int]], final: bool) -> bool:
        # A region is searched in place, so look-behind sees the bytes before it.
        return any(final or match.end() < len(view)
                   for low, high in regions for match in self.pattern.finditer(view, low, high))

    def _regions(self, view: bytes, start: int, anchors: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
        """Where a match can be: it holds an anchor and is at most ``width`` long, so it lies within ``width``
        bytes of one, and look-around needs at most ``MARGIN`` more. Overlapping regions are merged, so each
        match lies whole in one. (A word such as "secret" in ordinary text is an anchor: a region, not a
        search of the whole view, is what it costs.)"""
        reach = self.width + MARGIN
        if len(anchors) * reach > len(view):  # anchors everywhere: the whole view is one region
            return [(start, len(view))]
        merged: list[tuple[int, int]] = []
        for low, high in sorted((max(start, at - reach), min(len(view), end + reach)) for at, end in anchors):
            if merged and low <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(merged[-1][1], high))
            elif low < high:
                merged.append((low, high))
        return merged


def _widths(pattern: bytes) -> tuple[int, int]:
    low, high = sre_parse.parse(pattern.decode("latin-1")).getwidth()  # one character per byte
    return int(low), int(high)


def _rule(name: str, pattern: bytes, *anchors: bytes, fold_case: bool = False) -> DlpRule:
    return DlpRule(name, re.compile(pattern), anchors, fold_case)


_ALNUM = rb"A-Za-z0-9"
# Formats as their issuers document them, with boundaries so a longer random string does not match, and
# bounded lengths so the tail stays bounded. A match is enough to refuse: the rule need not see a whole token.
BUILTIN_RULES: tuple[DlpRule, ...] = (
    _rule("anthropic-key", rb"(?<![" + _ALNUM + rb"_-])sk-ant-[a-z]{2,8}[0-9]{2}-[A-Za-z0-9_-]{32,300}", b"sk-ant-"),
    _rule("github-token", rb"(?<![" + _ALNUM + rb"_])(?:gh[pousr]_[" + _ALNUM + rb"]{36,251}|github_pat_[" + _ALNUM
          + rb"_]{50,255})(?![" + _ALNUM + rb"_])", b"ghp_", b"gho_", b"ghu_", b"ghs_", b"ghr_", b"github_pat_"),
    _rule("aws-access-key-id", rb"(?<![A-Z0-9])(?:AKIA|ASIA|ABIA|ACCA)[A-Z2-7]{16}(?![A-Z0-9])",
          b"AKIA", b"ASIA", b"ABIA", b"ACCA"),
    _rule("aws-secret-access-key",
          rb"(?i:secret_?access_?key|aws_?secret(?:_?key)?)[\"']?\s{0,4}[:=]\s{0,4}[\"']?"
          rb"[A-Za-z0-9/+]{40}(?![A-Za-z0-9/+=])", b"secret", fold_case=True),
    _rule("npm-token", rb"(?<![" + _ALNUM + rb"_])npm_[" + _ALNUM + rb"]{36}(?![" + _ALNUM + rb"_])", b"npm_"),
    _rule("pypi-token", rb"pypi-Ag(?:EIcHlwaS5vcmc|ENdGVzdC5weXBpLm9yZw)[A-Za-z0-9_-]{40}",
          b"pypi-AgEIcHlwaS5vcmc", b"pypi-AgENdGVzdC5weXBpLm9yZw"),
    _rule("slack-token", rb"(?<![" + _ALNUM + rb"])xox[abprs]-[0-9]{1,16}-[" + _ALNUM + rb"][" + _ALNUM
          + rb"-]{7,250}", b"xoxa-", b"xoxb-", b"xoxp-", b"xoxr-", b"xoxs-"),
    _rule("slack-webhook", rb"hooks\.slack\.com/(?:services|workflows|triggers)/[A-Za-z0-9+/]{20,200}",
          b"hooks.slack.com/"),
    _rule("google-api-key", rb"(?<![" + _ALNUM + rb"_-])AIza[" + _ALNUM + rb"_-]{35}(?![" + _ALNUM + rb"_-])",
          b"AIza"),
    _rule("private-key", rb"-----BEGIN[ A-Z0-9]{0,40}PRIVATE KEY(?: BLOCK)?-----", b"-----BEGIN"),
    # A JWT: two base64url JSON objects (header, payload: each starts eyJ, for '{"'), each followed by a dot
    # (the signature, possibly empty, comes last). Payloads longer than 3000 characters are not recognised.
    _rule("jwt", rb"(?<![" + _ALNUM + rb"_-])eyJ[A-Za-z0-9_-]{8,600}\.eyJ[A-Za-z0-9_-]{8,3000}\.",
          b"eyJ"),
)
BUILTIN_NAMES = tuple(rule.name for rule in BUILTIN_RULES)


def parse_dlp_rule(name: str, regex: str) -> DlpRule:
    """A configured rule: a name of its own and a Python regular expression matched against bytes, whose
    matches are 8 to 4096 bytes long (write ``{20,64}``, not ``+``). Raises InvalidDlpRule."""
    if not _NAME.fullmatch(name):
        raise InvalidDlpRule(f"rule name {name!r}: use lower-case letters, digits and '-', as in internal-token")
    if name in BUILTIN_NAMES or name == HELD_SECRET:
        raise InvalidDlpRule(f"rule name {name!r} is a built-in rule's; choose another name")
    try:
        pattern = re.compile(regex.encode("utf-8"))
        low, high = _widths(pattern.pattern)
    except (re.error, OverflowError) as exc:
        raise InvalidDlpRule(f"rule {name}: {regex!r} is not a valid regular expression ({exc})") from None
    if high > MAX_RULE_WIDTH:
        raise InvalidDlpRule(f"rule {name}: {regex!r} can match more than {MAX_RULE_WIDTH} bytes; bound every "
                             "repetition, as in [A-Za-z0-9]{20,64} instead of [A-Za-z0-9]+")
    if low < MIN_RULE_WIDTH:
        raise InvalidDlpRule(f"rule {name}: {regex!r} can match fewer than {MIN_RULE_WIDTH} bytes, which ordinary "
                             "traffic is full of; make it more specific, as in tok_[a-z0-9]{32}")
    return DlpRule(name, pattern)


def parse_builtin_name(name: str) -> str:
    if name not in BUILTIN_NAMES:
        hint = " (the gate's own secrets are always refused)" if name == HELD_SECRET else ""
        raise InvalidDlpRule(f"{name!r} is not a built-in DLP rule{hint}; known: {', '.join(BUILTIN_NAMES)}")
    return name


def _base64_cores(secret: bytes) -> list[bytes]:
    """The base64 characters that depend on ``secret`` alone, wherever it starts in the encoded data: for
    each of the three alignments, the characters after those mixed with the bytes before it and before those
    mixed with the bytes after it (so padding, or what follows, does not matter)."""
    cores = []
    for alignment in range(3):
        encoded = base64.b64encode(bytes(alignment) + secret)
        cores.append(encoded[(alignment * 8 + 5) // 6 : (alignment + len(secret)) * 8 // 6])
    return cores


def secret_needles(secrets: Sequence[bytes]) -> tuple[tuple[bytes, str], ...]:
    """Each secret in every encoding searched for, with the encoding's name (for the reason)."""
    needles: dict[bytes, str] = {}
    for secret in secrets:
        if len(secret) < MIN_SECRET_BYTES:
            raise ValueError(f"a held secret must be at least {MIN_SECRET_BYTES} bytes to be matched safely")
        needles.setdefault(secret, "as is")
        needles.setdefault(secret.replace(b" ", b"+"), "form-encoded")
        for core in _base64_cores(secret):
            needles.setdefault(core, "base64")
            needles.setdefault(core.translate(_B64URL), "base64url")
        needles.setdefault(secret.hex().encode(), "hex")
        needles.setdefault(secret.hex().upper().encode(), "hex")
    return tuple(needles.items())
