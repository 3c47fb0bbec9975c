"""gate/ask.py's questions without a gate: sharing, the limit, the timeout, and an answer the policy refuses."""

from __future__ import annotations

import asyncio

import pytest

from claude_bottle.gate.ask import AskError, Asks
from claude_bottle.policy.hosts import Target

pytestmark = pytest.mark.asyncio


def asks(timeout: float = 5.0, limit: int = 2, decided: object = None) -> tuple[Asks, list[tuple[str, str]]]:
    seen: list[tuple[str, str]] = []

    def on_decided(question: object, answer: object) -> None:
        seen.append((answer.answer, answer.by))  # type: ignore[attr-defined]
        if decided is not None:
            raise AskError("the policy refuses it")

    return Asks(timeout, limit, lambda question: None, on_decided), seen


async def test_one_question_per_target_and_none_past_the_limit() -> None:
    questions, _ = asks()
    first = questions.question(Target("a.test", 443), "connect", "c")
    assert questions.question(Target("a.test", 443), "http", "c", "GET", "/") is first
    assert questions.question(Target("b.test", 443), "connect", "c") is not None
    assert questions.question(Target("c.test", 443), "connect", "c") is None


async def test_a_timeout_answers_every_held_request_deny_once_by_timeout() -> None:
    questions, seen = asks(timeout=1.0)
    question = questions.question(Target("a.test", 443), "connect", "c")
    assert question is not None
    answers = await asyncio.gather(questions.wait(question), questions.wait(question))
    assert {(a.answer, a.by) for a in answers} == {("deny-once", "timeout")} and seen == [("deny-once", "timeout")]
    assert questions.pending() == []


async def test_an_answer_the_policy_cannot_take_still_releases_the_held_requests() -> None:
    questions, _ = asks(decided=True)
    question = questions.question(Target("a.test", 443), "connect", "c")
    assert question is not None
    waiting = asyncio.ensure_future(questions.wait(question))
    await asyncio.sleep(0)
    with pytest.raises(AskError, match="the policy refuses it"):
        questions.decide(question.id, "allow-once", "terminal")
    assert (await asyncio.wait_for(waiting, 1)).answer == "allow-once"
