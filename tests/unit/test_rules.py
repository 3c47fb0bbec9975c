"""Method and path rules: what each request is judged to be, with the rule named in the reason."""

from __future__ import annotations

import pytest

from claude_bottle.policy.hosts import InvalidHost
from claude_bottle.policy.overrides import FORM, body_method_overrides
from claude_bottle.policy.rules import (
    InvalidRule,
    PathError,
    RequestPolicy,
    Verdict,
    lenient_readings,
    make_host_rules,
    parse_rule,
    path_readings,
    policy_from_flags,
)

GITHUB = RequestPolicy((
    make_host_rules("api.github.com", allow=["GET /repos/**", "HEAD /**"], deny=["POST /gists", "* /repos/*/*/hooks"]),
    make_host_rules("github.com", allow=["GET /**", "POST /*/*/git-upload-pack"]),
    make_host_rules("*.cdn.example.net", deny=["PUT /**"]),
    make_host_rules("pinned.example.com", inspect=False),
    make_host_rules("registry.npmjs.org", allow=["GET /**"]),
))


@pytest.mark.parametrize(("method", "host", "path", "allow", "reason"), [
    # allow rules: only what they match
    ("GET", "api.github.com", "/repos/a/b", True, 'GET allowed by [[egress]] api.github.com rule "allow GET /repos/**"'),
    ("GET", "api.github.com", "/repos", True, 'rule "allow GET /repos/**"'),  # '**' matches no segment too
    ("GET", "api.github.com", "/repos/", True, 'rule "allow GET /repos/**"'),
    ("GET", "api.github.com", "/repos/a/b/contents/x.py?ref=main", True, "allow GET /repos/**"),
    ("GET", "api.github.com", "/user", False, 'GET matches no allow rule of [[egress]] api.github.com (allowed: "GET /repos/**", "HEAD /**")'),
    ("GET", "api.github.com", "/reposx/a", False, "matches no allow rule"),
    ("HEAD", "api.github.com", "/user", True, 'rule "allow HEAD /**"'),
    ("HEAD", "api.github.com", "/", True, 'rule "allow HEAD /**"'),
    ("POST", "api.github.com", "/repos/a/b/issues", False, "POST matches no allow rule"),
    ("PATCH", "api.github.com", "/repos/a/b", False, "PATCH matches no allow rule"),
    # deny beats allow
    ("GET", "api.github.com", "/repos/a/b/hooks", False, 'GET refused by [[egress]] api.github.com rule "deny * /repos/*/*/hooks"'),
    ("GET", "api.github.com", "/repos/a/b/hooks/1", True, "allow GET /repos/**"),  # '*' is one segment
    ("POST", "api.github.com", "/gists", False, 'rule "deny POST /gists"'),
    ("POST", "api.github.com", "/gists/", False, "matches no allow rule"),  # not the deny: no allow either
    # method case and HEAD vs GET
    ("get", "api.github.com", "/repos/a/b", False, "get matches no allow rule"),
    ("Get", "api.github.com", "/repos/a/b", False, "Get matches no allow rule"),
    ("HEAD", "api.github.com", "/repos/a/b", True, "allow HEAD /**"),
    ("GET", "github.com", "/a/b", True, "allow GET /**"),
    ("HEAD", "github.com", "/a/b", False, "HEAD matches no allow rule"),  # GET does not cover HEAD
    # CONNECT is never a request inside a tunnel
    ("CONNECT", "api.github.com", "/", False, "CONNECT is not a request inside a tunnel"),
    ("CONNECT", "unlisted.example.com", "/", False, "CONNECT is not a request inside a tunnel"),
    # git: fetch yes, push no
    ("POST", "github.com", "/o/r.git/git-upload-pack", True, "allow POST /*/*/git-upload-pack"),
    ("POST", "github.com", "/o/r/git-upload-pack", True, "allow POST /*/*/git-upload-pack"),
    ("POST", "github.com", "/o/r.git/git-receive-pack", False, "POST matches no allow rule"),
    ("GET", "github.com", "/o/r.git/info/refs?service=git-receive-pack", True, "allow GET /**"),
    # a wildcard entry, deny-only: everything else
    ("GET", "raw.cdn.example.net", "/o/r/main/x", True, "GET matches no deny rule of [[egress]] *.cdn.example.net"),
    ("PUT", "objects.cdn.example.net", "/x", False, 'rule "deny PUT /**"'),
    # hosts without rules: any method and path, not even the canonical check
    ("DELETE", "unlisted.example.com", "/a/../b", True, "unlisted.example.com:443 has no request rules"),
    ("POST", "pinned.example.com", "/x", True, "[[egress]] pinned.example.com is not inspected"),
    # host spellings normalise before the entry is chosen
    ("GET", "API.GitHub.com.", "/user", False, "matches no allow rule of [[egress]] api.github.com"),
    ("GET", "exa mple.com", "/", False, "request host is not a valid host name"),
])
def test_requests_are_judged_by_the_entrys_rules(method: str, host: str, path: str, allow: bool, reason: str) -> None:
    decision = GITHUB.decide(method, host, 443, path)
    assert decision.allow is allow, decision.reason
    assert reason in decision.reason


@pytest.mark.parametrize(("path", "why"), [
    ("/repos/a/../b", "dot segment"),
    ("/repos/a/./b", "dot segment"),
    ("/repos/%2e%2e/x", "dot segment"),
    ("/repos/%2E%2E/x", "dot segment"),
    ("/repos/.%2e/x", "dot segment"),
    ("/repos/%2e/x", "dot segment"),
    ("/repos/a%2F..%2Fb", "dot segment"),  # decoded: /repos/a/../b
    ("/repos/a%5C..%5Cb", "dot segment"),  # a backslash is a separator to some servers
    ("//repos/a", "empty segment"),
    ("/repos//a", "empty segment"),
    ("/repos/a%2F%2Fb", "empty segment"),
    ("/repos/%25", "encoded '%'"),
    ("/repos/%252e%252e/x", "encoded '%'"),
    ("/repos/%0a", "control character"),
    ("/repos/%00", "control character"),
    ("/repos/%", "not followed by two hex digits"),
    ("/repos/%zz", "not followed by two hex digits"),
    ("/repos/a b", "origin-form path"),
    ("/repos/a\\b", "origin-form path"),
    ("/repos/a#b", "origin-form path"),
    ("/repos/\u00e9", "origin-form path"),
    ("*", "origin-form path"),
    ("http://api.github.com/repos/a", "origin-form path"),
    ("", "origin-form path"),
])
def test_paths_not_in_canonical_form_are_refused_where_rules_exist(path: str, why: str) -> None:
    decision = GITHUB.decide("GET", "api.github.com", 443, path)
    assert (decision.allow, decision.status) == (False, 400)
    assert why in decision.reason
    assert "[[egress]] api.github.com has rules" in decision.reason


@pytest.mark.parametrize(("path", "readings"), [
    ("/", ((b"",),)),
    ("/a/b/", ((b"a", b"b", b""),)),
    ("/a/%41%62?x=%2e%2e", ((b"a", b"Ab"),)),  # escapes of ordinary characters decode; the query is dropped
    ("/a/%c3%a9", ((b"a", "é".encode()),)),
    ("/@types%2fnode", ((b"@types%2Fnode",), (b"@types", b"node"))),
    ("/a%5Cb", ((b"a%5Cb",), (b"a", b"b"))),
])
def test_path_readings(path: str, readings: tuple[tuple[bytes, ...], ...]) -> None:
    assert path_readings(path) == readings


def test_an_encoded_slash_passes_only_if_both_readings_are_allowed() -> None:
    policy = RequestPolicy((make_host_rules("api.github.com", allow=["GET /repos/**"],
                                            deny=["* /repos/*/*/git/refs/**"]),
                            make_host_rules("registry.npmjs.org", allow=["GET /**"]),
                            make_host_rules("one.example.com", allow=["GET /files/*"])))
    npm = policy.decide("GET", "registry.npmjs.org", 443, "/@types%2fnode")
    assert npm.allow, npm.reason
    sneaky = policy.decide("GET", "api.github.com", 443, "/repos/o/r%2Fgit%2Frefs/heads")
    assert not sneaky.allow
    assert sneaky.reason == ('GET refused by [[egress]] api.github.com rule "deny * /repos/*/*/git/refs/**" '
                             "(reading its encoded '/' as a separator)")
    # the other way round: one segment as written, two when decoded
    assert policy.decide("GET", "one.example.com", 443, "/files/a").allow
    assert not policy.decide("GET", "one.example.com", 443, "/files/a%2Fb").allow


def test_the_most_specific_entry_applies_alone() -> None:
    policy = RequestPolicy((
        make_host_rules("*.example.com", deny=["* /**"]),
        make_host_rules("*.api.example.com", allow=["GET /**"]),
        make_host_rules("v1.api.example.com", allow=["POST /x"]),
        make_host_rules("v1.api.example.com:8443", allow=["PUT /x"]),
    ))
    assert "*.example.com" in policy.decide("GET", "www.example.com", 443, "/").reason
    assert policy.decide("GET", "v2.api.example.com", 443, "/").allow
    assert not policy.decide("GET", "v1.api.example.com", 443, "/").allow
    assert policy.decide("POST", "v1.api.example.com", 443, "/x").allow
    assert policy.decide("PUT", "v1.api.example.com", 8443, "/x").allow
    assert not policy.decide("POST", "v1.api.example.com", 8443, "/x").allow
    # an entry without a port covers only the default ports, like an allow pattern
    assert policy.decide("POST", "v2.api.example.com", 8080, "/x").reason.endswith("has no request rules: any method and path")


def test_inspection_is_per_entry() -> None:
    from claude_bottle.policy.hosts import Target

    assert GITHUB.inspects(Target("api.github.com", 443))
    assert GITHUB.inspects(Target("unlisted.example.com", 443))
    assert not GITHUB.inspects(Target("pinned.example.com", 443))
    assert RequestPolicy().inspects(Target("x.example.com", 443))
    assert RequestPolicy().decide("DELETE", "x.example.com", 443, "/a//b").allow


@pytest.mark.parametrize(("text", "message"), [
    ("GET", "write METHOD PATH"),
    ("GET /a /b", "write METHOD PATH"),
    ("get /a", "write GET"),
    ("G(T /a", "is not an HTTP method"),
    ("CONNECT /", "CONNECT opens the tunnel"),
    ("GET repos/**", "must start with '/'"),
    ("GET /repos?x=1", "remove the query"),
    ("GET /repos/%2F", "not %-escapes"),
    ("GET /a//b", "empty segment"),
    ("GET /a/../b", "dot segments never match"),
    ("GET /a/**x", "'**' must be a whole segment"),
    ("GET /a/b c", "write METHOD PATH"),
    ("GET /a/<b>", "characters a URL path cannot hold"),
])
def test_bad_rules_say_how_to_write_them(text: str, message: str) -> None:
    with pytest.raises(InvalidRule, match=message.replace("(", r"\(").replace("?", r"\?").replace("*", r"\*")):
        parse_rule(Verdict.ALLOW, text)


def test_rules_need_inspection_and_a_valid_host() -> None:
    with pytest.raises(InvalidRule, match="rules need the gate to see the requests"):
        make_host_rules("pinned.example.com", allow=["GET /**"], inspect=False)
    with pytest.raises(InvalidHost, match="matches every host"):
        make_host_rules("*", allow=["GET /**"])
    with pytest.raises(InvalidHost, match="public suffix"):
        make_host_rules("*.co.uk")


def test_gate_flags_round_trip() -> None:
    entries = GITHUB.hosts
    args = [arg for entry in entries for arg in entry.args()]
    rules = [args[i + 1] for i in range(0, len(args), 2) if args[i] == "--egress-rule"]
    opaque = [args[i + 1] for i in range(0, len(args), 2) if args[i] == "--no-inspect"]
    assert "api.github.com deny POST /gists" in rules
    assert opaque == ["pinned.example.com"]
    parsed = policy_from_flags(rules, opaque)
    # entries without rules (inspected, any request) carry no flag: --allow says it all
    assert {str(e.host): e for e in parsed.hosts} == {str(e.host): e for e in entries if e.allow or e.deny or not e.inspect}


@pytest.mark.parametrize(("rules", "opaque", "message"), [
    (["api.github.com GET /x"], [], "--egress-rule 'api.github.com GET /x': write HOST allow|deny METHOD PATH"),
    (["api.github.com permit GET /x"], [], "write HOST allow|deny METHOD PATH"),
    (["api.github.com allow get /x"], [], "write GET"),
    (["* allow GET /x"], [], "--egress-rule '* allow GET /x': allow pattern '*' matches every host"),
    (["api.github.com allow GET /x"], ["api.github.com"], "--no-inspect 'api.github.com': the host has --egress-rule"),
    ([], ["*.com"], "--no-inspect '*.com': allow pattern '*.com' would match every site"),
])
def test_bad_gate_flags(rules: list[str], opaque: list[str], message: str) -> None:
    with pytest.raises(InvalidRule) as caught:
        policy_from_flags(rules, opaque)
    assert message in str(caught.value)


def test_path_errors_are_path_errors() -> None:
    with pytest.raises(PathError):
        path_readings("/a/../b")


def test_long_paths_against_many_wildcards_take_linear_time() -> None:
    import time

    policy = RequestPolicy((make_host_rules("x.example.com", allow=["GET /**/a/**/b/**/c/**/d"]),))
    path = "/" + "/".join(["a", "b", "c"] * 3000) + "/e"
    started = time.monotonic()
    assert not policy.decide("GET", "x.example.com", 443, path).allow
    assert policy.decide("GET", "x.example.com", 443, path[:-1] + "d").allow
    assert time.monotonic() - started < 2.0


# --- what lenient servers make of a request -----------------------------------------------------------------

LENIENT = RequestPolicy((
    make_host_rules("api.example.com", allow=["GET /repos/**", "GET /user", "HEAD /**"],
                    deny=["* /repos/*/*/hooks", "* /admin/**"]),
    make_host_rules("open.example.com", deny=["DELETE /**", "* /admin"]),
))


@pytest.mark.parametrize(("host", "path", "allow", "reason"), [
    # ';' segment parameters, as Tomcat, Jetty and Spring cut them
    ("api.example.com", "/repos/o/r;x=1/hooks", False, "rule \"deny * /repos/*/*/hooks\""),
    ("api.example.com", "/repos/o/r/hooks;x=1", False, "rule \"deny * /repos/*/*/hooks\" (read as a lenient server"),
    ("api.example.com", "/repos;a/o/r", False, "matches no allow rule"),  # allow rules match as written too
    ("open.example.com", "/admin;jsessionid=1", False, "rule \"deny * /admin\" (read as a lenient server"),
    ("open.example.com", "/admin%3B", False, "rule \"deny * /admin\" (read as a lenient server"),
    ("open.example.com", "/x/..;/admin", False, "dot segment once its ';' parameters are cut ('..;')"),
    ("open.example.com", "/x/;/admin", False, "empty segment once its ';' parameters are cut"),
    ("open.example.com", "/a;b/c", True, "matches no deny rule"),
    # a trailing slash dropped
    ("open.example.com", "/admin/", False, "rule \"deny * /admin\" (read as a lenient server"),
    ("api.example.com", "/repos/o/r/hooks/", False, "rule \"deny * /repos/*/*/hooks\""),
    ("api.example.com", "/user/", False, "matches no allow rule"),  # as before: the written path is not allowed
    ("api.example.com", "/repos/o/", True, "allow GET /repos/**"),
    ("api.example.com", "/repos/..;/admin", False, "'..;'"),
    ("api.example.com", "/repos/x;/y", True, "allow GET /repos/**"),
    ("api.example.com", "/", False, "matches no allow rule"),
    # a last segment's '.' suffix cut (Rails' optional .format, Spring's suffix patterns)
    ("open.example.com", "/admin.json", False, "rule \"deny * /admin\" (read as a lenient server"),
    ("open.example.com", "/admin.tar.gz", False, "rule \"deny * /admin\" (read as a lenient server"),
    ("open.example.com", "/admin;x.json/", False, "rule \"deny * /admin\" (read as a lenient server"),
    ("api.example.com", "/repos/o/r/hooks.xml", False, "rule \"deny * /repos/*/*/hooks\""),
    ("api.example.com", "/user.json", False, "matches no allow rule"),  # allow rules match as written only
    ("api.example.com", "/repos/o/r.git", True, "allow GET /repos/**"),
    ("open.example.com", "/x/.admin", True, "matches no deny rule"),  # nothing before the dot: no cut
    ("open.example.com", "/x/..admin", True, "matches no deny rule"),
    # letter case: deny rules in any case, allow rules exactly
    ("open.example.com", "/ADMIN", False, "rule \"deny * /admin\" (the path in another letter case)"),
    ("api.example.com", "/Admin/x", False, "rule \"deny * /admin/**\" (the path in another letter case)"),
    ("api.example.com", "/REPOS/o/r", False, "matches no allow rule"),
    ("api.example.com", "/repos/O/R/HOOKS", False, "rule \"deny * /repos/*/*/hooks\""),
])
def test_paths_are_judged_as_a_lenient_server_routes_them(host: str, path: str, allow: bool, reason: str) -> None:
    decision = LENIENT.decide("GET", host, 443, path)
    assert decision.allow is allow, decision.reason
    assert reason in decision.reason


@pytest.mark.parametrize(("method", "overrides", "allow", "reason"), [
    ("GET", ("DELETE",), False, "DELETE matches no allow rule of [[egress]] api.example.com"),
    ("GET", ("delete",), False, "DELETE matches no allow rule"),  # frameworks upper-case it
    ("GET", ("GET",), True, "allow GET /repos/**"),
    ("GET", ("get", "HEAD"), True, "allow GET /repos/**"),
    ("HEAD", ("PUT",), False, "PUT matches no allow rule"),
    ("GET", ("DELETE, GET",), False, "names no HTTP method"),
    ("GET", ("",), False, "names no HTTP method"),
])
def test_a_method_override_is_judged_as_the_method_it_names(method: str, overrides: tuple[str, ...], allow: bool,
                                                            reason: str) -> None:
    decision = LENIENT.decide(method, "api.example.com", 443, "/repos/o/r", overrides)
    assert decision.allow is allow, decision.reason
    assert reason in decision.reason
    if not allow and "names no" not in reason:
        assert decision.reason.endswith("(the method a method override names)")


def test_a_method_override_on_a_deny_only_host_and_on_a_host_without_rules() -> None:
    assert not LENIENT.decide("POST", "open.example.com", 443, "/x", ("DELETE",)).allow
    assert LENIENT.decide("POST", "open.example.com", 443, "/x", ("PATCH",)).allow
    assert LENIENT.decide("GET", "elsewhere.example.com", 443, "/x", ("DELETE", "not a method")).allow


def test_a_posts_body_override_is_judged_as_the_method_it_names() -> None:
    refused = LENIENT.decide("POST", "open.example.com", 443, "/x", body_method_overrides([(b"content-type", FORM)], b"_method=DELETE"))
    assert not refused.allow and refused.reason == (
        'DELETE refused by [[egress]] open.example.com rule "deny DELETE /**" (the method a method override names)')
    assert LENIENT.decide("POST", "open.example.com", 443, "/x", body_method_overrides([(b"content-type", FORM)], b"_method=PATCH")).allow


@pytest.mark.parametrize(("host", "paths", "allow", "reason"), [
    ("open.example.com", ("/admin",), False, 'rule "deny * /admin" (the path an X-Original-URL or X-Rewrite-URL'),
    ("open.example.com", ("/x", "/ADMIN;a/"), False, "(read as a lenient server routes it"),
    ("api.example.com", ("/orgs/o",), False, "matches no allow rule of [[egress]] api.example.com (allowed:"),
    ("api.example.com", ("/admin/x",), False, 'rule "deny * /admin/**" (the path an X-Original-URL'),
    ("api.example.com", ("/repos/x/..;/y",), False, "('..;') (the path an X-Original-URL or X-Rewrite-URL header"),
    ("api.example.com", ("https://api.example.com/user",), False, "not an origin-form path"),
    ("api.example.com", ("/repos/o/r?x=1", "/repos/a"), True, "allow GET /repos/**"),
    ("open.example.com", ("/x",), True, "matches no deny rule"),
    ("elsewhere.example.com", ("/admin", "not a path"), True, "has no request rules"),
])
def test_a_path_override_is_judged_as_the_path_it_names(host: str, paths: tuple[str, ...], allow: bool,
                                                        reason: str) -> None:
    decision = LENIENT.decide("GET", host, 443, "/repos/o/r", paths=paths)
    assert decision.allow is allow, decision.reason
    assert reason in decision.reason
    if "origin-form" in reason:
        assert decision.status == 400


def test_head_is_judged_as_get_by_deny_rules() -> None:
    """Rails, Express, Flask, Spring and Go run a GET route's handler for HEAD: a deny rule for GET covers it,
    and an allow rule for GET still does not (HEAD needs its own)."""
    policy = RequestPolicy((make_host_rules("h.example.com", allow=["HEAD /**", "GET /public/**"],
                                            deny=["GET /secret/**"]),
                            make_host_rules("d.example.com", deny=["GET /secret/**"])))
    for host, method, overrides in (("h.example.com", "HEAD", ()), ("d.example.com", "HEAD", ()),
                                    ("d.example.com", "POST", ("head",))):
        refused = policy.decide(method, host, 443, "/secret/x", overrides)
        assert not refused.allow and refused.reason.startswith(f'GET refused by [[egress]] {host} rule "deny GET '
                                                               '/secret/**"'), refused.reason
        assert refused.reason.endswith("(HEAD, which servers route as GET)")
        assert policy.decide(method, host, 443, "/public/x", overrides).allow
    assert policy.decide("HEAD", "h.example.com", 443, "/x").reason == (
        'HEAD allowed by [[egress]] h.example.com rule "allow HEAD /**"')
    assert not policy.decide("HEAD", "h.example.com", 443, "/SECRET/x").allow  # in any letter case, as deny rules
    assert not policy.decide("GET", "h.example.com", 443, "/x").allow  # allow rules: GET is not HEAD


def test_lenient_readings() -> None:
    assert lenient_readings((b"a", b"b")) == ()
    assert lenient_readings((b"",)) == ()
    assert lenient_readings((b"a", b"b.c.d")) == (((b"a", b"b"), True), ((b"a", b"b.c"), True))
    assert lenient_readings((b"a", b".b")) == ()
    assert lenient_readings((b"a;x", b"b;y=1", b"")) == (((b"a", b"b", b""), False), ((b"a;x", b"b;y=1"), True),
                                                          ((b"a", b"b"), True))
    with pytest.raises(PathError, match=r"'\.\.;'"):
        lenient_readings((b"..;", b"x"))
