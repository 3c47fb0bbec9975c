"""A missing prerequisite skips a test visibly, and under CI fails it."""

from __future__ import annotations

import pytest

from tests.prerequisites import require


def test_a_present_prerequisite_lets_the_test_go_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", "true")
    require(True, "nothing")


def test_a_missing_prerequisite_skips_with_what_and_how(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match=r"^no engine \(scripts/x starts one\)$"):
        require(False, "no engine", "scripts/x starts one")


@pytest.mark.parametrize("value", ["true", "1"])
def test_under_ci_a_missing_prerequisite_fails(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("CI", value)
    with pytest.raises(pytest.fail.Exception, match=r"^no engine$"):
        require(False, "no engine")


def test_an_empty_ci_variable_is_not_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", "")
    with pytest.raises(pytest.skip.Exception):
        require(None, "no engine")
