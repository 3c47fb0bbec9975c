"""A run kept on the host by an earlier version: its audit lines carry no `version` and lack the fields `tunnel`
and `unlisted`, whose facts were then in the reason only. `logs` and `policy suggest` still read it as they did,
and never read a versioned line's reason."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from claude_bottle import logview, records, suggest
from claude_bottle.cli import cli
from claude_bottle.errors import DockerError
from claude_bottle.gate.audit import VERSION
from claude_bottle.runtime import engines

# As the gate wrote them before the audit had those fields (one learning run, then a strict one).
EARLIER: list[dict[str, Any]] = [
    {"time": "2026-11-24T10:00:00.001Z", "listener": "proxy", "client": "10.0.0.2:41470", "method": "GET",
     "target": "files.example.org:443", "decision": "allow",
     "reason": "learn mode: files.example.org:443 is not in the allowlist (would deny); 192.0.2.7 is a global "
               "address; files.example.org:443 has no request rules: any method and path",
     "status": 200, "path": "/simple/x/", "would_deny": True, "bytes_up": 0, "bytes_down": 181, "duration_ms": 1.5},
    {"time": "2026-11-24T10:00:00.002Z", "listener": "proxy", "client": "10.0.0.2:41494", "method": "CONNECT",
     "target": "git.example.com:22", "decision": "allow",
     "reason": "git.example.com:22 matches allow-tcp pattern git.example.com:22; 192.0.2.1 is a global address; "
               "raw TCP allowed; closed idle tunnel",
     "status": 200, "bytes_up": 76, "bytes_down": 294, "duration_ms": 3.7},
    {"time": "2026-11-24T10:00:00.003Z", "listener": "proxy", "client": "10.0.0.2:54046", "method": "CONNECT",
     "target": "other.example:8443", "decision": "deny", "reason": "other.example:8443 is not in the allowlist",
     "status": 403, "bytes_up": 0, "bytes_down": 0, "duration_ms": 0.3},
    {"time": "2026-11-24T10:00:00.004Z", "listener": "proxy", "client": "10.0.0.2:54050", "method": "CONNECT",
     "target": "10.0.0.5:443", "decision": "deny", "reason": "10.0.0.5 is a private address (RFC 1918); refused",
     "status": 403, "bytes_up": 0, "bytes_down": 0, "duration_ms": 0.3},
]


@pytest.fixture
def kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """The earlier run, kept in this test's state folder; no engine."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))

    def no_engine() -> None:
        raise DockerError("no engine")

    monkeypatch.setattr(engines, "connect", no_engine)
    records.save("dev-old", "dev", str(tmp_path / "project"), "t", [json.dumps(line).encode() + b"\n"
                                                                       for line in EARLIER])
    return "dev-old"


def test_an_earlier_line_gets_the_fields_its_reason_stated() -> None:
    learned, raw, unlisted, guarded = map(records.current, EARLIER)
    assert learned == EARLIER[0], "nothing to fill in"
    assert raw["tunnel"] == "raw_tcp" and "unlisted" not in raw
    assert unlisted["unlisted"] is True and "tunnel" not in unlisted
    assert guarded == EARLIER[3]


def test_a_line_with_a_version_is_read_by_its_fields_alone() -> None:
    """The same lines as a current gate would write them had their reasons that wording: nothing is added."""
    versioned = [{"version": VERSION, **line} for line in EARLIER]
    assert [records.current(line) is line for line in versioned] == [True] * len(EARLIER)
    assert not suggest.suggest(versioned).destinations["git.example.com:22"].raw_tcp
    assert logview.offer(versioned[2], "dev") is None


def test_policy_suggest_reads_an_earlier_run(kept: str) -> None:
    out = CliRunner().invoke(cli, ["policy", "suggest", "--run", kept])
    assert out.exit_code == 0, out.output
    assert 'allow_tcp = ["git.example.com:22"]' in out.output
    assert 'host = "files.example.org"' in out.output and 'allow = ["GET /simple/x/"]' in out.output
    assert "other.example:8443: other.example:8443 is not in the allowlist" in out.output
    found = suggest.suggest(EARLIER)
    assert [d.entry for d in found.learned] == ["files.example.org"]
    assert found.destinations["git.example.com:22"].raw_tcp


def test_logs_reads_an_earlier_run_and_offers_to_allow_what_the_allowlist_lacked(kept: str) -> None:
    table = CliRunner().invoke(cli, ["logs", "--run", kept]).output.splitlines()
    assert [row.split()[1] for row in table[1:]] == ["would_deny", "allow", "deny", "deny"]
    assert [logview.offer(line, "dev") for line in EARLIER] == [
        None, None, "  -> to allow it now: claude-bottle allow dev other.example:8443 (add --save to keep it)", None]
