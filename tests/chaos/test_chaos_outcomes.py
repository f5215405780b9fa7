"""The per-kind outcome checks (chaos/outcomes.py) over hand-written event logs: each holds on the
log of a run that went as promised, and each broken promise is reported with its step and group."""

from __future__ import annotations

from typing import Any

import pytest

from chaos.outcomes import (
    DISK_FULL_REFUSED,
    FAULTS_REJOINED,
    HEAL_SURVIVES_DONOR_LOSS,
    PREEMPTION_HANDLED,
    RESUME_FROM_DISK,
    OutcomeOptions,
    check_outcomes,
)
from chaos.record import ALL_GROUPS, DISK, LIGHTHOUSE, InjectedFault, ProcessExit

Event = dict[str, Any]
GROUPS = ("g0", "g1", "g2")


def ev(event: str, group: str, step: int, ts: float, *, rank: int = 0, quorum_id: int = 1, **fields: Any) -> Event:
    return {
        "ts": ts,
        "event": event,
        "step": step,
        "quorum_id": quorum_id,
        "replica_id": group,
        "group_rank": rank,
        **fields,
    }


def commit(group: str, step: int, ts: float, **fields: Any) -> Event:
    return ev("commit", group, step, ts, committed=True, **fields)


def steady(steps: range, groups: tuple[str, ...] = GROUPS, *, t0: float = 0.0) -> list[Event]:
    """Each group commits each step at t0 + step, with a digest ``d<step>``."""
    out = []
    for s in steps:
        for g in groups:
            out += [commit(g, s, t0 + s), ev("committed", g, s, t0 + s + 0.01, digest=f"d{s}")]
    return out


def options(**kw: Any) -> OutcomeOptions:
    return OutcomeOptions(**{"hang_bound_s": 5.0, "ended_ts": 100.0, "checkpoint_interval_steps": 10, **kw})


def verdict_of(
    name: str,
    events: list[Event],
    faults: list[InjectedFault],
    exits: list[ProcessExit] = (),  # type: ignore[assignment]
    **kw: Any,
) -> Any:
    (found,) = [v for v in check_outcomes(events, faults, list(exits), options(**kw)) if v.invariant == name]
    return found


def offences(verdict: Any) -> list[tuple[int | None, str | None]]:
    return [(v.step, v.group) for v in verdict.violations]


def test_only_the_kinds_injected_get_a_verdict() -> None:
    assert (
        check_outcomes(steady(range(1, 5)), [InjectedFault("kill_lighthouse", LIGHTHOUSE, 2.5, 3.0)], [], options())
        == ()
    )
    names = [
        v.invariant
        for v in check_outcomes(steady(range(1, 5)), [InjectedFault("sigkill", "g1", 2.5, 3.0)], [], options())
    ]
    assert names == [FAULTS_REJOINED]


# -- faults_rejoined ---------------------------------------------------------------------------------


def test_group_back_and_committing_has_rejoined() -> None:
    log = steady(range(1, 10))
    assert verdict_of(FAULTS_REJOINED, log, [InjectedFault("sigkill", "g1", 2.5, 4.0)]).status == "held"


def test_group_back_but_never_committing_again_is_reported() -> None:
    log = [e for e in steady(range(1, 60)) if not (e["replica_id"] == "g1" and e["ts"] > 3.0)]
    v = verdict_of(FAULTS_REJOINED, log, [InjectedFault("sigkill", "g1", 2.5, 4.0, label="sigkill g1 at step 2")])
    assert offences(v) == [(None, "g1")]
    assert "never committed again" in v.violations[0].detail


def test_target_back_just_before_the_end_is_not_judged() -> None:
    log = [e for e in steady(range(1, 10)) if not (e["replica_id"] == "g1" and e["ts"] > 3.0)]
    v = verdict_of(FAULTS_REJOINED, log, [InjectedFault("sigkill", "g1", 2.5, 97.0)])
    assert v.status == "held" and "not judged" in v.note


def test_partitioned_group_must_heal_when_it_rejoins() -> None:
    partition = InjectedFault("partition", "g2", 2.5, 6.0, label="partition g2")
    log = steady(range(1, 10))
    assert offences(verdict_of(FAULTS_REJOINED, log, [partition])) == [(7, "g2")]
    healed = log + [ev("heal_end", "g2", 7, 6.5, ok=True)]
    assert verdict_of(FAULTS_REJOINED, healed, [partition]).status == "held"


# -- preemption_handled ------------------------------------------------------------------------------


def preempted(group: str, ts: float, *, ranks: int = 1) -> list[Event]:
    return [ev("stop", group, 3, ts, rank=r, reason="preempted (SIGTERM)") for r in range(ranks)]


def test_preempted_group_stops_and_exits_143() -> None:
    log = steady(range(1, 8)) + preempted("g1", 3.2)
    term = InjectedFault("sigterm", "g1", 3.1, 5.0)
    assert verdict_of(PREEMPTION_HANDLED, log, [term], [ProcessExit("g1", 3.3, 143, "sigterm", 3)]).status == "held"
    (violation,) = verdict_of(PREEMPTION_HANDLED, log, [term], [ProcessExit("g1", 3.3, -9, "sigterm", 3)]).violations
    assert "code -9, not 143" in violation.detail


def test_every_rank_of_a_preempted_group_must_stop() -> None:
    log = steady(range(1, 8)) + preempted("g1", 3.2, ranks=1)
    v = verdict_of(PREEMPTION_HANDLED, log, [InjectedFault("sigterm", "g1", 3.1, 5.0)], ranks_per_group=2)
    assert "rank(s) [1]" in v.violations[0].detail


def test_preempted_writer_must_save_first() -> None:
    quorum = ev("quorum", "g0", 2, 2.05, replica_rank=0)
    log = steady(range(1, 8)) + [quorum] + preempted("g0", 3.4)
    term = InjectedFault("sigterm", "g0", 3.1, 5.0)
    exits = [ProcessExit("g0", 3.5, 143, "sigterm", 3)]
    assert "emergency save is missing" in verdict_of(PREEMPTION_HANDLED, log, [term], exits).violations[0].detail
    saved = log + [ev("checkpoint", "g0", 3, 3.3, checkpoint_step=3, ok=True, status="published")]
    assert verdict_of(PREEMPTION_HANDLED, saved, [term], exits).status == "held"


# -- heal_survives_donor_loss -----------------------------------------------------------------------


def test_heal_finishing_from_the_other_donor_holds() -> None:
    log = steady(range(1, 10), ("g0", "g2")) + [
        ev("heal_start", "g1", 0, 5.0, donors=["g0", "g2"], max_step=5),
        ev("heal_end", "g1", 5, 5.6, ok=True, bytes_by_donor={"g0": 100}),
        commit("g1", 6, 6.0),
    ]
    v = verdict_of(HEAL_SURVIVES_DONOR_LOSS, log, [InjectedFault("kill_donor_mid_heal", "g2", 5.1, 7.0)])
    assert v.status == "held" and "after g2 died" in v.note


def test_heal_that_never_completes_after_its_donor_died_is_reported() -> None:
    log = steady(range(1, 10), ("g0",)) + [
        ev("heal_start", "g1", 0, 5.0, donors=["g0", "g2"], max_step=5),
        ev("heal_end", "g1", 0, 6.0, ok=False, error="HealError"),
    ]
    v = verdict_of(HEAL_SURVIVES_DONOR_LOSS, log, [InjectedFault("kill_donor_mid_heal", "g2", 5.1, 7.0)])
    assert offences(v) == [(5, "g1")]


def test_donor_death_without_any_heal_is_reported() -> None:
    v = verdict_of(HEAL_SURVIVES_DONOR_LOSS, steady(range(1, 5)), [InjectedFault("kill_donor_mid_heal", "g2", 2.1)])
    assert "no heal listing it" in v.violations[0].detail


# -- resume_from_disk -------------------------------------------------------------------------------


def catastrophe(
    *,
    resumed: int | None,
    frontier: int = 25,
    digest: str | None = None,
    kind: str = "kill_all_groups",
    damaged: int | None = None,
    published_up_to: int | None = None,
) -> tuple[list[Event], list[InjectedFault]]:
    """Steps 1..frontier; checkpoints every 10 published (up to ``published_up_to``; a later one
    was still being written); every group killed at t=frontier+0.5; restarted, they resume from
    ``resumed`` and commit on."""
    killed = frontier + 0.5
    log = steady(range(1, frontier + 1))
    last = frontier if published_up_to is None else published_up_to
    log += [
        ev("checkpoint", "g0", s, s + 0.3, checkpoint_step=s, ok=True, status="published")
        for s in range(10, last + 1, 10)
    ]
    if resumed is not None:
        log += [
            ev("resume", g, resumed, killed + 5, checkpoint_step=resumed, digest=digest or f"d{resumed}")
            for g in GROUPS
        ]
        log += steady(range(resumed + 1, resumed + 5), t0=killed + 5 - resumed)
    fault = InjectedFault(kind, ALL_GROUPS, killed, killed + 1, label=kind, checkpoint_step=damaged)
    return log, [fault]


@pytest.mark.parametrize(
    ("resumed", "frontier", "expected"),
    [(20, 25, []), (20, 32, []), (20, 33, [(20, ALL_GROUPS)]), (10, 25, [(10, ALL_GROUPS), (10, ALL_GROUPS)])],
    ids=[
        "lost 5",
        "lost 12 = interval + slack (save of 30 in flight)",
        "lost 13 of 12 allowed",
        "an older checkpoint than the newest published",
    ],
)
def test_resume_loses_at_most_an_interval_plus_slack(
    resumed: int, frontier: int, expected: list[tuple[int | None, str | None]]
) -> None:
    log, faults = catastrophe(resumed=resumed, frontier=frontier, published_up_to=20)
    assert offences(verdict_of(RESUME_FROM_DISK, log, faults)) == expected


def test_no_resume_although_a_checkpoint_was_published_is_reported() -> None:
    log, faults = catastrophe(resumed=None)
    assert "no group resumed from disk" in verdict_of(RESUME_FROM_DISK, log, faults).violations[0].detail


def test_resumed_state_must_match_the_state_committed_at_that_step() -> None:
    log, faults = catastrophe(resumed=20, digest="tampered")
    v = verdict_of(RESUME_FROM_DISK, log, faults)
    assert offences(v) == [(20, g) for g in GROUPS]


def test_damaged_checkpoint_must_be_skipped() -> None:
    log, faults = catastrophe(resumed=10, frontier=22, kind="corrupt_checkpoint", damaged=20)
    assert verdict_of(RESUME_FROM_DISK, log, faults).status == "held"
    log, faults = catastrophe(resumed=20, frontier=22, kind="corrupt_checkpoint", damaged=20)
    assert "was damaged" in verdict_of(RESUME_FROM_DISK, log, faults).violations[0].detail


# -- disk_full_refused ------------------------------------------------------------------------------

REFUSED = (
    "not enough free space in /ckpt: checkpoint of step 20 needs 70000 bytes, 0 free; training continues without it"
)


def full_disk(*events: Event) -> tuple[list[Event], list[InjectedFault]]:
    """Steps 1..40; the disk is full from t=15 to t=25."""
    return steady(range(1, 41)) + list(events), [InjectedFault("fill_disk", DISK, 15.0, 25.0, label="fill_disk")]


def test_saves_refused_with_a_clear_reason_then_succeeding_hold() -> None:
    log, faults = full_disk(
        ev("checkpoint", "g0", 20, 20.2, checkpoint_step=20, ok=False, status="refused", reason=REFUSED),
        ev("checkpoint", "g0", 30, 30.2, checkpoint_step=30, ok=True, status="published"),
    )
    v = verdict_of(DISK_FULL_REFUSED, log, faults)
    assert v.status == "held" and "the next save succeeded" in v.note


def test_refusal_without_a_reason_naming_the_disk_is_reported() -> None:
    log, faults = full_disk(
        ev("checkpoint", "g0", 20, 20.2, checkpoint_step=20, ok=False, status="failed", reason="boom")
    )
    assert offences(verdict_of(DISK_FULL_REFUSED, log, faults)) == [(20, "g0")]


def test_saves_still_failing_after_the_disk_was_freed_are_reported() -> None:
    log, faults = full_disk(
        ev("checkpoint", "g0", 20, 20.2, checkpoint_step=20, ok=False, status="refused", reason=REFUSED),
        ev("checkpoint", "g0", 30, 30.2, checkpoint_step=30, ok=False, status="refused", reason=REFUSED),
    )
    assert "still fail after the disk was freed" in verdict_of(DISK_FULL_REFUSED, log, faults).violations[0].detail


def test_no_save_due_while_full_is_not_checked() -> None:
    log, faults = full_disk()
    assert verdict_of(DISK_FULL_REFUSED, log, faults).status == "not_checked"


def test_save_started_before_the_disk_filled_may_still_publish() -> None:
    # Step 14 was committed at t=14 and its save was under way when the disk filled at t=15.
    log, faults = full_disk(
        ev("checkpoint", "g0", 14, 15.5, checkpoint_step=14, ok=True, status="published"),
        ev("checkpoint", "g0", 20, 20.2, checkpoint_step=20, ok=False, status="refused", reason=REFUSED),
    )
    assert verdict_of(DISK_FULL_REFUSED, log, faults).status == "held"
    log, faults = full_disk(ev("checkpoint", "g0", 20, 20.5, checkpoint_step=20, ok=True, status="published"))
    assert "did not take effect" in verdict_of(DISK_FULL_REFUSED, log, faults).violations[0].detail
