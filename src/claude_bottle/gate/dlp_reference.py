"""The standard library's matcher: one ``bytes.find`` per literal, each rule's regex around its anchors. The
reference every other engine must agree with (tests/unit/test_dlp_engines.py), and the gate's matcher where
the multi-pattern engine cannot be imported or cannot compile a rule.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from claude_bottle.gate.decode import VIEWS, View
from claude_bottle.gate.dlp_rules import HELD_SECRET, DlpMatch, DlpRule
from claude_bottle.gate.dlp_scanner import DlpMatcher

# Up to this size a view is first searched for every literal at once: measured on Claude Code's traffic, one
# alternation costs ~1.5 us plus ~17 ns a byte, one search per literal ~6 us plus ~6 ns a byte.
_SMALL_VIEW = 512


class ReferenceMatcher(DlpMatcher):
    """A small view (a URL, a head, a short body) usually holds none of the literals (the needles, and the
    anchors of the rules that have them), and then only a rule without anchors can match. For such a view
    ``search`` first looks for every literal at once, with one regular expression, instead of one search per
    literal and a Python call per rule; only where one occurs does it go through needles and rules one by
    one. On a large view the alternation costs more per byte than one search per literal, so those go through
    one by one from the start. Either way the outcome, and which needle or rule a match names, are the same.
    """

    engine = "the standard library (one search per literal)"

    def __init__(self, rules: Sequence[DlpRule], needles: Sequence[tuple[bytes, str]],
                 views: Sequence[View] = VIEWS) -> None:
        super().__init__(rules, needles, views)
        literals = dict.fromkeys([n for n, _ in needles]
                                 + [a for rule in rules if not rule.fold_case for a in rule.anchors])
        self._any_literal = re.compile(b"|".join(map(re.escape, literals))) if literals else None
        # Searched for in the case-folded view: a case-blind group would slow the whole alternation down.
        folded = dict.fromkeys(a for rule in rules if rule.fold_case for a in rule.anchors)
        self._any_folded = re.compile(b"|".join(map(re.escape, folded))) if folded else None
        self._unanchored = tuple(rule for rule in rules if not rule.anchors)
        markers = [marker for view in self.views for marker in view.markers]
        self._any_marker = re.compile(b"|".join(markers)) if markers else None
        self._unmarked = any(not view.markers for view in self.views)

    def clean(self, data: bytes) -> bool:
        """No literal (needle or anchor) and no view's marker anywhere in ``data``, and every rule anchored, every
        view marked: then no part of it holds a needle, a rule's match (a rule matches only at an anchor) or
        anything a view decodes."""
        if self._unanchored or self._unmarked:
            return False
        return not ((self._any_literal is not None and self._any_literal.search(data))
                    or (self._any_folded is not None and self._any_folded.search(data.lower()))
                    or (self._any_marker is not None and self._any_marker.search(data)))

    def search(self, view: bytes, where: str, start: int, final: bool) -> Sequence[View]:
        if (len(view) > _SMALL_VIEW or (self._any_literal is not None and self._any_literal.search(view))
                or (self._any_folded is not None and self._any_folded.search(view.lower()))):
            for needle, encoding in self.needles:
                if needle in view:
                    raise DlpMatch(HELD_SECRET, where, encoding)
            rules = self.rules
        else:
            rules = self._unanchored  # no needle, no anchor: no other rule can match
        for rule in rules:
            if rule.search(view, start, final):
                raise DlpMatch(rule.name, where)
        return self.views  # each view's own test is cheaper than one for its markers here


