"""The multi-pattern matcher: every held secret's needles, every rule's anchors and every configured rule without
anchors in one Hyperscan database (the Vectorscan engine), found in one pass over a view; each candidate is
then confirmed by the rule's own regex exactly as the reference does (gate/dlp_reference.py), so the outcome,
look-arounds and case rules included, is the reference's.

Why this is the reference's outcome: a needle is found by the database wherever ``needle in view`` is true; a
rule with anchors can match only where one of its anchors is (the reference searches only around them), and
the database reports every occurrence of every anchor, in any case for a case-blind rule, and the rule's regex
then runs in the very regions the reference would search (``DlpRule.search_around``); a configured rule
without anchors is compiled as a prefilter (its look-arounds and boundaries dropped, so it matches at least
wherever the rule does) and, where it matches, searched by ``DlpRule.search`` as the reference does. A
configured rule the engine cannot compile (a back-reference, a pattern too large) is searched by the
reference's ``DlpRule.search`` on every view.

The database is compiled once, at gate start, in block mode: the streaming scanner (gate/dlp_scanner.py)
already hands each window whole. The callback is a module function, referenced for every scan. Scratch space
is per thread: a scan never awaits, so scans at the same time can only be in different threads. ``scan`` is
called with its arguments by position (data, callback, flags, context, scratch): the binding's parse of
keywords costs about as much as a scan of a request head.
"""

from __future__ import annotations

import re
import threading
import warnings
from collections.abc import Sequence
from typing import Any

import hyperscan

from claude_bottle.gate.decode import VIEWS, View
from claude_bottle.gate.dlp_rules import HELD_SECRET, DlpMatch, DlpRule
from claude_bottle.gate.dlp_scanner import DlpMatcher

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    import sre_parse  # the configured rules' syntax trees, translated for the engine

_ONCE = hyperscan.HS_FLAG_SINGLEMATCH  # one report: where a needle or prefilter matches does not matter


class HyperscanMatcher(DlpMatcher):
    engine = "Hyperscan (one pass over every rule and held secret)"

    def __init__(self, rules: Sequence[DlpRule], needles: Sequence[tuple[bytes, str]],
                 views: Sequence[View] = VIEWS) -> None:
        super().__init__(rules, needles, views)
        expressions: list[bytes] = []
        flags: list[int] = []
        # What each expression's id stands for: a needle (its index), or a rule's anchor (the rule's index and
        # the anchor's length: every occurrence is reported, for the regions) or prefilter (length 0).
        self._rule_of: list[tuple[int, int]] = []
        for needle, _ in self.needles:
            expressions.append(_literal(needle))
            flags.append(_ONCE)  # that it occurs is all the outcome needs
        searched_always: list[int] = []
        for index, rule in enumerate(self.rules):
            if rule.anchors:
                for anchor in rule.anchors:
                    expressions.append(_literal(anchor))
                    flags.append(hyperscan.HS_FLAG_CASELESS if rule.fold_case else 0)
                    self._rule_of.append((index, len(anchor)))
            elif (prefilter := compilable_prefilter(rule.pattern)) is not None:
                expressions.append(prefilter)
                flags.append(hyperscan.HS_FLAG_PREFILTER | _ONCE)
                self._rule_of.append((index, 0))
            else:
                searched_always.append(index)
        for index, view in enumerate(self.views):  # where a view has something to decode, as a rule of its own
            for marker in view.markers:
                expressions.append(marker)
                flags.append(_ONCE)
                self._rule_of.append((-1 - index, 0))
        self._unmarked = tuple(view for view in self.views if not view.markers)
        self._always = tuple(searched_always)
        self.uncompiled = tuple(self.rules[i].name for i in searched_always)
        self._database: hyperscan.Database | None = None
        if expressions:
            self._database = hyperscan.Database(mode=hyperscan.HS_MODE_BLOCK)
            self._database.compile(expressions=expressions, ids=list(range(len(expressions))),
                                   elements=len(expressions), flags=flags)
        self._local = threading.local()

    def search(self, view: bytes, where: str, start: int, final: bool) -> Sequence[View]:
        hits: list[tuple[int, int]] = []  # (expression id, where its match ends)
        if self._database is not None:
            self._database.scan(view, _found, 0, hits, self._scratch())
        if not hits and not self._always:
            return self._unmarked
        needles = len(self.needles)
        if (first := min((id_ for id_, _ in hits), default=needles)) < needles:
            raise DlpMatch(HELD_SECRET, where, self.needles[first][1])  # the first needle, as the reference
        anchors: dict[int, list[tuple[int, int]]] = {}
        marked: set[int] = set()
        for id_, end in hits:
            index, length = self._rule_of[id_ - needles]
            if index < 0:
                marked.add(-1 - index)
            else:
                anchors.setdefault(index, []).append((end - length, end))
        for index, rule in enumerate(self.rules):
            if index in anchors:
                found = (rule.search_around(view, start, final, anchors[index]) if rule.anchors
                         else rule.search(view, start, final))
            elif index in self._always:
                found = rule.search(view, start, final)
            else:
                continue
            if found:
                raise DlpMatch(rule.name, where)
        return [view for index, view in enumerate(self.views) if index in marked or not view.markers]

    def clean(self, data: bytes) -> bool:
        """No needle, anchor, prefilter or view marker anywhere in ``data``, and no rule searched apart or view
        without markers: then ``search`` finds nothing in any run of bytes within it, as every expression
        (literals, and prefilters and markers without assertions) that occurs in a part occurs in the whole."""
        if self._always or self._unmarked:
            return False
        if self._database is None:
            return True
        hits: list[tuple[int, int]] = []
        self._database.scan(data, _found, 0, hits, self._scratch())
        return not hits

    def _scratch(self) -> hyperscan.Scratch:
        scratch: hyperscan.Scratch | None = getattr(self._local, "scratch", None)
        if scratch is None:
            scratch = self._local.scratch = hyperscan.Scratch(self._database)
        return scratch


def _found(id_: int, _from: int, to: int, _flags: int, hits: Any) -> None:
    """The match callback: a module function, referenced for as long as the module is (every scan)."""
    hits.append((id_, to))


def _literal(data: bytes) -> bytes:
    """A pattern matching ``data`` byte for byte."""
    return b"".join(b"\\x%02x" % byte for byte in data)


def compilable_prefilter(pattern: re.Pattern[bytes]) -> bytes | None:
    """``prefilter_expression(pattern)`` if the engine compiles it alone, else None (the rule is then searched by
    the reference on every view)."""
    expression = prefilter_expression(pattern)
    if expression is None:
        return None
    try:
        hyperscan.Database(mode=hyperscan.HS_MODE_BLOCK).compile(
            expressions=[expression], flags=[hyperscan.HS_FLAG_PREFILTER | _ONCE])
    except hyperscan.error:
        return None
    return expression


# The character classes of a bytes pattern (ASCII only), spelled out so no engine's own reading of \d, \s, \w
# comes in; a negated one outside a class becomes [^...].
_CATEGORIES = {"CATEGORY_DIGIT": b"0-9", "CATEGORY_SPACE": b"\\x09-\\x0d\\x20", "CATEGORY_WORD": b"0-9A-Za-z_"}


def prefilter_expression(pattern: re.Pattern[bytes]) -> bytes | None:
    """An expression for the engine that matches, with the same end, wherever ``pattern`` matches (and maybe
    elsewhere too): the pattern's syntax tree written out again in plain syntax, with every zero-width assertion
    (``^``, ``$``, ``\\b``, look-ahead and look-behind) dropped. None for what has no such spelling here
    (a back-reference, a conditional group, an unknown node)."""
    try:
        tree = sre_parse.parse(pattern.pattern.decode("latin-1"), pattern.flags)
        body = _sequence(tree.data, dotall=bool(pattern.flags & re.DOTALL))
    except _Untranslatable:
        return None
    return b"(?i)" + body if pattern.flags & re.IGNORECASE else body


class _Untranslatable(Exception):
    pass


def _sequence(items: Sequence[tuple[Any, Any]], dotall: bool) -> bytes:
    return b"".join(_node(op, arg, dotall) for op, arg in items)


def _node(op: Any, arg: Any, dotall: bool) -> bytes:
    name = str(op)
    if name == "LITERAL":
        return b"\\x%02x" % arg
    if name == "NOT_LITERAL":
        return b"[^\\x%02x]" % arg
    if name == "ANY":
        return b"[\\x00-\\xff]" if dotall else b"[^\\x0a]"
    if name == "IN":
        return _class(arg)
    if name == "CATEGORY":
        return _category(str(arg))
    if name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"):
        low, high, item = arg
        bound = b"{%d,}" % low if high == sre_parse.MAXREPEAT else b"{%d,%d}" % (low, high)
        return b"(?:" + _sequence(item.data, dotall) + b")" + bound
    if name == "SUBPATTERN":
        _group, add_flags, del_flags, item = arg
        dotall = bool((dotall or add_flags & re.DOTALL) and not del_flags & re.DOTALL)
        modes = (b"i" if add_flags & re.IGNORECASE else b"") + (b"-i" if del_flags & re.IGNORECASE else b"")
        return b"(?" + modes + b":" + _sequence(item.data, dotall) + b")"
    if name == "ATOMIC_GROUP":
        return b"(?:" + _sequence(arg.data, dotall) + b")"
    if name == "BRANCH":
        return b"(?:" + b"|".join(_sequence(alt.data, dotall) for alt in arg[1]) + b")"
    if name in ("AT", "ASSERT", "ASSERT_NOT"):
        return b""  # an assertion only narrows where the rule matches: dropped, the prefilter finds more
    raise _Untranslatable(name)


def _category(name: str) -> bytes:
    negated = "_NOT_" in name
    spelled = _CATEGORIES.get(name.replace("_NOT_", "_"))
    if spelled is None:
        raise _Untranslatable(name)
    return b"[" + (b"^" if negated else b"") + spelled + b"]"


def _class(items: Sequence[tuple[Any, Any]]) -> bytes:
    parts, negate = [], False
    for op, arg in items:
        name = str(op)
        if name == "NEGATE":
            negate = True
        elif name == "LITERAL":
            parts.append(b"\\x%02x" % arg)
        elif name == "RANGE":
            parts.append(b"\\x%02x-\\x%02x" % arg)
        elif name == "CATEGORY" and "_NOT_" not in str(arg) and str(arg) in _CATEGORIES:
            parts.append(_CATEGORIES[str(arg)])
        else:
            raise _Untranslatable(name)  # a negated class inside a class: the reference searches this rule
    return b"[" + (b"^" if negate else b"") + b"".join(parts) + b"]"


def hyperscan_matcher(rules: Sequence[DlpRule], needles: Sequence[tuple[bytes, str]]) -> DlpMatcher | None:
    """The matcher, or None where the engine cannot run (a processor it does not support)."""
    try:
        return HyperscanMatcher(rules, needles)
    except hyperscan.error:
        return None
