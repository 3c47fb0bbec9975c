"""The judging and reporting of `verify`, and the probe's socket oracles on loopback."""

from __future__ import annotations

import base64
import dataclasses
import json
import socket
import struct
import threading
from collections.abc import Callable, Iterator

import pytest

from claude_bottle.agent.schema import AgentConfig
from claude_bottle.credentials import Credential
from claude_bottle.verify import gate_requests, packets, probe
from claude_bottle.verify.attack import Outcome, Proof
from claude_bottle.verify.checks import BOTTLE_CHECKS, FILE_SEARCH, judged_for_each
from claude_bottle.verify.inspected import CONTROLS, INSPECTED_ATTACKS, Inspecting, Sent
from claude_bottle.verify.network import judged_by_evidence, resolvable_name
from claude_bottle.verify.report import as_json, report
from claude_bottle.verify.standins import HostCanary, StandIn, Verification
from tests.fake_engine import FakeEngine

SECRET = "sk-ant-oat01-secret-value"


def check(attack: str):  # type: ignore[no-untyped-def]
    return next(c for c in (*BOTTLE_CHECKS, FILE_SEARCH) if c.name == attack)


def test_a_credential_anywhere_in_the_output_is_a_leak() -> None:
    judge = check("environment variables").judge_value
    assert judge(0, f"HOME=/home/agent\nX={SECRET}\n", SECRET) == ("the credential is in the environment", False)
    assert judge(0, "HOME=/home/agent\n", SECRET) == ("not in the environment", True)


def test_every_held_value_is_searched_for() -> None:
    route_value = "tracker-value-0123456789abcdef"
    env = check("environment variables")
    assert judged_for_each(env, 0, f"T={route_value}\n", (SECRET, route_value)) == (
        "the credential is in the environment", False)
    assert judged_for_each(env, 0, "HOME=/home/agent\n", (SECRET, route_value)) == ("not in the environment", True)


def test_status_fields_must_have_the_safe_value() -> None:
    status = "Name:\tbash\nCapEff:\t0000000000000000\nCapBnd:\t000001ffffffffff\nNoNewPrivs:\t0\n"
    assert check("effective capabilities").judge_value(0, status, SECRET) == ("CapEff 0000000000000000", True)
    assert check("bounding capabilities").judge_value(0, status, SECRET) == ("CapBnd 000001ffffffffff", False)
    setpriv = "uid: 1000\nno_new_privs: {}\nInheritable capabilities: [none]\n"
    assert check("no-new-privileges").judge_value(0, setpriv.format(0), SECRET) == ("no_new_privs 0", False)
    assert check("no-new-privileges").judge_value(0, setpriv.format(1), SECRET) == ("no_new_privs 1", True)
    assert check("no-new-privileges").judge_value(0, "", SECRET) == ("no_new_privs missing", False)


def test_anything_found_is_a_leak_and_nothing_found_is_not() -> None:
    search = check("a search of the whole file system and home directory").judge_value
    assert search(1, "", SECRET) == ("not found", True)
    assert search(0, "/home/agent/.bash_history\n", SECRET) == ("found in: /home/agent/.bash_history", False)
    assert check("setuid and setgid programs").judge_value(0, "/usr/bin/su\n", SECRET)[1] is False


def test_a_write_that_works_is_a_leak() -> None:
    hook = check("write a hook into the workspace's .git/hooks").judge_value
    assert hook(0, "", SECRET) == ("it worked", False)
    assert hook(1, "bash: line 1: /workspace/.git/hooks/pre-commit: Read-only file system\n", SECRET)[1] is True


def test_the_gate_must_not_show_in_the_process_list() -> None:
    judge = check("the process list").judge_value
    assert judge(0, "PID USER ARGS\n1 agent sleep infinity\n", SECRET) == ("1 processes, none of the gate's", True)
    shown = judge(0, "PID USER ARGS\n7 10001 python -m claude_bottle gate --token-file -\n", SECRET)
    assert shown[1] is False and "claude_bottle gate" in shown[0]


OUTCOMES = [
    Outcome("direct egress", "TCP to 1.1.1.1:443", "no packet gets there", "no answer (timed out)", True),
    Outcome("egress proxy", "CONNECT to x", "refused", "HTTP/1.1 200 Connection established", False, "evidence"),
]


def test_the_report_says_which_attack_leaked() -> None:
    text = report(OUTCOMES)
    assert "DIRECT EGRESS" in text and "EGRESS PROXY" in text
    assert "  LEAK     CONNECT to x" in text and "  blocked  TCP to 1.1.1.1:443" in text
    assert text.endswith("2 attacks: 1 LEAKED")
    assert report(OUTCOMES[:1]).endswith("1 attacks: every one blocked")


def test_the_report_escapes_what_an_answer_quoted() -> None:
    quoted = dataclasses.replace(OUTCOMES[1], actual="HTTP/1.1 200 \x1b]52;c;Y3VybCB4\x07\nFORGED blocked")
    text = report([quoted])
    assert "\x1b" not in text and "\x07" not in text and "\nFORGED" not in text
    assert "\\x1b]52;c;Y3VybCB4\\x07\\nFORGED blocked" in text


def test_the_json_report_leaves_out_the_evidence() -> None:
    data = json.loads(as_json(AgentConfig(name="x"), OUTCOMES))
    assert (data["agent"], data["attacks"], data["leaks"]) == ("x", 2, 1)
    assert all(set(r) == {"group", "attack", "expected", "actual", "blocked"} for r in data["results"])


def test_an_outcome_comes_back_from_the_probe_as_it_went() -> None:
    sent = Outcome("API route", "a", "refused before the upstream", "HTTP/1.1 403", True, "raw",
                   Proof.UPSTREAM_NEVER_GOT, "mcp_servers")
    assert Outcome.from_json(sent.to_json()) == sent
    assert Outcome.from_json(OUTCOMES[1].to_json()) == OUTCOMES[1]


def test_the_host_canary_counts_what_arrives() -> None:
    canary = HostCanary()
    try:
        assert canary.arrivals() == []
        with socket.create_connection(("127.0.0.1", canary.port), 2):
            pass
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
            udp.sendto(b"x", ("127.0.0.1", canary.port))
        arrived = canary.arrivals()
        assert sorted(arrived) == ["TCP from 127.0.0.1", "UDP from 127.0.0.1"]
    finally:
        canary.close()


def closed_port(kind: int) -> int:
    with socket.socket(socket.AF_INET, kind) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_a_refusal_means_the_packet_got_there() -> None:
    assert packets.tcp("127.0.0.1", closed_port(socket.SOCK_STREAM)) == ("refused by the peer: the packet got there",
                                                                         False)
    assert packets.udp("127.0.0.1", closed_port(socket.SOCK_DGRAM), b"x")[1] is False


def test_dns_query_is_a_well_formed_question() -> None:
    query = packets.dns_query("example.com")
    assert struct.unpack("!HHHHHH", query[:12])[2] == 1
    assert query[12:] == b"\x07example\x03com\x00\x00\x01\x00\x01"


def answer_to(query: bytes, rcode: int, records: int) -> bytes:
    """A resolver's answer to ``query`` with this rcode and this many (empty) answer records."""
    return query[:2] + struct.pack("!HHHHH", 0x8180 | rcode, 1, records, 0, 0) + query[12:]


@pytest.mark.parametrize(("rcode", "records", "blocked", "words"), [
    (0, 1, False, "resolved: 1 record(s) in the answer"),  # an address came back: the resolver forwards
    (3, 0, True, "answered NXDOMAIN, no address"),
    (2, 0, True, "answered SERVFAIL, no address"),
    (5, 0, True, "answered REFUSED, no address"),
])
def test_a_resolver_is_judged_by_whether_an_address_comes_back(rcode: int, records: int, blocked: bool,
                                                               words: str) -> None:
    query = packets.dns_query("registry.npmjs.org")
    assert packets.dns_answer(query, answer_to(query, rcode, records)) == (words, blocked)
    assert packets.dns_answer(query, b"\x00\x01" + answer_to(query, 0, 1)[2:])[1] is True  # not the answer to it


def test_a_lookup_straight_to_a_resolver_that_answers_is_a_leak() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as resolver:
        resolver.bind(("127.0.0.1", 0))

        def answer() -> None:
            query, peer = resolver.recvfrom(512)
            resolver.sendto(answer_to(query, 0, 1), peer)

        thread = threading.Thread(target=answer, daemon=True)
        thread.start()
        assert packets.lookup("127.0.0.1", "pypi.org", resolver.getsockname()[1]) == ("resolved: 1 record(s) in the "
                                                                                   "answer", False)
        thread.join(5)
    assert packets.lookup("127.0.0.1", "pypi.org", closed_port(socket.SOCK_DGRAM)) == (
        "refused by the peer: no resolver there", True)


def test_the_name_looked_up_is_one_this_host_resolves_when_there_is_one() -> None:
    assert resolvable_name(("claude-bottle-nowhere.invalid", "localhost")) == ("localhost", True)
    assert resolvable_name(("claude-bottle-nowhere.invalid",), 2) == ("claude-bottle-nowhere.invalid", False)


@pytest.fixture
def refusing_server() -> Iterator[int]:
    server = socket.create_server(("127.0.0.1", 0))

    def answer() -> None:
        conn, _ = server.accept()
        with conn:
            conn.recv(65536)
            conn.sendall(b"HTTP/1.1 403 Forbidden\r\nX-Deny-Reason: not in the allowlist\r\nContent-Length: 0\r\n\r\n")

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    yield int(server.getsockname()[1])
    thread.join(5)
    server.close()


def test_a_refusal_from_the_gate_is_judged_blocked_with_its_reason(refusing_server: int) -> None:
    status, received = gate_requests.exchange("127.0.0.1", refusing_server, gate_requests.connect("example.com:443"))
    assert status == 403
    assert gate_requests.judged(status, received) == ("HTTP/1.1 403 Forbidden (not in the allowlist)", True)


def test_an_answer_the_gate_fetched_is_not_blocked() -> None:
    assert gate_requests.judged(200, b"HTTP/1.1 200 Connection established\r\n\r\n")[1] is False
    assert gate_requests.judged(502, b"HTTP/1.1 502 Bad Gateway\r\n\r\n")[1] is False  # the gate dialled
    assert gate_requests.judged(None, b"") == ("connection closed without an answer", True)


TARGETS = {"gate": "10.0.0.2", "api_port": 8080, "proxy_port": 3128, "canary_ip": "10.1.0.3", "canary_port": 8000,
           "private_name": "canary:8000", "api_host": "stub:8000", "unlisted_host": "exfiltrate.example",
           "attacker_key": "k", "host_port": 1, "host_addresses": ["172.17.0.1"], "public_ipv4": ["1.1.1.1"],
           "public_ipv6": ["2606:4700:4700::1111"], "front_host": "front", "front_port": 8000,
           "header_timeout": 30, "max_connections": 512, "dns_name": "pypi.org", "resolvers": ["10.0.0.2"],
           "host_loopback": ["10.0.2.2"]}


def test_the_suite_covers_every_group() -> None:
    targets = TARGETS
    suite = probe.attacks(targets)
    assert {a.group for a in suite} == {"direct egress", "egress proxy", "API route"}
    assert len({a.name for a in suite}) == len(suite), "attack names are unique"


def stub_logging(*requests: dict[str, object]) -> StandIn:
    """The stub upstream on an engine in memory, its log one JSON line per request it received."""
    engine = FakeEngine()
    lines = "\n".join(json.dumps({"method": "POST", "headers": [], **r}) for r in requests)
    engine.add_container("stub", {}, output=("stub upstream on http://stub:8000\n" + lines).encode())
    return StandIn(engine, "stub", "10.0.0.3")


@pytest.mark.parametrize(("attack", "received", "blocked", "words"), [
    ("the provider connects out for the bottle: mcp_servers", {"fields": ["mcp_servers", "model"]}, False,
     "the upstream got mcp_servers"),
    ("the provider connects out for the bottle: mcp_servers", {"fields": ["model"], "tool_types": []}, True,
     "the upstream never got it"),
    ("the provider fetches a URL for the bottle: web_fetch_20250910",
     {"fields": ["tools"], "tool_types": ["web_fetch_20250910"]}, False, "the upstream got web_fetch_20250910"),
    ("the provider fetches a URL for the bottle: web_fetch_20250910",
     {"fields": ["tools"], "tool_types": ["web_search_20250305"]}, True, "never got it"),
])
def test_a_provider_side_fetch_is_judged_by_what_the_upstream_received(
    attack: str, received: dict[str, object], blocked: bool, words: str
) -> None:
    target = Verification.__new__(Verification)
    target.credential = Credential.parse("sk-ant-oat01-" + "s" * 60, "t")
    target.stub = stub_logging(received)
    forbidden = attack.rsplit(" ", 1)[-1]
    outcome = Outcome("API route", attack, "refused before the upstream", "HTTP/1.1 403 Forbidden", True,
                      proof=Proof.UPSTREAM_NEVER_GOT, forbidden=forbidden)
    judged = judged_by_evidence(target, outcome)
    assert judged.blocked is blocked and words in judged.actual
    reworded = dataclasses.replace(outcome, attack="reworded", expected="reworded")
    assert judged_by_evidence(target, reworded).blocked is blocked, "judged by its proof, not by its words"


def test_the_probe_names_what_the_upstream_must_never_get() -> None:
    suite = probe.attacks(TARGETS)
    refused = [a for a in suite if a.proof is Proof.UPSTREAM_NEVER_GOT]
    assert len(refused) == 3 and all(a.forbidden and a.name.endswith(a.forbidden) for a in refused)
    assert {a.proof for a in suite} == {None, *Proof}


@pytest.mark.parametrize("answer", [
    lambda secret: b"HTTP/1.1 200 Bearer %b\r\n\r\n" % secret,  # in the status line, as is
    lambda secret: b"HTTP/1.1 200 OK\r\nx-%b: 1\r\n\r\n" % secret.hex().encode(),  # a header named in hex
    lambda secret: b"HTTP/1.1 200 OK\r\n\r\n%b" % base64.b64encode(secret),
], ids=["status-line", "header-name-hex", "body-base64"])
def test_the_credential_sent_back_in_any_form_is_a_leak(answer: Callable[[bytes], bytes]) -> None:
    target = Verification.__new__(Verification)
    target.credential = Credential.parse("sk-ant-oat01-" + "s_" * 30, "t")
    outcome = Outcome("API route", "an upstream reflecting the credential", "the credential never comes back",
                      "HTTP/1.1 200 OK", True, answer(target.credential.secret.encode()).decode(), Proof.ANSWER)
    assert judged_by_evidence(target, outcome).blocked is False
    safe = judged_by_evidence(target, dataclasses.replace(outcome, evidence="HTTP/1.1 200 OK\r\n\r\n"))
    assert safe.blocked is True


def test_an_attack_inside_tls_must_be_refused_with_its_status_and_a_reason() -> None:
    target = Inspecting(Verification.__new__(Verification))
    dlp = INSPECTED_ATTACKS[0]
    assert dlp.judged(dlp.judge(target, Sent(403, "held-secret", False, "s3cret"))) == Outcome(
        "inspected https", dlp.name, "refused (DLP)", "HTTP 403 (held-secret)", True)
    assert dlp.judge(target, Sent(404, "", False, "s3cret")) == ("HTTP 404", False)
    assert dlp.judge(target, Sent(403, "held-secret", True, "s3cret")) == ("the stand-in got it (HTTP 403 "
                                                                          "(held-secret))", False)
    assert dlp.judge(target, Sent(403, "quoted s3cret", False, "s3cret")) == ("the refusal quotes the secret", False)


def test_a_refusal_proves_nothing_when_the_controls_did_not_arrive() -> None:
    control = CONTROLS[0]
    assert control.judge(Inspecting(Verification.__new__(Verification)), Sent(404, "", True, "")) == (
        "answered 404", True)
    assert control.judge(Inspecting(Verification.__new__(Verification)), Sent(None, "timed out", False, ""))[1] is False
    unproven = Inspecting(Verification.__new__(Verification), controls_arrived=False)
    assert INSPECTED_ATTACKS[0].judge(unproven, Sent(403, "held-secret", False, "s3cret")) == (
        "inconclusive: the control did not arrive either (HTTP 403 (held-secret))", False)


def test_a_probe_attack_reports_what_its_oracle_said() -> None:
    sent = probe.Probe("direct egress", "TCP somewhere", "no packet gets there", lambda: ("timed out", True, "raw"))
    assert probe.run_one(sent) == Outcome("direct egress", "TCP somewhere", "no packet gets there", "timed out",
                                          True, "raw")
    assert probe.Probe("g", "a", "e", lambda: ("connected", False)).outcome(None).evidence == ""
