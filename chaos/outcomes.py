"""The outcome each fault kind promises (DESIGN, "Failure model"), checked over a run's events. Pure.

The five invariants (``chaos/invariants.py``) hold for any fault; each kind also has its own
defined outcome, which only that kind's events can show. A verdict is produced only for kinds
the run injected, so a smoke run's summary is not padded with checks that do not apply.

==============================  =====================================================================
name                            outcome
==============================  =====================================================================
``faults_rejoined``             every group hit by a fault commits again once it is back (SIGCONT,
                                restarted, link restored), unless the job ended within
                                ``hang_bound_s`` of that; a partitioned group also heals
``preemption_handled``          after SIGTERM each rank emits ``stop`` (preempted) and, for W = 1,
                                exits 143; the writer group publishes a checkpoint first
``preemption_notice_handled``   after its notice file appeared, the target emits ``preemption_notice``
                                and exits 143 with no signal from the harness (W = 1), and commits
                                again once restarted (unless the job ended first)
``heal_survives_donor_loss``    the heal whose donor died mid-transfer still completes (from the
                                other donors) and the healer commits
``resume_from_disk``            after every group was killed, the groups resume from the newest
                                intact checkpoint: no more than one interval plus
                                ``resume_slack_steps`` is lost, the resumed state's digest is that
                                of the step committed before, and a damaged checkpoint is skipped
``disk_full_refused``           while the disk is full, due saves are refused or fail with a reason
                                that names the cause, and saves succeed again once it is freed
==============================  =====================================================================
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from chaos.invariants import Verdict, Violation, verdict
from chaos.record import ALL_GROUPS, JOB_TARGETS, InjectedFault, ProcessExit
from chaos.scenario import ALL_GROUPS_KINDS, CORRUPTING_KINDS, OBJECT_STORE_KINDS
from chaos.timeline import Commit, Event, commits, epoch_of, next_commit

FAULTS_REJOINED = "faults_rejoined"
PREEMPTION_HANDLED = "preemption_handled"
PREEMPTION_NOTICE_HANDLED = "preemption_notice_handled"
HEAL_SURVIVES_DONOR_LOSS = "heal_survives_donor_loss"
RESUME_FROM_DISK = "resume_from_disk"
DISK_FULL_REFUSED = "disk_full_refused"

PREEMPTED_EXIT_CODE = 143
"""``replicaft.persistence.duties.PREEMPTED_EXIT_CODE`` (repeated: importing replicaft imports torch)."""
_DISK_FULL_WORDS = ("space", "enospc", "full")


@dataclass(frozen=True, kw_only=True, slots=True)
class OutcomeOptions:
    hang_bound_s: float
    ended_ts: float
    """When the run ended: a target coming back later than ``ended_ts - hang_bound_s`` had no time to rejoin."""
    checkpoint_interval_steps: int = 0
    resume_slack_steps: int = 2
    ranks_per_group: int = 1


def check_outcomes(
    events: Sequence[Event], faults: Sequence[InjectedFault], exits: Sequence[ProcessExit], options: OutcomeOptions
) -> tuple[Verdict, ...]:
    """The verdicts of the kinds this run injected, in the table's order."""
    starts = tuple(sorted(f.ts for f in faults if f.kind in ALL_GROUPS_KINDS))
    all_commits = commits(events, starts)
    kinds = {f.kind for f in faults}
    out = []
    if any(f.target not in JOB_TARGETS for f in faults):
        out.append(check_faults_rejoined(events, all_commits, faults, options))
    if "sigterm" in kinds:
        out.append(check_preemption_handled(events, faults, exits, options))
    if "preemption_notice" in kinds:
        out.append(check_preemption_notice_handled(events, all_commits, faults, exits, options))
    if "kill_donor_mid_heal" in kinds:
        out.append(check_heal_survives_donor_loss(events, all_commits, faults))
    if kinds & ALL_GROUPS_KINDS:
        out.append(check_resume_from_disk(events, all_commits, faults, options))
    if "fill_disk" in kinds:
        out.append(check_disk_full_refused(events, all_commits, faults, options))
    return tuple(out)


def _by(events: Sequence[Event], kind: str, group: str | None = None, after: float = float("-inf")) -> list[Event]:
    return [e for e in events if e["event"] == kind and (group is None or e["replica_id"] == group) and e["ts"] > after]


def check_faults_rejoined(
    events: Sequence[Event], all_commits: Sequence[Commit], faults: Sequence[InjectedFault], options: OutcomeOptions
) -> Verdict:
    violations, rejoined, late = [], 0, 0
    for f in faults:
        if f.target in JOB_TARGETS:
            continue
        back = None if f.resumed_ts is None else next_commit(all_commits, f.resumed_ts, group=f.target)
        if back is None:
            if f.resumed_ts is None or f.resumed_ts > options.ended_ts - options.hang_bound_s:
                late += 1  # the job ended before it could have rejoined
            else:
                violations.append(
                    Violation(
                        FAULTS_REJOINED,
                        None,
                        f.target,
                        f"{f.label or f.kind}: {f.target} was back {f.resumed_ts - f.ts:.1f}s after the "
                        f"fault but never committed again (the job went on for "
                        f"{options.ended_ts - f.resumed_ts:.0f}s)",
                    )
                )
            continue
        rejoined += 1
        if f.kind == "partition" and not any(e.get("ok") for e in _by(events, "heal_end", f.target, after=f.ts)):
            violations.append(
                Violation(
                    FAULTS_REJOINED,
                    back.step,
                    f.target,
                    f"{f.label}: {f.target} committed again after its link was restored, but reported "
                    "no successful heal although the others went on without it",
                )
            )
    note = f"{rejoined} fault(s) on a group: the target committed again after it was back"
    if late:
        note += (
            f"; {late} target(s) came back within {options.hang_bound_s:g}s of the end (or never) and were not judged"
        )
    return verdict(FAULTS_REJOINED, violations, note)


def check_preemption_handled(
    events: Sequence[Event], faults: Sequence[InjectedFault], exits: Sequence[ProcessExit], options: OutcomeOptions
) -> Verdict:
    violations, saves = [], 0
    for f in (f for f in faults if f.kind == "sigterm"):
        stops = [e for e in _by(events, "stop", f.target, after=f.ts) if "preempt" in str(e.get("reason", ""))]
        ranks = {int(e["group_rank"]) for e in stops}
        missing = sorted(set(range(options.ranks_per_group)) - ranks)
        if missing:
            violations.append(
                Violation(
                    PREEMPTION_HANDLED,
                    None,
                    f.target,
                    f"{f.label}: rank(s) {missing} of {f.target} emitted no 'stop' (preempted) event: "
                    "SIGTERM was not handled at a step boundary",
                )
            )
        exit_ = next((x for x in exits if x.group == f.target and x.ts >= f.ts and x.caused_by == "sigterm"), None)
        if options.ranks_per_group == 1 and exit_ is not None and exit_.code != PREEMPTED_EXIT_CODE:
            violations.append(
                Violation(
                    PREEMPTION_HANDLED,
                    exit_.step,
                    f.target,
                    f"{f.label}: {f.target} exited with code {exit_.code}, not {PREEMPTED_EXIT_CODE}",
                )
            )
        if options.checkpoint_interval_steps and _was_writer(events, f):
            end = min((float(e["ts"]) for e in stops), default=float("inf"))
            saved = [e for e in _by(events, "checkpoint", f.target, after=f.ts) if e.get("ok") and e["ts"] <= end + 1.0]
            saves += bool(saved)
            if not saved:
                violations.append(
                    Violation(
                        PREEMPTION_HANDLED,
                        None,
                        f.target,
                        f"{f.label}: {f.target} was the writer group (replica rank 0) but published "
                        "no checkpoint before leaving (the emergency save is missing)",
                    )
                )
    num = sum(f.kind == "sigterm" for f in faults)
    note = f"{num} SIGTERM(s): every rank stopped at a step boundary" + (
        " with status 143" if options.ranks_per_group == 1 else ""
    )
    if saves:
        note += f"; {saves} emergency save(s) by the writer group"
    return verdict(PREEMPTION_HANDLED, violations, note)


def check_preemption_notice_handled(
    events: Sequence[Event],
    all_commits: Sequence[Commit],
    faults: Sequence[InjectedFault],
    exits: Sequence[ProcessExit],
    options: OutcomeOptions,
) -> Verdict:
    """The target read its notice, left by itself with status 143 (the runner records the cause
    ``preemption_notice`` only for an exit 143 of a notified group it sent no signal), and rejoined."""
    violations, rejoined = [], 0
    notices = [f for f in faults if f.kind == "preemption_notice"]
    for f in notices:
        if not _by(events, "preemption_notice", f.target, after=f.ts):
            violations.append(
                Violation(
                    PREEMPTION_NOTICE_HANDLED,
                    None,
                    f.target,
                    f"{f.label}: {f.target} emitted no 'preemption_notice' event after its "
                    "notice file was written (is REPLICAFT_PREEMPTION_NOTICE watched?)",
                )
            )
        exit_ = next((x for x in exits if x.group == f.target and x.ts >= f.ts), None)
        if exit_ is None:
            violations.append(
                Violation(
                    PREEMPTION_NOTICE_HANDLED, None, f.target, f"{f.label}: {f.target} never left after its notice"
                )
            )
            continue
        if options.ranks_per_group == 1 and (exit_.code != PREEMPTED_EXIT_CODE or exit_.caused_by != f.kind):
            violations.append(
                Violation(
                    PREEMPTION_NOTICE_HANDLED,
                    exit_.step,
                    f.target,
                    f"{f.label}: {f.target} ended with code {exit_.code} ({exit_.caused_by or 'no fault'}), "
                    f"not by itself with {PREEMPTED_EXIT_CODE} after its notice",
                )
            )
        back = None if f.resumed_ts is None else next_commit(all_commits, f.resumed_ts, group=f.target)
        rejoined += back is not None
        if back is None and f.resumed_ts is not None and f.resumed_ts <= options.ended_ts - options.hang_bound_s:
            violations.append(
                Violation(
                    PREEMPTION_NOTICE_HANDLED,
                    None,
                    f.target,
                    f"{f.label}: {f.target} was restarted after its notice but never committed again",
                )
            )
    note = f"{len(notices)} notice(s): the target left by itself with status {PREEMPTED_EXIT_CODE}; {rejoined} rejoined"
    return verdict(PREEMPTION_NOTICE_HANDLED, violations, note)


def _was_writer(events: Sequence[Event], f: InjectedFault) -> bool:
    quorums = [e for e in events if e["event"] == "quorum" and e["replica_id"] == f.target and e["ts"] <= f.ts]
    return bool(quorums) and max(quorums, key=lambda e: e["ts"]).get("replica_rank") == 0


def check_heal_survives_donor_loss(
    events: Sequence[Event], all_commits: Sequence[Commit], faults: Sequence[InjectedFault]
) -> Verdict:
    violations, notes = [], []
    for f in (f for f in faults if f.kind == "kill_donor_mid_heal"):
        heals = [
            e for e in events if e["event"] == "heal_start" and f.target in (e.get("donors") or []) and e["ts"] <= f.ts
        ]
        if not heals:
            violations.append(
                Violation(
                    HEAL_SURVIVES_DONOR_LOSS,
                    None,
                    f.target,
                    f"{f.label}: {f.target} died, but no heal listing it as a donor had started",
                )
            )
            continue
        heal = max(heals, key=lambda e: e["ts"])
        healer = str(heal["replica_id"])
        ended = [e for e in _by(events, "heal_end", healer, after=float(heal["ts"])) if e.get("ok")]
        committed = next_commit(all_commits, f.ts, group=healer)
        if not ended or committed is None:
            violations.append(
                Violation(
                    HEAL_SURVIVES_DONOR_LOSS,
                    int(heal.get("max_step", 0)),
                    healer,
                    f"{f.label}: {healer}'s heal from {heal.get('donors')} "
                    f"{'never completed' if not ended else 'completed'} and it "
                    f"{'never committed' if committed is None else 'committed'} after the donor died",
                )
            )
            continue
        first_ok = min(ended, key=lambda e: e["ts"])
        when = "after" if first_ok["ts"] > f.ts else "before"
        by_donor = first_ok.get("bytes_by_donor")
        notes.append(
            f"{healer} healed to step {heal.get('max_step')} from {heal.get('donors')} ({when} {f.target} died; "
            f"bytes by donor {by_donor}), committed {committed.ts - f.ts:.1f}s after"
        )
    return verdict(HEAL_SURVIVES_DONOR_LOSS, violations, "; ".join(notes) or "no heal completed")


def check_resume_from_disk(
    events: Sequence[Event], all_commits: Sequence[Commit], faults: Sequence[InjectedFault], options: OutcomeOptions
) -> Verdict:
    kills = sorted((f for f in faults if f.kind in ALL_GROUPS_KINDS), key=lambda f: f.ts)
    starts = [f.ts for f in kills]
    violations, notes = [], []
    for epoch, f in enumerate(kills, start=1):
        before = [c.step for c in all_commits if c.epoch == epoch - 1]
        frontier = max(before, default=0)
        resumes = [e for e in events if e["event"] == "resume" and epoch_of(float(e["ts"]), starts) == epoch]
        # After a cold start only what reached the object store survives the lost disks.
        saved = "checkpoint_upload" if f.kind in OBJECT_STORE_KINDS else "checkpoint"
        published = [
            int(e["checkpoint_step"])
            for e in events
            if e["event"] == saved
            and e.get("ok")
            and e["ts"] < f.ts
            and isinstance(e.get("checkpoint_step"), int)
            and (f.checkpoint_step is None or e["checkpoint_step"] < f.checkpoint_step)
        ]
        newest_intact = max(published, default=None)
        if not resumes:
            if newest_intact is not None:
                violations.append(
                    Violation(
                        RESUME_FROM_DISK,
                        None,
                        ALL_GROUPS,
                        f"{f.label}: no group resumed from disk although checkpoint step {newest_intact} "
                        "was published before every group was killed",
                    )
                )
            else:
                notes.append(f"{f.label}: nothing published before, restarted from step 0")
            continue
        resumed = max(int(e["checkpoint_step"]) for e in resumes)
        allowed = (
            options.checkpoint_interval_steps * (2 if f.kind in CORRUPTING_KINDS else 1) + options.resume_slack_steps
        )
        lost = frontier - resumed
        where = f"{f.label}: frontier {frontier}, resumed from checkpoint step {resumed}"
        if lost > allowed:
            violations.append(
                Violation(
                    RESUME_FROM_DISK,
                    resumed,
                    ALL_GROUPS,
                    f"{where}: {lost} steps lost, more than the {allowed} allowed",
                )
            )
        if newest_intact is not None and resumed < newest_intact:
            violations.append(
                Violation(
                    RESUME_FROM_DISK,
                    resumed,
                    ALL_GROUPS,
                    f"{where}, although intact checkpoint step {newest_intact} had been published",
                )
            )
        if f.kind in CORRUPTING_KINDS:
            if f.checkpoint_step is None:
                notes.append(f"{f.label}: {f.detail}")
            elif any(int(e["checkpoint_step"]) >= f.checkpoint_step for e in resumes):
                violations.append(
                    Violation(
                        RESUME_FROM_DISK,
                        f.checkpoint_step,
                        ALL_GROUPS,
                        f"{where}: the checkpoint of step {f.checkpoint_step} was damaged "
                        f"({f.detail}) and must have been skipped",
                    )
                )
        violations += _digest_mismatches(events, resumes, starts, epoch, f.label)
        notes.append(f"{where}: {lost} steps lost (allowed {allowed})")
    return verdict(RESUME_FROM_DISK, violations, "; ".join(notes))


def _digest_mismatches(
    events: Sequence[Event], resumes: Sequence[Event], starts: Sequence[float], epoch: int, label: str
) -> list[Violation]:
    """A resumed rank's state digest must equal the digest its column committed at that step before."""
    committed = {
        (int(e["step"]), int(e["group_rank"])): str(e["digest"])
        for e in events
        if e["event"] == "committed" and "digest" in e and epoch_of(float(e["ts"]), starts) < epoch
    }
    out = []
    for r in resumes:
        expected = committed.get((int(r["checkpoint_step"]), int(r["group_rank"])))
        if expected is not None and "digest" in r and str(r["digest"]) != expected:
            out.append(
                Violation(
                    RESUME_FROM_DISK,
                    int(r["checkpoint_step"]),
                    str(r["replica_id"]),
                    f"{label}: {r['replica_id']} rank {r['group_rank']} resumed from checkpoint step "
                    f"{r['checkpoint_step']} with state {str(r['digest'])[:12]}, but the state committed at "
                    f"that step was {expected[:12]}",
                )
            )
    return out


def check_disk_full_refused(
    events: Sequence[Event], all_commits: Sequence[Commit], faults: Sequence[InjectedFault], options: OutcomeOptions
) -> Verdict:
    violations, notes = [], []
    saves = [e for e in events if e["event"] == "checkpoint" and isinstance(e.get("checkpoint_step"), int)]
    for f in (f for f in faults if f.kind == "fill_disk"):
        freed = f.resumed_ts if f.resumed_ts is not None else options.ended_ts
        due_until = max((c.step for c in all_commits if c.ts <= freed), default=0)
        refused = [e for e in saves if not e.get("ok") and e["ts"] >= f.ts and e["checkpoint_step"] <= due_until]
        for e in refused:
            reason = str(e.get("reason") or "")
            if e.get("status") not in ("refused", "failed") or not any(w in reason.lower() for w in _DISK_FULL_WORDS):
                violations.append(
                    Violation(
                        DISK_FULL_REFUSED,
                        int(e["checkpoint_step"]),
                        str(e["replica_id"]),
                        f"{f.label}: the save of step {e['checkpoint_step']} ended with status "
                        f"{e.get('status')!r} and reason {reason!r}, which does not say the disk is full",
                    )
                )
        # A save of a step committed before the disk filled may have been written already.
        filled_at = max((c.step for c in all_commits if c.ts <= f.ts), default=0)
        wrong = [e for e in saves if e.get("ok") and f.ts <= e["ts"] <= freed and e["checkpoint_step"] > filled_at]
        for e in wrong:
            violations.append(
                Violation(
                    DISK_FULL_REFUSED,
                    int(e["checkpoint_step"]),
                    str(e["replica_id"]),
                    f"{f.label}: checkpoint step {e['checkpoint_step']} was published while the disk was "
                    "full: the fault did not take effect",
                )
            )
        later = [e for e in saves if e["ts"] > freed and e["checkpoint_step"] > due_until]
        if not refused:
            notes.append(f"{f.label}: no save came due while the disk was full (nothing to check)")
            continue
        if later and not any(e.get("ok") for e in later):
            violations.append(
                Violation(
                    DISK_FULL_REFUSED,
                    int(later[0]["checkpoint_step"]),
                    str(later[0]["replica_id"]),
                    f"{f.label}: saves still fail after the disk was freed: {later[0].get('reason')}",
                )
            )
        statuses = sorted({str(e.get("status")) for e in refused})
        after = (
            "; the next save succeeded" if any(e.get("ok") for e in later) else "; no save came due after it was freed"
        )
        notes.append(
            f"{f.label}: {len(refused)} save(s) {'/'.join(statuses)} ({str(refused[0].get('reason'))[:90]}…){after}"
        )
    if not notes and not violations:
        return Verdict(DISK_FULL_REFUSED, "not_checked", "no fill_disk fault took effect")
    if violations or any("nothing to check" not in n for n in notes):
        return verdict(DISK_FULL_REFUSED, violations, "; ".join(notes))
    return Verdict(DISK_FULL_REFUSED, "not_checked", "; ".join(notes))
