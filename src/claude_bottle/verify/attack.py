"""The one shape of a ``verify`` attack, shared by the probe in the bottle's network namespace and by the
attacks ``verify`` runs from the host: an attack names itself (its group, its name, what must happen), runs
against a target, and judges what came back; its ``Outcome`` is what the report shows.

Standard library only: the probe imports this in the gate image.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Generic, TypeVar

Target = TypeVar("Target")
Result = TypeVar("Result")
# An attack's judgment: what happened, whether it was blocked, and (optionally) the evidence, what came back,
# which verify searches for the credential on the host.
Verdict = tuple[str, bool] | tuple[str, bool, str]


@dataclass
class Outcome:
    """One attack as reported: ``blocked`` False is a leak. ``evidence`` is never reported."""

    group: str
    attack: str
    expected: str
    actual: str
    blocked: bool
    evidence: str = ""


@dataclass(frozen=True)
class Attack(abc.ABC, Generic[Target, Result]):
    """One attack: the ``group`` it is reported under, its ``name``, and what must happen (``expected``);
    ``run`` makes it against a target, ``judge`` says what came of it."""

    group: str
    name: str
    expected: str

    @abc.abstractmethod
    def run(self, target: Target) -> Result:
        """Make the attack against ``target``: what came back, for ``judge``."""

    @abc.abstractmethod
    def judge(self, target: Target, result: Result) -> Verdict:
        """What ``result`` means: what happened, and whether the attack was blocked."""

    def outcome(self, target: Target) -> Outcome:
        """The attack made against ``target`` and judged."""
        return self.judged(self.judge(target, self.run(target)))

    def judged(self, verdict: Verdict) -> Outcome:
        return Outcome(self.group, self.name, self.expected, verdict[0], verdict[1],
                       verdict[2] if len(verdict) > 2 else "")
