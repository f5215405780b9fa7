"""The chaos run's summary and report (chaos/summary.py, chaos/report.py): pure, built from
events written by hand in the replicaft/telemetry/events.py schema."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from chaos.record import RunRecord
from chaos.report import render_report
from chaos.scenario import Scenario
from chaos.summary import build_summary, resume_verdicts
from chaos.timeline import commits

T0 = 1000.0


def verdict(group: str, ts: float, outcome: str, step: int = 20, deviation: float | None = 0.001) -> dict[str, Any]:
    return {
        "ts": ts,
        "event": "resume_verdict",
        "step": step + 4,
        "quorum_id": 3,
        "replica_id": group,
        "group_rank": 0,
        "checkpoint_step": step,
        "verdict": outcome,
        "deviation": deviation,
        "allowed": None if deviation is None else 0.005,
        "reason": f"{outcome} because",
    }


def commit(group: str, ts: float, step: int) -> dict[str, Any]:
    return {
        "ts": ts,
        "event": "commit",
        "step": step,
        "quorum_id": 1,
        "replica_id": group,
        "group_rank": 0,
        "committed": True,
        "reason": "",
        "num_contributors": 1,
        "healing": False,
        "step_time_s": 0.1,
    }


@pytest.mark.parametrize(
    ("events", "expected"),
    [
        pytest.param([commit("g0", T0 + 1, 1)], [], id="no_resume_no_rows"),
        pytest.param(
            [verdict("g1", T0 + 9, "diverged", deviation=0.02), commit("g0", T0 + 1, 1), verdict("g0", T0 + 8, "ok")],
            [("g0", 8.0, "ok", 0.001), ("g1", 9.0, "diverged", 0.02)],
            id="one_row_per_resume_in_time_order",
        ),
        pytest.param(
            [verdict("g0", T0 + 3, "not_enough_data", deviation=None)],
            [("g0", 3.0, "not_enough_data", None)],
            id="not_enough_data_has_no_numbers",
        ),
    ],
)
def test_resume_verdicts_row_per_verdict_event(events: list[dict[str, Any]], expected: list[tuple[Any, ...]]) -> None:
    rows = resume_verdicts(events, T0)
    assert [(r["group"], r["at_s"], r["verdict"], r["deviation"]) for r in rows] == expected
    assert all(r["checkpoint_step"] == 20 and r["reason"] for r in rows)


def test_report_shows_each_resumes_loss_verdict_issue_23(tmp_path: Path) -> None:
    events = [
        commit("g0", T0 + 1, 1),
        commit("g0", T0 + 2, 2),
        verdict("g0", T0 + 3, "ok"),
        verdict("g1", T0 + 4, "diverged", deviation=0.02),
    ]
    record = RunRecord(
        scenario=Scenario(name="resume", steps=2, groups=2),
        out_dir=tmp_path,
        events_dir=tmp_path,
        started_ts=T0,
        ended_ts=T0 + 5,
        faults=(),
        skipped=(),
        exits=(),
        restarts={},
        stopped_at_end=(),
        deadline_exceeded=False,
    )
    summary = build_summary(record, events)
    assert [r["verdict"] for r in summary["resume_verdicts"]] == ["ok", "diverged"]
    page = render_report(summary, commits(events), (), t0=T0, t_end=T0 + 5)
    assert "<h2>Resumes from disk</h2>" in page
    assert '<span class="held">ok</span>' in page and '<span class="violated">diverged</span>' in page
    assert "diverged because" in page


def test_report_without_resumes_has_no_resume_section(tmp_path: Path) -> None:
    events = [commit("g0", T0 + 1, 1)]
    record = RunRecord(
        scenario=Scenario(name="plain", steps=1, groups=1),
        out_dir=tmp_path,
        events_dir=tmp_path,
        started_ts=T0,
        ended_ts=T0 + 2,
        faults=(),
        skipped=(),
        exits=(),
        restarts={},
        stopped_at_end=(),
        deadline_exceeded=False,
    )
    page = render_report(build_summary(record, events), commits(events), (), t0=T0, t_end=T0 + 2)
    assert "Resumes from disk" not in page
