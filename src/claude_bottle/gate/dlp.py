"""Data-loss prevention for the requests the gate can see: no held secret and no known credential format
goes out, in the URL, a header or the body, even split across body chunks.

What is matched (also in docs/inspection.md):
- Every secret the gate holds, as is, in base64 (each of the three alignments, standard and URL-safe
  alphabets, padded or not: the characters that depend on the secret alone), in hex (lower and upper case),
  with ``+`` for a space, and percent-encoded in any mix of escaped and plain bytes, in either case (each
  window with a real escape is also searched once its escapes are decoded). Rule ``held-secret``; it cannot
  be turned off.
- Well-known credential formats (``BUILTIN_RULES``), each a named rule that ``[dlp] disable`` can turn off,
  and extra named rules from the config; these are searched in the bytes as sent and, where the window has
  a ``%XX`` escape, in its decoded form too.

Where things are: the rules and the secrets' encodings in gate/dlp_rules.py, the decoded views in
gate/decode.py, the streaming scan of a request (a body is never held whole, no prefix of a match leaves before
the match is seen) in gate/dlp_scanner.py, the engines that find matches in gate/dlp_hyperscan.py (one pass
over everything) and gate/dlp_reference.py (the standard library's: the fallback, and the reference the other
must agree with). This module is the policy: which rules apply, from flags or an agent's ``[dlp]``, and the
matcher the gate prepares once from them.

Limits: encrypted bodies and compressed payloads (git packs, tarballs) are scanned as they are, not
unpacked (a body's ``Content-Encoding`` gzip or deflate is undone: gate/inspection.py, gate/decode.py);
a secret cut into pieces across requests, or encoded otherwise (reversed, other alphabets, base64 with line
breaks) is not recognised. DLP is a net for mistakes and simple exfiltration, not proof against a
determined agent: what the bottle must never send it must never hold.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from claude_bottle.gate.dlp_reference import ReferenceMatcher
from claude_bottle.gate.dlp_rules import (
    BUILTIN_NAMES,
    BUILTIN_RULES,
    HELD_SECRET,
    MAX_RULE_WIDTH,
    MIN_RULE_WIDTH,
    MIN_SECRET_BYTES,
    DlpMatch,
    DlpRule,
    InvalidDlpRule,
    parse_builtin_name,
    parse_dlp_rule,
    secret_needles,
)
from claude_bottle.gate.dlp_scanner import DlpMatcher, DlpScanner

_Prepare = Callable[[Sequence[DlpRule], Sequence[tuple[bytes, str]]], DlpMatcher | None]
hyperscan_matcher: _Prepare | None
try:
    from claude_bottle.gate.dlp_hyperscan import hyperscan_matcher as _prepare
except ImportError as exc:  # the package, or its native engine, is not there: the standard library's matcher
    hyperscan_matcher, _WHY_NOT = None, f"hyperscan cannot be imported ({exc})"
else:
    hyperscan_matcher, _WHY_NOT = _prepare, ""

# The rules' and the scanner's names, for the modules that know DLP by this one.
__all__ = ["BUILTIN_NAMES", "BUILTIN_RULES", "HELD_SECRET", "MAX_RULE_WIDTH", "MIN_RULE_WIDTH", "MIN_SECRET_BYTES",
           "DlpMatch", "DlpMatcher", "DlpPolicy", "DlpRule", "DlpScanner", "InvalidDlpRule", "parse_builtin_name",
           "parse_dlp_rule", "policy_from_flags", "secret_needles"]


@dataclass(frozen=True)
class DlpPolicy:
    """Which rules apply: the built-in ones not ``disabled``, and ``extra`` configured ones."""

    extra: tuple[DlpRule, ...] = ()
    disabled: frozenset[str] = frozenset()

    @property
    def rules(self) -> tuple[DlpRule, ...]:
        return tuple(r for r in BUILTIN_RULES if r.name not in self.disabled) + self.extra

    def args(self) -> list[str]:
        """The gate flags that carry this policy (``--dlp-rule``, ``--dlp-off``); see ``policy_from_flags``."""
        return ([arg for rule in self.extra for arg in ("--dlp-rule", f"{rule.name} {rule.pattern.pattern.decode()}")]
                + [arg for name in sorted(self.disabled) for arg in ("--dlp-off", name)])

    def matcher(self, secrets: Sequence[bytes]) -> DlpMatcher:
        """These rules and the needles of ``secrets`` (every value the gate holds, at least 16 bytes each),
        prepared once for every request the gate scans."""
        needles = secret_needles(secrets)
        fast = hyperscan_matcher(self.rules, needles) if hyperscan_matcher is not None else None
        return fast or ReferenceMatcher(self.rules, needles)

    def scanner(self, secrets: Sequence[bytes]) -> DlpScanner:
        """A scanner for one request (``matcher(secrets).scanner()``)."""
        return self.matcher(secrets).scanner()


def policy_from_flags(rules: Iterable[str], off: Iterable[str]) -> DlpPolicy:
    """``--dlp-rule 'NAME REGEX'`` and ``--dlp-off NAME``. Raises InvalidDlpRule, its message starting with the
    flag and the value at fault."""
    extra: dict[str, DlpRule] = {}
    for text in rules:
        name, _, regex = text.strip().partition(" ")
        if not regex.strip():
            raise InvalidDlpRule(f"--dlp-rule {text!r}: write NAME REGEX, as in 'internal-token itk_[a-z0-9]{{32}}'")
        if name in extra:
            raise InvalidDlpRule(f"--dlp-rule {text!r}: rule {name} is given twice; keep one")
        try:
            extra[name] = parse_dlp_rule(name, regex.strip())
        except InvalidDlpRule as exc:
            raise InvalidDlpRule(f"--dlp-rule {text!r}: {exc}") from None
    disabled = set()
    for name in off:
        try:
            disabled.add(parse_builtin_name(name))
        except InvalidDlpRule as exc:
            raise InvalidDlpRule(f"--dlp-off {exc}") from None
    return DlpPolicy(tuple(extra.values()), frozenset(disabled))


def engine_note(matcher: DlpMatcher) -> str:
    """What the gate says at start and ``doctor`` says about DLP matching: the engine, and when it is the
    standard library's, why and what it costs (slower, never weaker)."""
    note = f"DLP matching by {matcher.engine}"
    uncompiled = getattr(matcher, "uncompiled", ())
    if uncompiled:
        note += f"; rules searched apart, which the engine cannot compile: {', '.join(uncompiled)}"
    if isinstance(matcher, ReferenceMatcher):
        note += f" ({_WHY_NOT or 'the multi-pattern engine does not run on this processor'}: slower, never weaker)"
    return note
