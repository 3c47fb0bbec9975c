"""The one shape of a ``verify`` attack, shared by the probe in the bottle's network namespace and by the
attacks ``verify`` runs from the host: an attack names itself (its group, its name, what must happen), runs
against a target, and judges what came back; its ``Outcome`` is what the report shows.

Standard library only: the probe imports this in the gate image.
"""

from __future__ import annotations

import abc
import enum
import json
from dataclasses import asdict, dataclass, field
from typing import Any, Generic, TypeVar

Target = TypeVar("Target")
Result = TypeVar("Result")
# An attack's judgment: what happened, whether it was blocked, and (optionally) the evidence, what came back,
# which verify searches for the credential on the host.
Verdict = tuple[str, bool] | tuple[str, bool, str]


class Proof(enum.Enum):
    """What, beyond the credential search every outcome gets, settles an attack's outcome on the host, for
    the attacks whose judgment where they ran does not (the probe's cannot see the upstream)."""

    ANSWER = "answer"  # what came back (the evidence) is the proof: the credential is not in it
    UPSTREAM_NEVER_GOT = "upstream-never-got"  # the stub upstream never got ``Outcome.forbidden``
    UPSTREAM_GOT_REAL_CREDENTIAL = "upstream-got-real-credential"  # never the attacker's key, the real one instead
    NAME_LOOKUP = "name-lookup"  # no address back proves little where the name resolves nowhere: said so


@dataclass
class Outcome:
    """One attack as reported: ``blocked`` False is a leak. ``evidence`` is never reported. ``proof``: what
    settles it on the host, if anything does beyond the credential search; ``forbidden``: for
    ``Proof.UPSTREAM_NEVER_GOT``, the request field or server-tool type that must never reach the upstream."""

    group: str
    attack: str
    expected: str
    actual: str
    blocked: bool
    evidence: str = ""
    proof: Proof | None = None
    forbidden: str = ""

    def to_json(self) -> str:
        """One JSON line (the probe's output); ``from_json`` reads it back."""
        return json.dumps({**asdict(self), "proof": self.proof.value if self.proof is not None else None})

    @classmethod
    def from_json(cls, line: str) -> Outcome:
        data: dict[str, Any] = json.loads(line)
        proof = data.pop("proof", None)
        return cls(**data, proof=Proof(proof) if proof is not None else None)


@dataclass(frozen=True)
class Attack(abc.ABC, Generic[Target, Result]):
    """One attack: the ``group`` it is reported under, its ``name``, and what must happen (``expected``);
    ``run`` makes it against a target, ``judge`` says what came of it. ``proof`` and ``forbidden`` go into its
    ``Outcome`` as they are."""

    group: str
    name: str
    expected: str
    proof: Proof | None = field(default=None, kw_only=True)
    forbidden: str = field(default="", kw_only=True)

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
                       verdict[2] if len(verdict) > 2 else "", self.proof, self.forbidden)
