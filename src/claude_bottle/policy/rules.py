"""Method and path rules per host, for requests the gate sees inside terminated TLS (and plain HTTP).

A rule is ``METHOD PATH``: METHOD an HTTP token in upper case, or ``*`` for any method; PATH starts with
``/``, ``*`` matches within one segment (zero or more characters, never a ``/``) and ``**`` as a whole
segment matches any number of segments, none included. Patterns carry no query and no ``%`` escapes.

How a request is judged (also in docs/inspection.md):
- The most specific ``[[egress]]`` entry whose host pattern matches the target applies, alone: an exact name
  before a wildcard, a longer wildcard before a shorter one, an entry with a port before one without.
- No entry, or an entry without rules: any method and path (the host-level allowlist decides alone).
- Otherwise the path must be canonical first: the query is cut off and takes no part; no ``//``, no dot
  segments, written or encoded (``%2e%2e``); no ``%`` not followed by two hex digits, no ``%25`` (a second
  round of decoding), no encoded control characters; no character outside RFC 3986's path set. Escapes of
  other characters are decoded before matching (``%41`` is ``A``).
- An encoded ``/`` or ``\\`` (``%2F``, ``%5C``; npm writes scoped names as ``@scope%2fname``) makes two
  readings of the path: as written (the escape is part of a segment) and decoded (it separates segments).
  Some servers decode it and some do not, so the request passes only if both readings are allowed.
- A deny rule that matches refuses; else an allow rule that matches allows; else, when the entry has allow
  rules, the request is refused; an entry with deny rules only allows what they do not match.
- Methods compare exactly (HTTP methods are case-sensitive): ``GET`` does not cover ``get`` or ``HEAD``.
  ``CONNECT`` is never judged here: it is the tunnel itself, and a tunnel's requests are judged one by one.
- What a lenient server makes of a request is judged too, and the request passes only if every reading
  passes: a method named in ``X-HTTP-Method-Override``, ``X-HTTP-Method``, ``X-Method-Override`` (or a
  ``_method`` query parameter, or a ``_method`` field in a POST's form or JSON body: policy/overrides.py)
  is judged as well as the request's own, upper-cased as frameworks do (one
  that is not a method token is refused); ``;`` parameters cut from each segment (``/admin;x=1`` is
  ``/admin`` to Tomcat, Jetty, Spring; ``..;`` is a dot segment, refused); a trailing ``/`` dropped
  (``/admin/`` is ``/admin`` to many routers) and a last segment's ``.`` suffix cut (``/admin.json`` is
  ``/admin`` to Rails and Spring), both judged by deny rules only, since the allow rule that passed the
  written path named that resource. Deny rules match paths in any letter case (``/ADMIN`` is
  ``/admin`` to a case-blind server); allow rules match exactly, so a path in another case is refused. A path
  named in ``X-Original-URL`` or ``X-Rewrite-URL``, which some servers route by, is judged as the request's is.
  ``HEAD`` is also judged as ``GET`` by deny rules: Rails, Express, Flask, Spring and Go run a GET route's
  handler for it.
"""

from __future__ import annotations

import itertools
import operator
import re
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from claude_bottle.policy.decide import Decision
from claude_bottle.policy.hosts import HostPattern, InvalidHost, Target, normalize_host, parse_pattern

# RFC 9110 token characters: what a method may be made of.
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
# RFC 3986 pchar without '%': what a pattern segment may contain besides '*'.
_PATTERN_SEGMENT = re.compile(r"[A-Za-z0-9\-._~!$&'()+,;=:@*]*")
# What a request path may contain: pchar, '/', and '%' escapes (checked separately).
_REQUEST_PATH = re.compile(r"/[A-Za-z0-9\-._~!$&'()*+,;=:@/%]*")
_ESCAPE = re.compile(rb"%([0-9A-Fa-f]{2})")
_SEPARATOR_ESCAPES = (b"/", b"\\")


class InvalidRule(ValueError):
    """A rule that cannot be used; the message says how to write it."""


class Verdict(StrEnum):
    ALLOW = "allow"
    DENY = "deny"


@dataclass(frozen=True)
class PathPattern:
    """A parsed PATH: its segments, each a literal, ``*``-glob, or ``**``."""

    text: str
    segments: tuple[str, ...]
    _regexes: tuple[re.Pattern[bytes] | None, ...]  # per segment; None for '**'
    _folded: tuple[re.Pattern[bytes] | None, ...]  # the same, blind to letter case

    def matches(self, segments: tuple[bytes, ...], fold: bool = False) -> bool:
        return _match(self._folded if fold else self._regexes, segments)

    def __str__(self) -> str:
        return self.text


def _match(pattern: tuple[re.Pattern[bytes] | None, ...], path: tuple[bytes, ...]) -> bool:
    """Whether the segment patterns match the path, in time linear in each (paths come from the bottle)."""
    reach = [True] + [False] * len(path)  # reach[j]: the pattern so far matches path[:j]
    for segment in pattern:
        if segment is None:  # '**': any number of segments, none included
            reach = list(itertools.accumulate(reach, operator.or_))
        else:
            reach = [False] + [reach[j] and segment.fullmatch(path[j]) is not None for j in range(len(path))]
    return reach[-1]


def parse_path_pattern(text: str) -> PathPattern:
    if not text.startswith("/"):
        raise InvalidRule(f"path {text!r} must start with '/', as in /repos/**")
    if "?" in text or "#" in text:
        raise InvalidRule(f"path {text!r}: a rule matches the path only; remove the query (it never takes part)")
    if "%" in text:
        raise InvalidRule(f"path {text!r}: write characters themselves, not %-escapes (requests are decoded "
                          "before they are matched)")
    segments = tuple(text[1:].split("/"))
    regexes: list[re.Pattern[bytes] | None] = []
    folded: list[re.Pattern[bytes] | None] = []
    for i, segment in enumerate(segments):
        if segment == "" and i != len(segments) - 1:
            raise InvalidRule(f"path {text!r}: empty segment ('//'); such requests are refused anyway")
        if segment in (".", ".."):
            raise InvalidRule(f"path {text!r}: dot segments never match (requests with them are refused)")
        if not _PATTERN_SEGMENT.fullmatch(segment):
            raise InvalidRule(f"path {text!r}: segment {segment!r} has characters a URL path cannot hold "
                              "unescaped; use '*' for them")
        if segment == "**":
            regexes.append(None)
            folded.append(None)
        elif "**" in segment:
            raise InvalidRule(f"path {text!r}: '**' must be a whole segment (/a/**/b); '*' matches within one")
        else:
            glob = b"[^/]*".join(re.escape(piece.encode()) for piece in segment.split("*"))
            regexes.append(re.compile(glob, re.DOTALL))
            folded.append(re.compile(glob, re.DOTALL | re.IGNORECASE))
    return PathPattern(text, segments, tuple(regexes), tuple(folded))


@dataclass(frozen=True)
class RequestRule:
    """``allow GET /repos/**``: a verdict, a method (or ``*``) and a path pattern."""

    verdict: Verdict
    method: str  # an upper-case HTTP token, or "*" for every method but CONNECT
    path: PathPattern

    def matches(self, method: str, segments: tuple[bytes, ...], fold: bool = False) -> bool:
        """Whether the rule covers ``method`` on ``segments``; with ``fold``, the path in any letter case."""
        return (self.method == "*" or self.method == method) and self.path.matches(segments, fold)

    def __str__(self) -> str:
        return f"{self.verdict} {self.method} {self.path}"


def parse_rule(verdict: Verdict, text: str) -> RequestRule:
    """One ``METHOD PATH`` rule. Raises InvalidRule saying how to write it."""
    words = text.split()
    if len(words) != 2:
        raise InvalidRule(f"rule {text!r}: write METHOD PATH, as in \"GET /repos/**\" or \"* /api/**\"")
    method, path = words
    if method != "*":
        if not _TOKEN.fullmatch(method):
            raise InvalidRule(f"rule {text!r}: {method!r} is not an HTTP method; write GET, POST, ... or *")
        if method != method.upper():
            raise InvalidRule(f"rule {text!r}: methods are case-sensitive and clients send them in upper case; "
                              f"write {method.upper()}")
        if method == "CONNECT":
            raise InvalidRule(f"rule {text!r}: CONNECT opens the tunnel and is never judged by a rule; rules "
                              "judge the requests inside it")
    try:
        return RequestRule(verdict, method, parse_path_pattern(path))
    except InvalidRule as exc:
        raise InvalidRule(f"rule {text!r}: {exc}") from None


@dataclass(frozen=True)
class HostRules:
    """One ``[[egress]]`` entry: a host pattern, its rules, and whether the gate inspects it."""

    host: HostPattern
    allow: tuple[RequestRule, ...] = ()
    deny: tuple[RequestRule, ...] = ()
    inspect: bool = True  # False: tunnelled opaquely (still under the TLS name check); no rules then

    @property
    def specificity(self) -> tuple[bool, int, bool]:
        return (not self.host.wildcard, len(self.host.host), self.host.port is not None)

    def args(self) -> list[str]:
        """The gate flags that carry this entry (``--egress-rule``, ``--no-inspect``); see parse_egress_flag."""
        if not self.inspect:
            return ["--no-inspect", str(self.host)]
        return [arg for rule in self.deny + self.allow for arg in ("--egress-rule", f"{self.host} {rule}")]


def make_host_rules(host: str, allow: tuple[str, ...] | list[str] = (), deny: tuple[str, ...] | list[str] = (),
                    inspect: bool = True) -> HostRules:
    """Parse one entry. Raises InvalidHost (the host) or InvalidRule (a rule), each saying how to fix it."""
    pattern = parse_pattern(host)
    if not inspect and (allow or deny):
        raise InvalidRule(f"{host}: rules need the gate to see the requests; drop allow/deny, or drop "
                          "inspect = false")
    return HostRules(pattern, tuple(parse_rule(Verdict.ALLOW, r) for r in allow),
                     tuple(parse_rule(Verdict.DENY, r) for r in deny), inspect)


class PathError(ValueError):
    """A request path that is not in the gate's canonical form."""


def path_readings(path: str) -> tuple[tuple[bytes, ...], ...]:
    """The segments a request path may mean, after the canonical check (see the module docstring): one
    reading, or two when it holds an encoded separator. The query is cut off. Raises PathError."""
    path = path.split("?", 1)[0]
    if not _REQUEST_PATH.fullmatch(path):
        raise PathError("request path is not an origin-form path of URL characters")
    raw = path.encode("ascii")
    if b"%" in raw and len(_ESCAPE.findall(raw)) != raw.count(b"%"):
        raise PathError("request path has a '%' that is not followed by two hex digits")
    written = tuple(_decode_segment(s, keep_separators=True) for s in raw[1:].split(b"/"))
    decoded = tuple(s for segment in raw[1:].split(b"/") for s in _decode_segment(segment).split(b"/"))
    if any(s in (b".", b"..") for s in written + decoded):
        raise PathError("request path has a dot segment (written or encoded)")
    if any(s == b"" for s in written[:-1] + decoded[:-1]):
        raise PathError("request path has an empty segment ('//', written or encoded)")
    return (written,) if written == decoded else (written, decoded)


def lenient_readings(reading: tuple[bytes, ...]) -> tuple[tuple[tuple[bytes, ...], bool], ...]:
    """What lenient servers also route ``reading`` (from ``path_readings``) as, each with whether only deny
    rules judge it: with each segment's ``;`` parameters cut off (judged by every rule: ``/repos/..;/admin``
    is ``/admin`` to Tomcat), without a trailing empty segment (a trailing ``/``), and with the last segment's
    suffix cut from its first or its last ``.`` (``/admin.json`` is ``/admin`` to Rails' ``(.:format)`` and
    Spring's suffix patterns). The last two by deny rules only: the allow rule that passed the written path
    named that resource. None if nothing applies. Raises PathError when cutting parameters leaves a dot
    segment (``..;``) or an empty one."""
    found: dict[tuple[bytes, ...], bool] = {}
    if any(b";" in segment for segment in reading):
        cut = tuple(segment.split(b";", 1)[0] for segment in reading)
        if any(s in (b".", b"..") for s in cut):
            raise PathError("request path has a dot segment once its ';' parameters are cut ('..;')")
        if any(s == b"" for s in cut[:-1]):
            raise PathError("request path has an empty segment once its ';' parameters are cut")
        found[cut] = False
    for candidate in (reading, *found):
        if len(candidate) > 1 and candidate[-1] == b"":
            found.setdefault(candidate[:-1], True)
        for stem in (candidate[-1].split(b".", 1)[0], candidate[-1].rsplit(b".", 1)[0]):
            if stem != candidate[-1] and stem not in (b"", b".", b".."):
                found.setdefault((*candidate[:-1], stem), True)
    return tuple((r, deny_only) for r, deny_only in found.items() if r != reading)


def _decode_segment(segment: bytes, keep_separators: bool = False) -> bytes:
    def byte(match: re.Match[bytes]) -> bytes:
        value = bytes([int(match.group(1), 16)])
        if value == b"%":
            raise PathError("request path has an encoded '%' (%25): a second decoding could change it")
        if value[0] < 0x20 or value[0] == 0x7F:
            raise PathError("request path has an encoded control character")
        if value == b"\\":
            value = b"/"  # a backslash is a separator to some servers: read it as one
        if keep_separators and value == b"/":
            return match.group(0).upper()
        return value

    return _ESCAPE.sub(byte, segment)


@dataclass(frozen=True)
class RequestPolicy:
    """The ``[[egress]]`` entries of a gate. Pure: ``decide`` for each request the gate can see, ``inspects``
    when a tunnel opens. An empty policy allows every request and inspects every host."""

    hosts: tuple[HostRules, ...] = ()

    def args(self) -> list[str]:
        """The gate flags that carry these entries (an entry without rules needs none: ``--allow`` says it)."""
        return [arg for entry in self.hosts for arg in entry.args()]

    @property
    def patterns(self) -> tuple[HostPattern, ...]:
        """The host patterns of the entries: each joins the allowlist."""
        return tuple(entry.host for entry in self.hosts)

    def entry(self, target: Target) -> HostRules | None:
        """The entry that applies to ``target``: the most specific match, or None."""
        matching = [entry for entry in self.hosts if entry.host.matches(target)]
        return max(matching, key=lambda entry: entry.specificity, default=None)

    def has_rules(self, host: str, port: int) -> bool:
        """Whether ``decide`` judges requests to ``host``:``port`` by method and path rules."""
        try:
            name, ip = normalize_host(host)
        except InvalidHost:
            return False
        entry = self.entry(Target(name, port, ip))
        return entry is not None and bool(entry.allow or entry.deny)

    def inspects(self, target: Target) -> bool:
        """Whether the gate terminates TLS toward ``target`` (True unless its entry says ``inspect = false``)."""
        entry = self.entry(target)
        return entry is None or entry.inspect

    def decide(self, method: str, host: str, port: int, path: str, overrides: Sequence[str] = (),
               paths: Sequence[str] = ()) -> Decision:
        """Judge one request. ``host`` and ``port``: the tunnel's target (CONNECT, checked against the SNI) or
        the absolute URL's, never a ``Host`` header the client may set apart from them; normalised here.
        ``path``: the origin-form target (a query is ignored). The host must already have passed the
        allowlist: this adds the method and path rules on top. ``overrides``: the methods the request also
        names (``method_overrides``), ``paths``: the paths it also names (``path_overrides``), each judged too.
        Refusals: 405 for CONNECT, 400 for a path that is not canonical or an override that is not a method
        (only where rules exist), 403 for a rule. The reason names the rule and the entry, never the path."""
        if method == "CONNECT":
            return Decision(False, "CONNECT is not a request inside a tunnel; the tunnel was judged on its own", 405)
        try:
            name, ip = normalize_host(host)
        except InvalidHost:
            return Decision(False, "request host is not a valid host name", 400)  # its text stays out of the audit
        target = Target(name, port, ip)
        entry = self.entry(target)
        if entry is None:
            return Decision(True, f"{target} has no request rules: any method and path")
        if not entry.allow and not entry.deny:
            what = "is not inspected" if not entry.inspect else "has no request rules"
            return Decision(True, f"[[egress]] {entry.host} {what}: any method and path")
        judged: list[tuple[tuple[bytes, ...], bool, str]] = []
        for each_path, named in ((path, ""), *((p, _PATH_OVERRIDE_NOTE) for p in paths)):
            try:
                judged += _readings(each_path, named)
            except PathError as exc:
                return Decision(False, f"{exc}{named}; [[egress]] {entry.host} has rules, which judge canonical "
                                "paths only", 400, rule=f"[[egress]] {entry.host} canonical path")
        methods = tuple(dict.fromkeys(o.upper() for o in overrides if o.upper() != method))
        if any(not _TOKEN.fullmatch(o) for o in methods):
            return Decision(False, f"a method override header names no HTTP method; [[egress]] {entry.host} has "
                            "rules, which judge every method a request names", 400,
                            rule=f"[[egress]] {entry.host} method override")
        judged_as = [(each, False, "" if each == method else " (the method a method override names)")
                     for each in (method, *methods)]
        if any(each == "HEAD" for each, _, _ in judged_as):  # servers run a GET route's handler for HEAD
            judged_as.append(("GET", True, " (HEAD, which servers route as GET)"))
        first: Decision | None = None
        for each, method_deny_only, overridden in judged_as:
            for reading, deny_only, note in judged:
                decision = _judge(entry, each, reading, deny_only or method_deny_only)
                if not decision.allow:
                    return Decision(False, f"{decision.reason}{note}{overridden}", rule=decision.rule)
                first = first or decision
        assert first is not None
        return first


_PATH_OVERRIDE_NOTE = " (the path an X-Original-URL or X-Rewrite-URL header names)"
_LENIENT_NOTE = " (read as a lenient server routes it: ';' parameters cut, a trailing '/' or '.' suffix dropped)"


def _readings(path: str, named: str) -> list[tuple[tuple[bytes, ...], bool, str]]:
    """Each reading of ``path`` to judge (``path_readings``, then ``lenient_readings``): its segments, whether
    deny rules alone judge it, and what the refusal's reason adds after the rule (``named``: whose path it is).
    Raises PathError."""
    readings = path_readings(path)
    lenient = [r for reading in readings for r in lenient_readings(reading)]
    notes = ("", " (reading its encoded '/' as a separator)")
    return [(r, False, f"{notes[i]}{named}") for i, r in enumerate(readings)] + [
        (r, deny_only, f"{_LENIENT_NOTE}{named}") for r, deny_only in lenient]


def _judge(entry: HostRules, method: str, segments: tuple[bytes, ...], deny_only: bool = False) -> Decision:
    for rule in entry.deny:  # in any letter case: a case-blind server routes /ADMIN as /admin
        if rule.matches(method, segments, fold=True):
            case = "" if rule.matches(method, segments) else " (the path in another letter case)"
            return Decision(False, f"{method} refused by [[egress]] {entry.host} rule \"{rule}\"{case}",
                            rule=_rule_name(entry, rule))
    if deny_only:
        return Decision(True, f"{method} matches no deny rule of [[egress]] {entry.host}")
    for rule in entry.allow:
        if rule.matches(method, segments):
            return Decision(True, f"{method} allowed by [[egress]] {entry.host} rule \"{rule}\"",
                            rule=_rule_name(entry, rule))
    if not entry.allow:
        return Decision(True, f"{method} matches no deny rule of [[egress]] {entry.host}")
    listed = ", ".join(f'"{rule.method} {rule.path}"' for rule in entry.allow)
    return Decision(False, f"{method} matches no allow rule of [[egress]] {entry.host} (allowed: {listed})",
                    rule=f"[[egress]] {entry.host} allow list")


def _rule_name(entry: HostRules, rule: RequestRule) -> str:
    """How the audit's ``rule`` field names a rule: its entry and the rule as written."""
    return f"[[egress]] {entry.host} {rule}"


def parse_egress_flag(text: str) -> tuple[HostPattern, RequestRule]:
    """``--egress-rule 'HOST allow|deny METHOD PATH'``. Raises InvalidHost or InvalidRule."""
    words = text.split()
    if len(words) != 4 or words[1] not in (Verdict.ALLOW, Verdict.DENY):
        raise InvalidRule("write HOST allow|deny METHOD PATH, as in 'api.github.com allow GET /repos/**'")
    return parse_pattern(words[0]), parse_rule(Verdict(words[1]), f"{words[2]} {words[3]}")


def policy_from_flags(rules: tuple[str, ...] | list[str], no_inspect: tuple[str, ...] | list[str]) -> RequestPolicy:
    """The gate's ``--egress-rule`` and ``--no-inspect`` flags as one policy, one entry per host pattern, rules
    in the order given. Raises InvalidRule, its message starting with the flag and the value at fault."""
    entries: dict[HostPattern, tuple[list[RequestRule], list[RequestRule]]] = {}
    for text in rules:
        try:
            host, rule = parse_egress_flag(text)
        except (InvalidHost, InvalidRule) as exc:
            raise InvalidRule(f"--egress-rule {text!r}: {exc}") from None
        allow, deny = entries.setdefault(host, ([], []))
        (allow if rule.verdict is Verdict.ALLOW else deny).append(rule)
    opaque: list[HostPattern] = []
    for text in no_inspect:
        try:
            host = parse_pattern(text)
        except InvalidHost as exc:
            raise InvalidRule(f"--no-inspect {text!r}: {exc}") from None
        if host in entries:
            raise InvalidRule(f"--no-inspect {text!r}: the host has --egress-rule rules, which need the gate to "
                              "see its requests; drop one or the other")
        opaque.append(host)
    ruled = tuple(HostRules(host, tuple(allow), tuple(deny)) for host, (allow, deny) in entries.items())
    return RequestPolicy(ruled + tuple(HostRules(host, inspect=False) for host in dict.fromkeys(opaque)))
