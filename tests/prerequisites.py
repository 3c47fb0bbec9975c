"""What a test needs from the machine (an engine, a runtime, a tool), checked in one way everywhere: missing, the
test is skipped visibly with what is missing and how to get it; under CI (``CI`` set, as CI services set it) the
same is a failure, because there the setup promised it and a skip would pass silently."""

from __future__ import annotations

import os
from typing import NoReturn

import pytest


def under_ci() -> bool:
    """Whether a missing prerequisite fails the test rather than skipping it: ``CI`` set and not empty."""
    return bool(os.environ.get("CI"))


def missing(what: str, how: str = "") -> NoReturn:
    """Stop the test for a missing prerequisite: ``what`` is missing (with the cause, when there is one),
    ``how`` says what provides it (a script, a command; empty when nothing does). Skipped, or failed under CI."""
    message = f"{what} ({how})" if how else what
    if under_ci():
        pytest.fail(message)
    pytest.skip(message)


def require(present: object, what: str, how: str = "") -> None:
    """Continue when ``present`` is true; else :func:`missing` (skip visibly, fail under CI)."""
    if not present:
        missing(what, how)
