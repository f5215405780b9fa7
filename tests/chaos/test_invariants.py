"""The chaos invariants over hand-written event logs: each holds on a healthy run, and each
offence is reported with its invariant, step and group.

Logs are built with the helpers below in the ``replicaft/telemetry/events.py`` schema; a healthy log has
three groups committing the same steps with the same digest and contiguous sample ranges.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from chaos.invariants import (
    EXACTLY_ONCE_SAMPLES,
    FINAL_LOSS,
    IDENTICAL_DIGESTS,
    MONOTONIC_STEPS,
    NO_CRASH,
    NO_HANG,
    CheckOptions,
    check_all,
    check_exactly_once_samples,
    check_final_loss,
    check_identical_digests,
    check_monotonic_steps,
    check_no_crash,
    check_no_hang,
    final_loss,
)
from chaos.record import InjectedFault, ProcessExit

Event = dict[str, Any]
GROUPS = ("g0", "g1", "g2")
BATCH = 96


def ev(event: str, group: str, step: int, ts: float, *, quorum_id: int = 1, rank: int = 0, **fields: Any) -> Event:
    return {
        "ts": ts,
        "event": event,
        "step": step,
        "quorum_id": quorum_id,
        "replica_id": group,
        "group_rank": rank,
        **fields,
    }


def start(group: str, ts: float, *, pid: int = 100) -> Event:
    return ev("start", group, 0, ts, quorum_id=-1, world_size=1, pid=pid)


def commit(
    group: str,
    step: int,
    ts: float,
    *,
    quorum_id: int = 1,
    samples: tuple[int, int] | None = None,
    committed: bool = True,
) -> Event:
    fields: dict[str, Any] = {"committed": committed, "num_contributors": 3, "step_time_s": 0.5}
    if samples is not None:
        fields["samples"] = list(samples)
    return ev("commit", group, step, ts, quorum_id=quorum_id, **fields)


def digest(group: str, step: int, ts: float, value: str, *, rank: int = 0, **fields: Any) -> Event:
    return ev("committed", group, step, ts, rank=rank, digest=value, **fields)


def healthy(steps: int = 5, groups: tuple[str, ...] = GROUPS) -> list[Event]:
    """Every group starts, then commits steps 1..steps in quorum 1, same digest, contiguous samples."""
    log = [start(g, 0.0, pid=100 + i) for i, g in enumerate(groups)]
    for s in range(1, steps + 1):
        for g in groups:
            log.append(commit(g, s, float(s), samples=((s - 1) * BATCH, s * BATCH)))
            log.append(digest(g, s, float(s) + 0.01, f"d{s}"))
    return log


def replace_digest(log: list[Event], group: str, step: int, value: str) -> list[Event]:
    return [
        dict(e, digest=value) if e["event"] == "committed" and e["replica_id"] == group and e["step"] == step else e
        for e in log
    ]


def offences(verdict: Any) -> list[tuple[int | None, str | None]]:
    return [(v.step, v.group) for v in verdict.violations]


OPTIONS = CheckOptions(hang_bound_s=5.0, target_steps=5)


# -- invariant 1: identical digests ---------------------------------------------------------------

DIGEST_CASES = [
    ("healthy run", healthy(), []),
    ("one group diverges at step 3", replace_digest(healthy(), "g1", 3, "bad"), [(3, "g1")]),
    ("two groups, no majority", replace_digest(healthy(groups=("g0", "g1")), "g1", 2, "bad"), [(2, None)]),
    ("a group reports two states for one step", healthy() + [digest("g2", 4, 9.0, "other")], [(4, "g2")]),
    (
        "ranks of one group differ (sharded), columns agree",
        healthy() + [digest(g, 5, 5.02, "shard1", rank=1) for g in GROUPS],
        [],
    ),
    (
        "rank 1 column diverges",
        healthy()
        + [digest("g0", 5, 5.02, "x", rank=1), digest("g1", 5, 5.02, "x", rank=1), digest("g2", 5, 5.02, "y", rank=1)],
        [(5, "g2")],
    ),
]


@pytest.mark.parametrize(("log", "expected"), [c[1:] for c in DIGEST_CASES], ids=[c[0] for c in DIGEST_CASES])
def test_identical_digests(log: list[Event], expected: list[tuple[int | None, str | None]]) -> None:
    verdict = check_identical_digests(log)
    assert offences(verdict) == expected
    assert verdict.status == ("violated" if expected else "held")
    assert all(v.invariant == IDENTICAL_DIGESTS for v in verdict.violations)


def test_digests_not_checked_without_two_groups_reporting() -> None:
    verdict = check_identical_digests(healthy(groups=("g0",)))
    assert verdict.status == "not_checked"


# -- invariant 2: monotonic and never lost --------------------------------------------------------

MONOTONIC_CASES = [
    ("healthy run", healthy(), []),
    ("a step repeated in one process", healthy() + [commit("g0", 5, 6.0)], [(5, "g0")]),
    ("a step going backwards in one process", healthy() + [commit("g1", 3, 6.0)], [(3, "g1")]),
    (
        "a restarted process heals to a higher step",
        healthy() + [start("g2", 6.0, pid=200), commit("g2", 7, 7.0, quorum_id=2), commit("g0", 7, 7.0, quorum_id=2)],
        [],
    ),
    (
        "commit events out of time order across groups (healer emits late)",
        [
            start("g0", 0.0),
            start("g1", 0.0, pid=101),
            commit("g0", 1, 1.0),
            commit("g0", 2, 2.0),
            commit("g1", 1, 2.5),
            commit("g1", 2, 3.0),
        ],
        [],
    ),
    (
        "a later quorum rolls the job back",
        healthy() + [commit("g0", 2, 7.0, quorum_id=2), commit("g1", 2, 7.0, quorum_id=2)],
        [(2, "g0"), (2, "g1"), (2, "g0")],
    ),
    (
        "every group restarted from scratch: steps lost",
        healthy()
        + [start(g, 6.0, pid=300 + i) for i, g in enumerate(GROUPS)]
        + [commit(g, 1, 7.0, quorum_id=2) for g in GROUPS],
        [(1, "g0")],
    ),
]


@pytest.mark.parametrize(("log", "expected"), [c[1:] for c in MONOTONIC_CASES], ids=[c[0] for c in MONOTONIC_CASES])
def test_monotonic_steps(log: list[Event], expected: list[tuple[int | None, str | None]]) -> None:
    verdict = check_monotonic_steps(log)
    assert offences(verdict) == expected
    assert all(v.invariant == MONOTONIC_STEPS for v in verdict.violations)


def test_rollback_detail_names_both_quorums() -> None:
    log = (
        healthy()
        + [start(g, 6.0, pid=300 + i) for i, g in enumerate(GROUPS)]
        + [commit(g, 1, 7.0, quorum_id=2) for g in GROUPS]
    )
    (violation,) = check_monotonic_steps(log).violations
    assert "quorum 2" in violation.detail and "quorum 1" in violation.detail and "lost" in violation.detail


def test_aborted_steps_are_not_commits() -> None:
    log = healthy() + [commit("g0", 5, 6.0, committed=False)]
    assert check_monotonic_steps(log).status == "held"


# -- invariant 3: exactly-once samples -------------------------------------------------------------


def with_samples(log: list[Event], group: str | None, step: int, samples: tuple[int, int]) -> list[Event]:
    return [
        dict(e, samples=list(samples))
        if e["event"] == "commit" and e["step"] == step and (group is None or e["replica_id"] == group)
        else e
        for e in log
    ]


SAMPLE_CASES = [
    ("contiguous ranges", healthy(), []),
    ("a gap: samples never trained", with_samples(healthy(), None, 3, (2 * BATCH + 10, 3 * BATCH)), [(3, None)]),
    ("an overlap: samples trained twice", with_samples(healthy(), None, 3, (2 * BATCH - 10, 3 * BATCH)), [(3, None)]),
    ("groups disagree on a step's range", with_samples(healthy(), "g2", 4, (3 * BATCH, 3 * BATCH + 5)), [(4, None)]),
    ("the first step does not start at 0", with_samples(healthy(), None, 1, (5, BATCH)), [(1, None)]),
]


@pytest.mark.parametrize(("log", "expected"), [c[1:] for c in SAMPLE_CASES], ids=[c[0] for c in SAMPLE_CASES])
def test_exactly_once_samples(log: list[Event], expected: list[tuple[int | None, str | None]]) -> None:
    verdict = check_exactly_once_samples(log)
    assert offences(verdict) == expected
    assert verdict.status == ("violated" if expected else "held")


def test_exactly_once_not_checked_without_sample_ranges() -> None:
    log = [{k: v for k, v in e.items() if k != "samples"} for e in healthy()]
    verdict = check_exactly_once_samples(log)
    assert verdict.status == "not_checked"
    assert "samples" in verdict.note


# -- invariant 4: no hang --------------------------------------------------------------------------


def fault(kind: str, target: str, ts: float) -> InjectedFault:
    return InjectedFault(kind, target, ts)


HANG_CASES = [
    ("no faults, job finished", healthy(), [], []),
    ("fault followed by a commit in time", healthy(), [fault("sigkill", "g1", 2.5)], []),
    ("no commit after the fault", healthy(), [fault("sigstop", "g2", 5.5)], [(5, "g2")]),
    (
        "next commit later than the bound",
        healthy()[:-6] + [commit("g0", 5, 20.0)],
        [fault("sigkill", "g1", 4.5)],
        [(4, "g1")],
    ),
    ("job stopped short of its steps", healthy(steps=3), [], [(3, None)]),
    (
        "only the step in flight was logged after the fault",
        healthy()[:-2] + [commit("g2", 5, 5.1)],
        [fault("sigkill", "g1", 5.05)],
        [(5, "g1")],
    ),
]


@pytest.mark.parametrize(("log", "faults", "expected"), [c[1:] for c in HANG_CASES], ids=[c[0] for c in HANG_CASES])
def test_no_hang(log: list[Event], faults: list[InjectedFault], expected: list[tuple[int | None, str | None]]) -> None:
    verdict = check_no_hang(log, faults, OPTIONS)
    assert offences(verdict) == expected
    assert all(v.invariant == NO_HANG for v in verdict.violations)


def test_a_run_whose_deadline_passed_in_the_wind_down_hung_even_past_its_target_step() -> None:
    """The job reached its steps, but a group had not ended when the run's deadline passed: the
    run used to exit 0 with no hang reported."""
    verdict = check_no_hang(healthy(), [], dataclasses.replace(OPTIONS, deadline_exceeded=True))
    assert offences(verdict) == [(5, None)]
    assert "deadline passed at step 5 before every group had ended" in verdict.violations[0].detail


# -- invariant 5: final loss -----------------------------------------------------------------------


def with_loss(log: list[Event], loss: float) -> list[Event]:
    return [dict(e, loss=loss) if e["event"] == "committed" else e for e in log]


@pytest.mark.parametrize(
    ("log", "reference", "status"),
    [
        (healthy(), 0.5, "not_checked"),
        (with_loss(healthy(), 0.52), None, "not_checked"),
        (with_loss(healthy(), 0.52), 0.5, "held"),
        (with_loss(healthy(), 0.7), 0.5, "violated"),
        ([dict(e, loss=0.7) if e["event"] == "commit" else e for e in healthy()], 0.5, "violated"),
    ],
    ids=["no loss in events", "no reference run", "within tolerance", "outside tolerance", "loss on commit events"],
)
def test_final_loss(log: list[Event], reference: float | None, status: str) -> None:
    verdict = check_final_loss(log, CheckOptions(hang_bound_s=5.0, reference_final_loss=reference, loss_tolerance=0.1))
    assert verdict.status == status
    if status == "violated":
        assert offences(verdict) == [(5, None)]


def test_final_loss_is_the_median_of_the_last_steps_so_one_spike_does_not_decide() -> None:
    def log(losses: list[float]) -> list[Event]:
        return [
            {"event": "committed", "step": i, "replica_id": g, "loss": loss, "ts": float(i)}
            for i, loss in enumerate(losses)
            for g in ("g0", "g1")
        ]

    noisy_end = [0.4, 0.5, 0.3, 0.4, 0.9]  # the last batch alone is 2x the reference
    assert final_loss(log(noisy_end), window=5) == pytest.approx(0.4)
    options = CheckOptions(hang_bound_s=5.0, reference_final_loss=0.41, loss_tolerance=0.1, loss_window=5)
    assert check_final_loss(log(noisy_end), options).status == "held"
    assert check_final_loss(log([0.6, 0.7, 0.6, 0.7, 0.4]), options).status == "violated"
    assert final_loss(log([9.0, 1.0, 2.0]), window=2) == pytest.approx(1.5)


# -- harness: no crash -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("exits", "expected"),
    [
        ([ProcessExit("g1", 3.0, -9, "sigkill", 3)], []),
        ([ProcessExit("g0", 9.0, 0, None, 5)], []),
        ([ProcessExit("g2", 4.0, 1, None, 4, "Traceback ...")], [(4, "g2")]),
    ],
    ids=["killed by an injected fault", "clean exit", "died on its own"],
)
def test_no_crash(exits: list[ProcessExit], expected: list[tuple[int | None, str | None]]) -> None:
    assert offences(check_no_crash(exits)) == expected


# -- all together ----------------------------------------------------------------------------------


def test_healthy_run_holds_every_checkable_invariant() -> None:
    verdicts = check_all(
        with_loss(healthy(), 0.5),
        [fault("sigkill", "g1", 2.5)],
        [],
        CheckOptions(hang_bound_s=5.0, target_steps=5, reference_final_loss=0.5),
    )
    assert [v.invariant for v in verdicts] == [
        IDENTICAL_DIGESTS,
        MONOTONIC_STEPS,
        EXACTLY_ONCE_SAMPLES,
        NO_HANG,
        FINAL_LOSS,
        NO_CRASH,
    ]
    assert {v.status for v in verdicts} == {"held"}


def test_a_log_breaking_everything_reports_each_invariant() -> None:
    log = replace_digest(healthy(), "g1", 2, "bad")
    log = with_samples(log, None, 4, (3 * BATCH + 1, 4 * BATCH))
    log += [commit("g0", 3, 6.0, quorum_id=2)]
    log = with_loss(log, 0.9)
    verdicts = check_all(
        log,
        [fault("sigkill", "g2", 7.0)],
        [ProcessExit("g1", 4.0, 1, None, 4)],
        CheckOptions(hang_bound_s=5.0, target_steps=10, reference_final_loss=0.5),
    )
    violated = {v.invariant for v in verdicts if v.status == "violated"}
    assert violated == {IDENTICAL_DIGESTS, MONOTONIC_STEPS, EXACTLY_ONCE_SAMPLES, NO_HANG, FINAL_LOSS, NO_CRASH}


# -- every group killed at once: a resume from disk is a sanctioned rollback ----------------------


def resumed_run(
    *, resume_step: int | None = 3, redo_from: int = 4, redo_digest: str = "r"
) -> tuple[list[Event], float]:
    """Steps 1..5 (epoch 0); every group killed at t=10; restarted, they resume from checkpoint
    ``resume_step`` and commit steps ``redo_from``..7 under quorum 2 (epoch 1)."""
    log = healthy()
    for i, g in enumerate(GROUPS):
        log.append(start(g, 11.0, pid=300 + i))
        if resume_step is not None:
            log.append(
                ev("resume", g, resume_step, 12.0, quorum_id=2, checkpoint_step=resume_step, digest=f"d{resume_step}")
            )
    for s in range(redo_from, 8):
        for g in GROUPS:
            log.append(commit(g, s, 12.0 + s, quorum_id=2, samples=((s - 1) * BATCH, s * BATCH)))
            log.append(digest(g, s, 12.01 + s, f"{redo_digest}{s}"))
    return log, 10.0


def test_steps_redone_after_a_resume_from_disk_are_not_a_rollback() -> None:
    log, killed = resumed_run()
    verdicts = check_all(
        log,
        [InjectedFault("kill_all_groups", "all groups", killed)],
        [],
        CheckOptions(hang_bound_s=7.0, target_steps=7, epoch_starts=(killed,)),
    )
    assert {v.invariant: v.status for v in verdicts} == {
        IDENTICAL_DIGESTS: "held",
        MONOTONIC_STEPS: "held",
        EXACTLY_ONCE_SAMPLES: "held",
        NO_HANG: "held",
        FINAL_LOSS: "not_checked",
        NO_CRASH: "held",
    }


def test_without_the_epoch_the_same_log_is_a_rollback() -> None:
    log, _ = resumed_run()
    assert check_monotonic_steps(log).status == "violated"
    assert check_identical_digests(log).status == "violated"  # redone steps carry other digests


def test_an_epoch_committing_at_or_below_its_resume_point_is_flagged() -> None:
    log, killed = resumed_run(resume_step=3, redo_from=3)
    (violation,) = check_monotonic_steps(log, (killed,)).violations
    assert violation.step == 3 and "resumed from checkpoint step 3" in violation.detail


def test_exactly_once_judges_the_surviving_history() -> None:
    # The redone steps 4..7 consume what epoch 0's steps 4..5 had consumed: no overlap is reported.
    log, killed = resumed_run()
    assert check_exactly_once_samples(log, (killed,)).status == "held"
    # A resume that restored a stale cursor (step 4 starting 10 samples early) is an overlap.
    bad = with_samples(log, None, 4, (3 * BATCH - 10, 4 * BATCH))
    bad = [e for e in bad if not (e["event"] == "commit" and e["step"] == 4 and e["ts"] < 10.0)]
    assert offences(check_exactly_once_samples(bad, (killed,))) == [(4, None)]


def test_recovery_after_every_group_died_counts_any_commit() -> None:
    log, killed = resumed_run()
    verdict = check_no_hang(
        log,
        [InjectedFault("kill_all_groups", "all groups", killed)],
        CheckOptions(hang_bound_s=7.0, target_steps=7, epoch_starts=(killed,)),
    )
    assert verdict.status == "held"  # step 4 at t=16 is below the old frontier (5) but is new work
