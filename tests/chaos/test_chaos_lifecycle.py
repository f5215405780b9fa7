"""The checkpoint-lifecycle pieces of the chaos harness (issue 23): the ``preemption_notice`` kind
(scenario rules, the groups' environment, the notice file, its outcome check), the
``checkpoint_interval = "auto"`` scenario fields, and the summary's cadence and save rows."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from chaos.checkpoint_telemetry import cadence_decisions, save_telemetry
from chaos.commands import GroupPlacement, group_env
from chaos.injector import Injector
from chaos.outcomes import PREEMPTION_NOTICE_HANDLED, OutcomeOptions, check_outcomes
from chaos.record import InjectedFault, ProcessExit, RunRecord
from chaos.report import render_report
from chaos.scenario import Scenario, ScenarioError, load_scenario, scenario_from_dict
from chaos.summary import build_summary
from chaos.timeline import commits

Event = dict[str, Any]


def ev(event: str, group: str, step: int, ts: float, **fields: Any) -> Event:
    return {"ts": ts, "event": event, "step": step, "quorum_id": 1, "replica_id": group, "group_rank": 0, **fields}


def scenario(**fields: Any) -> Scenario:
    return scenario_from_dict({"name": "t", "step_delay_s": 0.3, "checkpoint_interval_steps": 10, **fields})


# -- scenario fields -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"checkpoint_interval_steps": 0}, "needs checkpoint_interval_steps"),
        ({"checkpoint_interval_min_s": 4.0}, "at most checkpoint_interval_max_s"),
        ({"checkpoint_interval_max_s": 5.0}, "spans more than checkpoint_interval_steps=10"),
        ({"checkpoint_interval": "sometimes"}, "must be one of ['fixed', 'auto']"),
    ],
)
def test_auto_interval_refuses_what_the_resume_check_cannot_bound(fields: dict[str, Any], words: str) -> None:
    with pytest.raises(ScenarioError, match="checkpoint_interval") as e:
        scenario(**{"checkpoint_interval": "auto", **fields})
    assert words in str(e.value)


def test_preemption_notice_takes_a_group_target() -> None:
    with pytest.raises(ScenarioError, match="target=None"):
        scenario(faults=[{"kind": "preemption_notice", "at_step": 3}])
    s = scenario(faults=[{"kind": "preemption_notice", "target": "g1", "at_step": 3}])
    assert s.needs_notices and not scenario().needs_notices


# -- the groups' environment -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "notice", "expected", "absent"),
    [
        (
            {},
            None,
            {"REPLICAFT_CHECKPOINT_INTERVAL_STEPS": "10"},
            ["REPLICAFT_CHECKPOINT_INTERVAL", "REPLICAFT_PREEMPTION_NOTICE"],
        ),
        (
            {"checkpoint_interval": "auto"},
            Path("/run/notices/g0"),
            {
                "REPLICAFT_CHECKPOINT_INTERVAL": "auto",
                "REPLICAFT_CHECKPOINT_INTERVAL_MIN_S": "1.0",
                "REPLICAFT_CHECKPOINT_INTERVAL_MAX_S": "3.0",
                "REPLICAFT_PREEMPTION_NOTICE": "file:/run/notices/g0",
                "REPLICAFT_PREEMPTION_POLL_S": "0.2",
            },
            ["REPLICAFT_CHECKPOINT_INTERVAL_STEPS"],
        ),
    ],
)
def test_group_env_carries_the_interval_mode_and_the_notice(
    fields: dict[str, Any], notice: Path | None, expected: dict[str, str], absent: list[str]
) -> None:
    env = group_env(
        scenario(**fields),
        "g0",
        GroupPlacement(lighthouse="h:1", events_dir=Path("/e"), checkpoint_dir=Path("/c"), preemption_notice=notice),
    )
    assert {k: env.get(k) for k in expected} == expected
    assert not set(absent) & set(env)


# -- the notice file -------------------------------------------------------------------------------


def test_a_notice_is_withdrawn_once_before_the_restart(tmp_path: Path) -> None:
    s = scenario(faults=[{"kind": "preemption_notice", "target": "g1", "at_step": 3}])
    injector = Injector(s, sup=None, checkpoint_dir=None, notices_dir=tmp_path / "notices")  # type: ignore[arg-type]
    path = injector.notice_path("g1")
    assert path == tmp_path / "notices" / "g1"
    assert not injector.withdraw_notice("g1")  # never written: nothing to withdraw
    path.parent.mkdir()
    path.write_text("now")
    assert injector.withdraw_notice("g1") and not path.exists()
    assert not injector.withdraw_notice("g1")
    assert Injector(s, sup=None, checkpoint_dir=None).notice_path("g1") is None  # type: ignore[arg-type]


# -- the outcome -----------------------------------------------------------------------------------


def _run(
    *, notice: bool = True, code: int = 143, cause: str | None = "preemption_notice", back: bool = True
) -> list[tuple[int | None, str | None, str]]:
    events = [ev("commit", g, s, float(s), committed=True) for s in range(1, 10) for g in ("g0", "g2")]
    events += [ev("commit", "g1", s, float(s), committed=True) for s in range(1, 4)]
    if notice:
        events.append(ev("preemption_notice", "g1", 3, 3.2, source="file:/n/g1", kind="file", reason="exists"))
    if back:
        events.append(ev("commit", "g1", 8, 8.0, committed=True))
    fault = InjectedFault("preemption_notice", "g1", 3.1, 5.0, label="preemption_notice g1 at step 3")
    exits = [ProcessExit("g1", 3.5, code, cause, 3)]
    (found,) = [
        v
        for v in check_outcomes(events, [fault], exits, OutcomeOptions(hang_bound_s=2.0, ended_ts=20.0))
        if v.invariant == PREEMPTION_NOTICE_HANDLED
    ]
    return [(v.step, v.group, v.detail) for v in found.violations]


@pytest.mark.parametrize(
    ("kw", "words"),
    [
        ({}, None),
        ({"notice": False}, "emitted no 'preemption_notice' event"),
        ({"code": -9, "cause": "sigkill"}, "ended with code -9 (sigkill)"),
        ({"cause": "sigterm"}, "not by itself"),
        ({"back": False}, "never committed again"),
    ],
)
def test_preemption_notice_handled(kw: dict[str, Any], words: str | None) -> None:
    found = _run(**kw)
    if words is None:
        assert found == []
    else:
        ((_, group, detail),) = found
        assert group == "g1" and words in detail


# -- the summary's checkpoint rows -----------------------------------------------------------------


def _cadence(ts: float, interval_s: float, source: str, group: str = "g0") -> Event:
    return ev(
        "checkpoint_cadence",
        group,
        5,
        ts,
        interval_s=interval_s,
        cost_s=0.01,
        mtbf_s=100.0,
        mtbf_source=source,
        reason="young/daly",
    )


def _save(ts: float, ok: bool, duration_s: float, status: str = "published") -> Event:
    return ev(
        "checkpoint",
        "g0",
        5,
        ts,
        checkpoint_step=5,
        ok=ok,
        status=status,
        duration_s=duration_s,
        blocked_s=duration_s / 10,
        throughput_mb_s=100 / duration_s,
    )


@pytest.mark.parametrize(
    ("events", "count", "intervals", "last"),
    [
        ([], 0, [], None),
        (
            [_cadence(14.0, 3.0, "prior"), _cadence(12.0, 1.0, "observed", "g1"), ev("commit", "g0", 1, 1.0)],
            2,
            [1.0, 3.0],
            {
                "group": "g0",
                "at_s": 4.0,
                "step": 5,
                "interval_s": 3.0,
                "cost_s": 0.01,
                "mtbf_s": 100.0,
                "mtbf_source": "prior",
                "reason": "young/daly",
            },
        ),
    ],
)
def test_cadence_decisions_counts_and_keeps_the_last(
    events: list[Event], count: int, intervals: list[float], last: dict[str, Any] | None
) -> None:
    assert cadence_decisions(events, started_ts=10.0) == {"count": count, "intervals_s": intervals, "last": last}


@pytest.mark.parametrize(
    ("events", "expected"),
    [
        (
            [],
            {
                "count": 0,
                "published": 0,
                "statuses": {},
                "median_duration_s": None,
                "median_blocked_s": None,
                "median_throughput_mb_s": None,
                "anomalies": [],
            },
        ),
        (
            [
                _save(1.0, True, 1.0),
                _save(2.0, True, 4.0),
                _save(3.0, True, 2.0),
                _save(4.0, False, 50.0, "refused"),
                ev("checkpoint_anomaly", "g0", 5, 5.0, checkpoint_step=5, kind="slow_save", reason="3x the median"),
            ],
            {
                "count": 4,
                "published": 3,
                "statuses": {"published": 3, "refused": 1},
                "median_duration_s": 2.0,
                "median_blocked_s": 0.2,
                "median_throughput_mb_s": 50.0,
                "anomalies": [{"group": "g0", "checkpoint_step": 5, "kind": "slow_save", "reason": "3x the median"}],
            },
        ),
    ],
)
def test_save_telemetry_medians_of_the_published_saves(events: list[Event], expected: dict[str, Any]) -> None:
    assert save_telemetry(events) == expected


@pytest.mark.parametrize(
    ("events", "shown"),
    [
        ([ev("commit", "g0", 1, 1001.0, committed=True)], False),
        (
            [
                ev("commit", "g0", 1, 1001.0, committed=True),
                _cadence(1002.0, 3.0, "prior"),
                _save(1003.0, True, 0.5),
                ev(
                    "checkpoint_anomaly",
                    "g0",
                    5,
                    1004.0,
                    checkpoint_step=5,
                    kind="slow_save",
                    reason="slower than usual",
                ),
            ],
            True,
        ),
    ],
)
def test_report_shows_the_checkpoint_rows_when_there_were_saves(
    tmp_path: Path, events: list[Event], shown: bool
) -> None:
    record = RunRecord(
        scenario=Scenario(name="t", steps=1, groups=1),
        out_dir=tmp_path,
        events_dir=tmp_path,
        started_ts=1000.0,
        ended_ts=1005.0,
        faults=(),
        skipped=(),
        exits=(),
        restarts={},
        stopped_at_end=(),
        deadline_exceeded=False,
    )
    summary = build_summary(record, events)
    assert summary["cadence_decisions"]["count"] == int(shown) and summary["save_telemetry"]["count"] == int(shown)
    page = render_report(summary, commits(events), (), t0=1000.0, t_end=1005.0)
    assert ("<h2>Checkpoints</h2>" in page) == shown
    assert ("slower than usual" in page and "last decision: mtbf_source" in page) == shown


def test_lifecycle_scenario_has_every_way_of_losing_groups() -> None:
    s = load_scenario("lifecycle")
    assert [f.kind for f in s.faults] == ["sigkill", "preemption_notice", "kill_all_groups", "corrupt_checkpoint"]
    assert s.checkpoint_interval == "auto" and s.groups == 3
