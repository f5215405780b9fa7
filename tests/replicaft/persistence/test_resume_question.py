"""The start-up question (replicaft/persistence/resume_question.py): a store that cannot be asked
is never read as "no checkpoint" (issue 37). The survey is a function the test controls."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from replicaft.checkpoint.lineage import Candidate
from replicaft.checkpoint.tiers import Survey
from replicaft.errors import CheckpointStoreUnavailable, ObjectStoreError, ObjectStoreRefused
from replicaft.persistence.resume_question import ResumeQuestion, decide

FOUND = ((Candidate(10, "l", None), Path("step-10")),)


@pytest.mark.parametrize(
    ("survey", "decision"),
    [
        (Survey(FOUND), "resume"),
        (Survey(FOUND, ObjectStoreError("down")), "resume"),
        (Survey(()), "fresh"),
        (Survey((), ObjectStoreError("503")), "unknown"),
        (Survey((), ObjectStoreRefused("403")), "refused"),
    ],
)
def test_decision_table(survey: Survey, decision: str) -> None:
    assert decide(survey) == decision


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def question(answers: list[Any], clock: Clock, events: list[dict[str, Any]], **kw: float) -> ResumeQuestion:
    def survey() -> Survey:
        a = answers.pop(0)
        if isinstance(a, threading.Event):
            a.wait(30)
            return Survey(())
        return a

    return ResumeQuestion(
        survey,
        where="object store s3://b/p",
        wait_s=kw.get("wait_s", 60.0),
        per_quorum_s=kw.get("per_quorum_s", 5.0),
        emit=lambda event, **f: events.append({"event": event, **f}),
        clock=clock,
    )


def test_outage_is_asked_again_until_the_store_answers_issue_37() -> None:
    clock, events = Clock(), []
    q = question(
        [Survey((), ObjectStoreError("503")), Survey((), ObjectStoreError("503")), Survey(FOUND)], clock, events
    )
    assert q.answer() is None
    clock.now = 20
    assert q.answer() is None
    assert q.answer() == Survey(FOUND)
    assert [e["event"] for e in events] == ["resume_store_waiting"] * 2 and "503" in events[0]["error"]


def test_store_down_past_the_wait_stops_naming_the_store_issue_37() -> None:
    clock, events = Clock(), []
    q = question([Survey((), ObjectStoreError("503"))] * 3, clock, events, wait_s=30)
    assert q.answer() is None
    clock.now = 31
    with pytest.raises(
        CheckpointStoreUnavailable, match=r"s3://b/p has not answered for 31s.*Not training from step 0"
    ):
        q.answer()


def test_refusal_stops_at_once() -> None:
    q = question([Survey((), ObjectStoreRefused("InvalidAccessKeyId"))], Clock(), [])
    with pytest.raises(CheckpointStoreUnavailable, match="refused the question.*InvalidAccessKeyId"):
        q.answer()


def test_black_holed_survey_costs_a_step_at_most_per_quorum_s_and_is_not_started_twice() -> None:
    release, clock, events = threading.Event(), Clock(), []
    q = question([release], clock, events, per_quorum_s=0.05)
    assert q.answer() is None and q.answer() is None  # the same survey, waited for again
    release.set()
    survey = None
    for _ in range(200):
        if (survey := q.answer()) is not None:
            break
    assert survey == Survey(()) and "no answer within" in events[0]["error"]
