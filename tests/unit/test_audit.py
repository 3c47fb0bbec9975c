"""The audit log: one JSON line per record, fixed fields, and no secret ever written."""

from __future__ import annotations

import io
import json
import re

import pytest

from claude_bottle.gate.audit import REDACTED, VERSION, AuditLog, AuditRecord
from claude_bottle.policy.decide import Decision, RpcCall

SECRET = "sk-ant-oat01-Qw3rTy_uIoP-aSdFgHjKl0123456789"
FIELDS = ["version", "seq", "time", "listener", "client", "method", "target", "decision", "reason", "status", "bytes_up",
          "bytes_down", "duration_ms"]
FIELDS_WITH_PATH = [*FIELDS[:10], "path", *FIELDS[10:]]
TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")


def _lines(stream: io.StringIO) -> list[dict[str, object]]:
    text = stream.getvalue()
    assert text.endswith("\n")
    return [json.loads(line) for line in text.splitlines()]


def _record(**changes: object) -> AuditRecord:
    record = AuditRecord("proxy", "127.0.0.1:50000", "CONNECT", "example.com:443")
    for name, value in changes.items():
        setattr(record, name, value)
    return record


def test_one_line_with_fixed_fields() -> None:
    stream = io.StringIO()
    record = _record(bytes_up=10, bytes_down=20)
    record.decided(Decision(True, "example.com:443 matches allow pattern example.com"))
    record.status = 200
    AuditLog(stream).write(record)
    assert stream.getvalue().count("\n") == 1
    [entry] = _lines(stream)
    assert list(entry) == FIELDS
    assert TIME.fullmatch(str(entry["time"]))
    assert {k: v for k, v in entry.items() if k not in ("time", "duration_ms")} == {
        "version": VERSION,
        "seq": 1,
        "listener": "proxy",
        "client": "127.0.0.1:50000",
        "method": "CONNECT",
        "target": "example.com:443",
        "decision": "allow",
        "reason": "example.com:443 matches allow pattern example.com",
        "status": 200,
        "bytes_up": 10,
        "bytes_down": 20,
    }
    assert isinstance(entry["duration_ms"], float)
    assert 0 <= entry["duration_ms"] < 60_000


def test_path_only_when_set() -> None:
    stream = io.StringIO()
    log = AuditLog(stream)
    log.write(_record(listener="api", method="POST", target="api.anthropic.com:443", path="/v1/messages"))
    log.write(_record())
    with_path, without_path = _lines(stream)
    assert list(with_path) == FIELDS_WITH_PATH
    assert with_path["path"] == "/v1/messages"
    assert list(without_path) == FIELDS
    assert "path" not in without_path


def test_defaults_are_deny_with_status_zero() -> None:
    stream = io.StringIO()
    AuditLog(stream).write(_record())
    [entry] = _lines(stream)
    assert (entry["decision"], entry["reason"], entry["status"], entry["bytes_up"], entry["bytes_down"]) == (
        "deny", "", 0, 0, 0
    )


@pytest.mark.parametrize(
    ("started", "time"),
    [(0.5, "1970-01-01T00:00:00.500Z"), (1_700_000_000.25, "2023-11-14T22:13:20.250Z"),
     (86_400.0, "1970-01-02T00:00:00.000Z")],
    ids=["epoch", "2023", "day"],
)
def test_time_format(started: float, time: str) -> None:
    stream = io.StringIO()
    AuditLog(stream).write(_record(started=started))
    [entry] = _lines(stream)
    assert entry["time"] == time
    assert entry["duration_ms"] > 0


def test_lines_accumulate_one_per_record() -> None:
    stream = io.StringIO()
    log = AuditLog(stream)
    for i in range(5):
        log.write(_record(status=i))
    entries = _lines(stream)
    assert [e["status"] for e in entries] == [0, 1, 2, 3, 4]
    assert [e["seq"] for e in entries] == [1, 2, 3, 4, 5], "numbered: a log cut short shows what went before"


def test_reason_with_newline_stays_one_line() -> None:
    stream = io.StringIO()
    AuditLog(stream).write(_record(reason="line one\nline two\r\n", target="évil.example:443"))
    assert stream.getvalue().count("\n") == 1
    [entry] = _lines(stream)
    assert entry["reason"] == "line one\nline two\r\n"
    assert entry["target"] == "évil.example:443"


REDACT_CASES = [
    ("reason", f"upstream said {SECRET} back", f"upstream said {REDACTED} back"),
    ("reason", f"{SECRET}{SECRET}", REDACTED * 2),
    ("target", f"{SECRET}.example.com:443", f"{REDACTED}.example.com:443"),
    ("path", f"/v1/messages/{SECRET}", f"/v1/messages/{REDACTED}"),
    ("client", f"{SECRET}:1", f"{REDACTED}:1"),
    ("method", SECRET, REDACTED),
]


@pytest.mark.parametrize(("name", "value", "expected"), REDACT_CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(REDACT_CASES)])
def test_secret_redacted_everywhere(name: str, value: str, expected: str) -> None:
    stream = io.StringIO()
    AuditLog(stream, secrets=(SECRET,)).write(_record(**{name: value}))
    assert SECRET not in stream.getvalue()
    [entry] = _lines(stream)
    assert entry[name] == expected


def test_every_secret_redacted() -> None:
    other = "sk-ant-api03-" + "x" * 30
    stream = io.StringIO()
    AuditLog(stream, secrets=(SECRET, other)).write(_record(reason=f"{other} and {SECRET}"))
    [entry] = _lines(stream)
    assert entry["reason"] == f"{REDACTED} and {REDACTED}"


def test_empty_secret_is_ignored() -> None:
    stream = io.StringIO()
    AuditLog(stream, secrets=("",)).write(_record(reason="plain"))
    [entry] = _lines(stream)
    assert entry["reason"] == "plain"
    assert REDACTED not in stream.getvalue()


def test_no_stream_writes_nothing() -> None:
    AuditLog(None, secrets=(SECRET,)).write(_record(reason=SECRET))  # must not raise


def test_allow_and_deny() -> None:
    record = _record()
    record.decided(Decision(True, "ok"))
    assert (record.decision, record.reason, record.status) == ("allow", "ok", 0)
    record.deny("no", 403)
    assert (record.decision, record.reason, record.status) == ("deny", "no", 403)


def test_a_refusal_after_the_client_was_answered_keeps_that_status_and_the_earlier_reasons() -> None:
    record = _record()
    record.decided(Decision(True, "example.com:443 matches allow pattern example.com"))
    record.status = 200  # the tunnel's
    record.deny("no TLS ClientHello within 10s", 0)
    assert (record.decision, record.status) == ("deny", 200)
    assert record.reason == "example.com:443 matches allow pattern example.com; then refused: no TLS ClientHello within 10s"


@pytest.mark.parametrize(
    ("status_before", "status_arg", "status_after"),
    [(0, 502, 502), (200, 502, 200), (101, 504, 101)],
    ids=["unsent-takes-new", "sent-200-kept", "sent-101-kept"],
)
def test_fail_keeps_sent_status(status_before: int, status_arg: int, status_after: int) -> None:
    record = _record()
    record.decided(Decision(True, "example.com:443 matches allow pattern example.com"))
    record.status = status_before
    record.fail("upstream reset the connection", status_arg)
    assert record.decision == "error"
    assert record.status == status_after
    assert record.reason == "example.com:443 matches allow pattern example.com; then upstream reset the connection"


def test_unlisted_tunnel_and_side_only_when_set_after_the_decision_fields() -> None:
    stream = io.StringIO()
    log = AuditLog(stream)
    log.write(_record(rule="[dlp] x", would_deny=True, unlisted=True, tunnel="raw_tcp", side="upstream"))
    log.write(_record())
    full, plain = _lines(stream)
    assert list(full) == [*FIELDS[:10], "rule", "would_deny", "unlisted", "tunnel", "side", *FIELDS[10:]]
    assert (full["unlisted"], full["tunnel"], full["side"]) == (True, "raw_tcp", "upstream")
    assert list(plain) == FIELDS


def test_a_record_takes_decisions_and_keeps_its_reasons_in_order() -> None:
    record = _record()
    record.decided(Decision(True, "learned", learned=True, unlisted=True))
    record.passed(Decision(True, "address ok"))
    record.passed(Decision(True, "rule ok", rule="[[egress]] x allow GET /"))
    record.note("closed idle tunnel")
    assert (record.decision, record.reason, record.rule, record.would_deny, record.unlisted) == (
        "allow", "learned; address ok; rule ok; closed idle tunnel", "[[egress]] x allow GET /", True, True)
    record.fail("upstream stopped responding", 504, "upstream")
    assert (record.decision, record.status, record.side) == ("error", 504, "upstream")
    assert record.reason.endswith("; then upstream stopped responding")


def test_each_json_rpc_message_gets_a_line_after_its_request_and_one_not_sent_says_so() -> None:
    calls = (RpcCall("tracker", "tools/call", "get_issue", "allow", "MCP tool get_issue allowed", "r-allow"),
             RpcCall("tracker", "tools/call", "delete_issue", "deny", f"refused {SECRET}", "r-deny"),
             RpcCall("tracker", "notifications/initialized", "", "allow", "passes"))
    stream = io.StringIO()
    record = _record(method="POST", target="mcp.example.com:443", path="/mcp")
    record.decided(Decision(True, "allowed", calls=calls))
    record.deny("MCP tool delete_issue is refused (and 0 more)", 200, rule="r-deny")
    AuditLog(stream, secrets=(SECRET,)).write(record)
    request, *lines = _lines(stream)
    assert "calls" not in request and "mcp" not in request
    call_fields = [*FIELDS[:10], "path", "rule", "server", "tool"]
    assert [list(line) for line in lines] == [[f for f in call_fields if f != "rule"], call_fields,
                                              [f for f in call_fields if f not in ("rule", "tool")]]
    assert [(line["listener"], line["method"], line.get("tool"), line["decision"], line.get("rule"))
            for line in lines] == [("mcp", "tools/call", "get_issue", "deny", None),
                                   ("mcp", "tools/call", "delete_issue", "deny", "r-deny"),
                                   ("mcp", "notifications/initialized", None, "deny", None)]
    assert [line["seq"] for line in (request, *lines)] == [1, 2, 3, 4]
    assert lines[0]["reason"] == "not sent: its request was refused: MCP tool delete_issue is refused (and 0 more)"
    assert lines[1]["reason"] == f"refused {REDACTED}"
    assert all(line["time"] == request["time"] and line["status"] == 200 and line["path"] == "/mcp"
               and line["server"] == "tracker" and line["client"] == request["client"] for line in lines)


def test_an_allowed_request_keeps_its_messages_verdicts() -> None:
    stream = io.StringIO()
    record = _record(method="POST", target="mcp.example.com:443")
    record.decided(Decision(True, "allowed", calls=(RpcCall("t", "tools/call", "get_issue", "allow", "ok", "r"),)))
    AuditLog(stream).write(record)
    assert [(line["listener"], line["decision"], line.get("rule")) for line in _lines(stream)] == \
        [("proxy", "allow", None), ("mcp", "allow", "r")]
