"""Learn mode and host-denied entries in the egress policy, the control channel's changes, the allowlist a
run's audit suggests, and the logs table. All pure."""

from __future__ import annotations

import tomllib
from typing import Any

import pytest

from claude_bottle import logview, suggest
from claude_bottle.agent.schema import parse_agent
from claude_bottle.gate import control
from claude_bottle.policy.addresses import AddressGuard
from claude_bottle.policy.decide import Decision, EgressPolicy
from claude_bottle.policy.hosts import Allowlist, parse_authority
from claude_bottle.policy.view import policy_toml, policy_view

API = "api.anthropic.com"


def policy(allow: tuple[str, ...] = (), learn: bool = False, denied: tuple[str, ...] = ()) -> EgressPolicy:
    return EgressPolicy(Allowlist.parse(allow), AddressGuard(), frozenset({API}), denied=Allowlist.parse(denied),
                        learn=learn)


# ---- the policy ------------------------------------------------------------------------------------------

def test_learn_mode_allows_what_the_allowlist_lacks_as_a_learned_decision() -> None:
    decision = policy(learn=True).decide_target(parse_authority("example.com:443"))
    assert decision.allow and decision.learned and decision.unlisted
    assert decision.reason == "learn mode: example.com:443 is not in the allowlist (would deny)"
    listed = policy(("example.com",), learn=True).decide_target(parse_authority("example.com:443"))
    assert listed.allow and not listed.learned and not listed.unlisted


@pytest.mark.parametrize("target", [f"{API}:443", f"{API}:8443"])
def test_learn_mode_never_opens_the_api_host(target: str) -> None:
    decision = policy(learn=True).decide_tunnel(parse_authority(target))
    assert not decision.allow and "credential route" in decision.reason


def test_a_denied_entry_wins_over_the_allowlist_and_learn_mode() -> None:
    for base in (policy(("*.example.com",), denied=("a.example.com",)), policy(learn=True, denied=("a.example.com",))):
        decision = base.decide_target(parse_authority("a.example.com:443"))
        assert not decision.allow and "denied by the user" in decision.reason
        assert decision.hint == "run `claude-bottle allow a.example.com` on the host"
    assert policy(("*.example.com",), denied=("a.example.com",)).decide_target(parse_authority("b.example.com:443")).allow


@pytest.mark.parametrize(("target", "entry"), [("example.com:443", "example.com"), ("example.com:80", "example.com"),
                                               ("example.com:8443", "example.com:8443"),
                                               ("[2001:db8::1]:22", "[2001:db8::1]:22")])
def test_an_allowlist_refusal_names_the_entry_that_allows_it(target: str, entry: str) -> None:
    decision = policy().decide_target(parse_authority(target))
    assert decision.hint == f"run `claude-bottle allow {entry}` on the host"
    assert policy((entry,)).decide_target(parse_authority(target)).allow


# ---- the control channel's changes -----------------------------------------------------------------------

def test_allow_adds_an_entry_and_lifts_its_denial_deny_does_the_reverse() -> None:
    start = policy(("pypi.org",))
    denial = control.apply(start, "deny", "pypi.org")
    denied = denial.policy
    assert denial.message == "denied pypi.org" and denied.allowlist.patterns == () and len(denied.denied.patterns) == 1
    assert denial.decision == Decision(False, "the user denied pypi.org while the gate runs")
    approval = control.apply(denied, "allow", "PyPI.org.")
    allowed = approval.policy
    assert approval.message == "allowed pypi.org" and [str(p) for p in allowed.allowlist.patterns] == ["pypi.org"]
    assert approval.decision == Decision(True, "the user allowed pypi.org while the gate runs")
    assert allowed.denied.patterns == ()
    again = control.apply(allowed, "allow", "pypi.org").policy
    assert again.allowlist == allowed.allowlist  # no duplicate
    shown = control.apply(start, "show", "")
    assert shown.policy is start and shown.decision is None, "show changes nothing and audits nothing"


@pytest.mark.parametrize(("entry", "words"), [(API, "API upstream"), (f"{API}:8443", "API upstream"),
                                              ("*", "every host"), ("*.co.uk", "public suffix"), ("", "empty host")])
def test_the_control_channel_refuses_what_an_allowlist_refuses(entry: str, words: str) -> None:
    with pytest.raises(control.ControlError, match=words):
        control.apply(policy(), "allow", entry)


@pytest.mark.parametrize("line", [b"", b"allow x\n", b"[1]\n", b'{"op": 1}\n', b'{"op": "allow", "entry": 2}\n'])
def test_a_control_request_must_be_one_json_object(line: bytes) -> None:
    with pytest.raises(control.ControlError):
        control.parse_request(line)


def test_the_policy_file_is_toml_that_shows_the_policy_in_effect() -> None:
    view = policy_view(policy(("pypi.org", "*.npmjs.org:8443"), learn=True, denied=("x.example",)),
                               suggest_rules())
    shown = tomllib.loads(policy_toml(view))
    assert shown == {"learn": True, "ask": False, "allow": ["pypi.org", "*.npmjs.org:8443"], "allow_tcp": [], "deny": ["x.example"],
                     "rules": ["--egress-rule api.github.com allow GET /repos/**"]}


def suggest_rules() -> Any:
    from claude_bottle.gate.settings import parse_egress_rules
    return parse_egress_rules(["api.github.com allow GET /repos/**"], [])


# ---- suggestions from an audit ---------------------------------------------------------------------------

def line(target: str, method: str = "CONNECT", path: str | None = None, decision: str = "allow",
         would_deny: bool = False, status: int = 200, listener: str = "proxy", reason: str = "r",
         **fields: Any) -> dict[str, Any]:
    entry: dict[str, Any] = {"listener": listener, "method": method, "target": target, "decision": decision,
                             "status": status, "reason": reason}
    if path is not None:
        entry["path"] = path
    if would_deny:
        entry["would_deny"] = True
    return entry | fields


AUDIT = [
    line("-", "-", decision="deny", status=400),
    line("api.example.com:443", "POST", "/v1/messages", listener="api"),  # the API route: never an entry
    line("files.example.org:443", would_deny=True),
    line("files.example.org:443", "GET", "/simple/requests/", would_deny=True),
    line("files.example.org:443", "GET", "/simple/%7Eodd/", would_deny=True),
    line("files.example.org:443", "POST", "/upload", would_deny=True),
    line("git.example.net:22", would_deny=True),  # a tunnel the gate did not read
    line("pypi.org:443"),
    line("pypi.org:443", "GET", "/simple/x/"),
    line("10.0.0.5:443", decision="deny", status=403, reason="10.0.0.5 is a private address (RFC 1918)"),
    line("-", "ALLOW", listener="control"),
]


def test_a_suggestion_groups_what_learn_mode_let_through_and_what_was_allowed() -> None:
    found = suggest.suggest(AUDIT)
    assert [d.entry for d in found.learned] == ["files.example.org", "git.example.net:22"]
    assert [d.entry for d in found.known] == ["pypi.org"]
    assert found.destinations["files.example.org"].rules() == ["GET /simple/requests/", "GET /simple/~odd/",
                                                                "POST /upload"]
    assert found.destinations["git.example.net:22"].rules() == []
    assert found.refused == {"10.0.0.5:443": "10.0.0.5 is a private address (RFC 1918)"}


def test_the_rendered_suggestion_is_an_agent_whose_strict_policy_passes_what_the_run_did_and_no_more() -> None:
    text = suggest.render(suggest.suggest(AUDIT), "run r-1")
    agent = parse_agent("learned", tomllib.loads("version = 1\n" + text), "suggested")
    allowlist = agent.egress_allowlist
    for target in ("files.example.org:443", "git.example.net:22", "pypi.org:443"):
        assert allowlist.match(parse_authority(target)) is not None, target
    assert allowlist.match(parse_authority("10.0.0.5:443")) is None
    assert allowlist.match(parse_authority("other.example.org:443")) is None
    rules = agent.egress
    assert rules.decide("GET", "files.example.org", 443, "/simple/requests/").allow
    assert rules.decide("GET", "files.example.org", 443, "/simple/~odd/").allow
    assert not rules.decide("DELETE", "files.example.org", 443, "/upload").allow
    assert not rules.decide("GET", "files.example.org", 443, "/admin").allow
    assert "Let through by learn mode only" in text and "Refused, not suggested" in text


def test_many_paths_for_one_method_become_one_rule_per_first_segment() -> None:
    audit = [line("cdn.example.com:443", "GET", f"/pkgs/{i}/file", would_deny=True) for i in range(12)]
    audit.append(line("cdn.example.com:443", "GET", "/index", would_deny=True))
    assert suggest.suggest(audit).destinations["cdn.example.com"].rules() == ["GET /index", "GET /pkgs/**"]


@pytest.mark.parametrize(("path", "rule"), [("/a%2Fb/c", "/*/c"), ("/q?x=1", "/q"), ("/a b/", "/*/"),
                                            ("/", "/"), ("/%2e%2e/x", "/*/x")])
def test_a_path_becomes_a_rule_path_the_agent_file_accepts(path: str, rule: str) -> None:
    assert suggest.rule_path(path) == rule
    parse_agent("x", {"version": 1, "egress": [{"host": "h.example", "allow": [f"GET {rule}"]}]}, "test")


def test_additions_list_only_what_the_agent_does_not_allow_yet() -> None:
    found = suggest.suggest(AUDIT)
    added = suggest.additions(found, Allowlist.parse(["*.example.org", "pypi.org"]), "run r-1")
    assert '"git.example.net:22"' in added and "files.example.org" not in added and "pypi.org" not in added
    assert suggest.additions(found, Allowlist.parse(["*.example.org", "pypi.org", "git.example.net:22"]), "r") == ""


# ---- the logs table --------------------------------------------------------------------------------------

def test_a_row_marks_learned_lines_colours_only_when_asked_and_escapes_control_characters() -> None:
    entry = line("evil\x1b[2J.example:443", "GET", "/x\x07", would_deny=True)
    entry["time"] = "2026-11-23T10:00:00.123Z"
    plain = logview.row(entry, colour=False)
    assert "would_deny" in plain and "10:00:00.123" in plain and "\x1b" not in plain and "\x07" not in plain
    assert logview.row(entry, colour=True).startswith("\x1b[33m")


def test_follow_offers_the_command_that_allows_a_refused_destination() -> None:
    refused = line("x.example:443", decision="deny", status=403, unlisted=True)
    assert logview.offer(refused, "dev") == ("  -> to allow it now: claude-bottle allow dev x.example "
                                             "(add --save to keep it)")
    other = line("x.example:8443", decision="deny", status=403, unlisted=True)
    assert "claude-bottle allow dev x.example:8443 " in (logview.offer(other, "dev") or "")
    assert logview.offer(line("x.example:443", unlisted=True), "dev") is None  # learn mode let it through
    assert logview.offer(line("10.0.0.1:443", decision="deny", reason="10.0.0.1 is private"), "dev") is None


def test_a_line_from_an_earlier_gate_offers_from_its_reason_which_then_carried_the_fact() -> None:
    old = line("x.example:8443", decision="deny", status=403, reason="x.example:8443 is not in the allowlist")
    assert "claude-bottle allow dev x.example:8443 " in (logview.offer(old, "dev") or "")
    assert logview.offer(line("10.0.0.1:443", decision="deny", reason="10.0.0.1 is private"), "dev") is None


# ---- taking an entry out of an agent file ----------------------------------------------------------------

AGENT_FILE = '''version = 1
env = {MIRROR = "pypi.org"}
allow = [
    "pypi.org",  # the index
    "[::1]:22",
    "x.example",
]

[[egress]]
host = "api.example.com"
allow = ["GET /x"]

# Added by `claude-bottle allow --save`
[[egress]]
host = "x.example"
'''


@pytest.mark.parametrize("entry", ["pypi.org", "[::1]:22", "x.example", "api.example.com"])
def test_an_entry_leaves_an_agent_file_and_nothing_else_does(entry: str) -> None:
    after = suggest.without_entry(AGENT_FILE, entry)
    agent = parse_agent("a", tomllib.loads(after), "a.toml")
    assert entry not in agent.egress_allowlist.texts()
    before = parse_agent("a", tomllib.loads(AGENT_FILE), "a.toml")
    assert agent.egress_allowlist.texts() == tuple(e for e in before.egress_allowlist.texts() if e != entry)
    assert agent.env == {"MIRROR": "pypi.org"}
    assert ("Added by" in after) == (entry != "x.example")  # a table's comment goes with it
    assert ("# the index" in after) == (entry != "pypi.org")


def test_an_inline_allow_list_loses_one_entry() -> None:
    assert suggest.without_entry('version = 1\nallow = ["a.example", "b.example"]\n', "b.example") == \
        'version = 1\nallow = ["a.example"]\n'
    assert suggest.without_entry('version = 1\nallow = ["a.example", "b.example"]\n', "a.example") == \
        'version = 1\nallow = ["b.example"]\n'


def test_an_entry_the_file_does_not_list_leaves_it_unchanged() -> None:
    assert suggest.without_entry(AGENT_FILE, "other.example") == AGENT_FILE


def test_a_refusal_reason_the_bottle_shaped_cannot_leave_its_comment() -> None:
    planted = line("x.example:443", decision="deny", status=403,
                   reason='x\n[[egress]]\nhost = "evil.example"\n\x1b[2J')
    text = suggest.render(suggest.suggest([planted]), "run r")
    assert tomllib.loads(text) == {} and "\x1b" not in text


@pytest.mark.parametrize("tunnel", [
    {"tunnel": "raw_tcp"},
    # a line from an earlier gate, before the tunnel's mode had a field: its reason said it
    {"reason": "git.example.com:22 matches allow-tcp pattern git.example.com:22; 192.0.2.1 is a global address; "
               "raw TCP allowed"},
], ids=["field", "earlier-gate"])
def test_a_raw_tcp_destination_is_suggested_in_allow_tcp_and_never_appended_as_a_table(tunnel: dict[str, str]
                                                                                       ) -> None:
    audit = [line("git.example.com:22", **tunnel), line("pypi.org:443", would_deny=True)]
    found = suggest.suggest(audit)
    text = suggest.render(found, "run r")
    agent = parse_agent("a", tomllib.loads("version = 1\n" + text), "a.toml")
    assert agent.allow_tcp.texts() == ("git.example.com:22",) and agent.egress_allowlist.texts() == ("pypi.org",)
    assert "git.example.com" not in suggest.additions(found, Allowlist(), "run r")


def test_a_current_line_is_read_by_its_fields_whatever_its_reason_says() -> None:
    opaque = line("git.example.com:22", reason="x; raw TCP allowed", tunnel="opaque")
    assert not suggest.suggest([opaque]).destinations["git.example.com:22"].raw_tcp
    from claude_bottle.records import current
    assert current(opaque) is opaque


def test_destinations_approved_in_ask_mode_are_counted_and_suggested_in_their_own_group() -> None:
    audit = [
        line("pypi.org:443", decision="ask", listener="ask", ask="1"),
        line("pypi.org:443", "ALLOW-ONCE", listener="ask", ask="1", answer="allow-once", by="terminal"),
        line("pypi.org:443", ask="1", answer="allow-once", by="terminal"),
        line("pypi.org:443", "GET", "/simple/", ask="1", answer="allow-once", by="terminal"),
        line("cdn.example.com:443", ask="2", answer="allow-always", by="hook"),
        line("evil.example:443", decision="deny", status=403, ask="3", answer="deny-once", by="timeout",
             reason="evil.example:443: not approved after 60s"),
        line("known.example:443"),
    ]
    found = suggest.suggest(audit)
    assert [d.entry for d in found.approved] == ["pypi.org", "cdn.example.com"]
    assert (found.destinations["pypi.org"].approved, found.destinations["cdn.example.com"].approved) == (2, 1)
    assert [d.entry for d in found.known] == ["known.example"]
    assert "evil.example:443" in found.refused
    text = suggest.render(found, "run r-1")
    assert "# ---- Approved in ask mode ----\n# 1 request(s) approved in ask mode" in text
    assert '# 2 request(s) approved in ask mode; only the 1 method and path(s) seen may pass\n[[egress]]\n' \
        'host = "pypi.org"' in text


def test_an_ask_line_is_shown_as_ask() -> None:
    from claude_bottle import logview

    entry = line("pypi.org:443", "ASK", decision="ask", listener="ask", ask="1")
    assert logview.decision(entry) == "ask"
    assert logview.row(entry, colour=True).startswith("\x1b[36m")
