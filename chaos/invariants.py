"""The invariants of DESIGN.md, checked over a run's event logs: pure functions, no I/O.

Each check takes the groups' events (``replicaft/telemetry/events.py`` schema, each rank's events in
the order it wrote them) and what the harness recorded (faults injected, process exits), and
returns a :class:`Verdict`: ``held``, ``violated`` (with one :class:`Violation` per offence,
so a report can point at the step and group), or ``not_checked`` with the reason. A check
that cannot be made says so; it never passes by default.

==========================  ====================================================================
name                        DESIGN.md invariant
==========================  ====================================================================
``identical_digests``       1. bitwise-identical state across groups after each committed step
``monotonic_steps``         2. committed steps monotonic per group and never lost
``exactly_once_samples``    3. every sample consumed by exactly one committed step
``no_hang``                 4. every failure followed by a committed step within a bound
``final_loss``              5. final loss matches a fault-free run within tolerance
``no_crash``                (harness) no group dies of something the harness did not inject
==========================  ====================================================================

Design choice for "never lost": events from different processes are written after the fact
(a healer's ``commit`` can carry a later ``ts`` than a donor's next commit; 0.9 s measured on
the 2-core development box), so ordering commits by wall-clock time across groups would
report rollbacks that never happened. Quorum ids give the order instead: they only grow, also
across lighthouse restarts (DESIGN, "Restart-safe epochs"), so every step committed under a
later quorum must lie above every step committed under an earlier one. A rollback (the job
resuming below its frontier) breaks exactly that, whatever the timestamps say.
"""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

from chaos.record import InjectedFault, ProcessExit
from chaos.scenario import ALL_GROUPS_KINDS
from chaos.timeline import Commit, Event, commits, epoch_of, frontier, next_commit, stream_key

Status = Literal["held", "violated", "not_checked"]

IDENTICAL_DIGESTS = "identical_digests"
MONOTONIC_STEPS = "monotonic_steps"
EXACTLY_ONCE_SAMPLES = "exactly_once_samples"
NO_HANG = "no_hang"
FINAL_LOSS = "final_loss"
NO_CRASH = "no_crash"


@dataclass(frozen=True, slots=True)
class Violation:
    invariant: str
    step: int | None
    group: str | None
    detail: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class Verdict:
    invariant: str
    status: Status
    note: str
    """What was compared (counts), or why the check could not be made."""
    violations: tuple[Violation, ...] = ()


@dataclass(frozen=True, kw_only=True, slots=True)
class CheckOptions:
    hang_bound_s: float
    """A fault not followed by a committed step within this many seconds is a hang."""
    target_steps: int | None = None
    """Steps the job was asked to train; a job that stops short of them hung (or was cut off)."""
    reference_final_loss: float | None = None
    """Final loss of a fault-free run of the same scenario; None: invariant 5 not checked."""
    loss_tolerance: float = 0.1
    """Allowed relative difference of the final loss from the reference."""
    loss_window: int = 100
    """The final loss is the median over this many last committed steps (see ``final_loss``)."""
    epoch_starts: tuple[float, ...] = ()
    """Sorted times every group was killed at once (see the module docstring)."""
    deadline_exceeded: bool = False
    """The run's deadline passed before every group had ended (runner.py)."""


def epoch_starts(faults: Sequence[InjectedFault]) -> tuple[float, ...]:
    """When every group was killed at once: the faults after which the job resumes from disk."""
    return tuple(sorted(f.ts for f in faults if f.kind in ALL_GROUPS_KINDS))


def verdict(invariant: str, violations: Sequence[Violation], note: str) -> Verdict:
    return Verdict(invariant, "violated" if violations else "held", note, tuple(violations))


def check_identical_digests(events: Sequence[Event], epoch_starts: Sequence[float] = ()) -> Verdict:
    """Invariant 1: for every (step, group rank), every group that reported a digest reported the same.

    Ranks are compared column-wise (rank r of each group): with sharding inside a group
    (W > 1) different ranks hold different shards. When groups disagree, the groups outside
    the majority digest are named; with no majority the violation names no group. A step
    redone after a resume from disk (a later epoch) is a new history and compared within it.
    """
    reported: dict[tuple[int, int, int], dict[str, str]] = defaultdict(dict)
    violations = []
    for e in events:
        # ``sync_digest`` (replicaft.local_sgd): the replicated state entering a sync, which
        # is the state after the previous committed sync, so it is filed under that step.
        if e["event"] == "commit" and e.get("committed") and "sync_digest" in e:
            e = {**e, "step": int(e["step"]) - 1, "digest": e["sync_digest"]}
        elif e["event"] != "committed" or "digest" not in e:
            continue
        group, rank = stream_key(e)
        step = int(e["step"])
        seen = reported[(epoch_of(float(e["ts"]), epoch_starts), step, rank)].setdefault(group, str(e["digest"]))
        if seen != e["digest"]:
            violations.append(
                Violation(
                    IDENTICAL_DIGESTS,
                    step,
                    group,
                    f"{group} reported two different states for step {step} (rank {rank}): {seen[:12]} then "
                    f"{str(e['digest'])[:12]}",
                )
            )
    compared = 0
    for (_, step, rank), by_group in sorted(reported.items()):
        if len(by_group) < 2:
            continue
        compared += 1
        counts = Counter(by_group.values())
        if len(counts) == 1:
            continue
        shown = ", ".join(f"{g}={d[:12]}" for g, d in sorted(by_group.items()))
        majority, num = counts.most_common(1)[0]
        if num * 2 > len(by_group):
            for group, d in sorted(by_group.items()):
                if d != majority:
                    violations.append(
                        Violation(
                            IDENTICAL_DIGESTS,
                            step,
                            group,
                            f"state after step {step} (rank {rank}) differs from the other groups: {shown}",
                        )
                    )
        else:
            violations.append(
                Violation(
                    IDENTICAL_DIGESTS,
                    step,
                    None,
                    f"groups diverged after step {step} (rank {rank}) with no majority: {shown}",
                )
            )
    if compared == 0 and not violations:
        return Verdict(IDENTICAL_DIGESTS, "not_checked", "no step has digests from two or more groups")
    return verdict(IDENTICAL_DIGESTS, violations, f"{compared} (step, rank) pairs compared across groups")


def check_monotonic_steps(events: Sequence[Event], epoch_starts: Sequence[float] = ()) -> Verdict:
    """Invariant 2: per process, committed steps strictly increase; across the job, none is lost.

    * Within one incarnation of a rank, each commit's step exceeds the previous one. A
      restarted process may start anywhere (it heals to the job's step), so the sequence
      restarts at each ``start`` event.
    * Across the job, ordered by quorum id (see the module docstring for why not by time):
      the lowest step committed under a quorum exceeds every step committed under earlier
      quorums of the same epoch. One violation per offending quorum.
    * An epoch after every group was killed starts above the step its groups resumed from
      (the highest ``checkpoint_step`` of its ``resume`` events); without a resume it may
      start anywhere (what was lost is ``chaos/outcomes.py``'s to judge).
    """
    all_commits = commits(events, epoch_starts)
    violations = []
    last: dict[tuple[str, int, int], Commit] = {}
    for c in all_commits:
        key = (c.group, c.rank, c.incarnation)
        prev = last.get(key)
        if prev is not None and c.step <= prev.step:
            violations.append(
                Violation(
                    MONOTONIC_STEPS,
                    c.step,
                    c.group,
                    f"{c.group} rank {c.rank} committed step {c.step} after step {prev.step} in the same process "
                    f"(incarnation {c.incarnation}, quorum {prev.quorum_id} then {c.quorum_id})",
                )
            )
        last[key] = c
    resumed = resume_steps(events, epoch_starts)
    by_quorum: dict[tuple[int, int], list[Commit]] = defaultdict(list)
    for c in all_commits:
        by_quorum[(c.epoch, c.quorum_id)].append(c)
    highest: Commit | None = None
    epoch = 0
    for key in sorted(by_quorum):
        if key[0] != epoch:
            epoch, highest = key[0], None
            violations += _below_resume(by_quorum[key], epoch, resumed.get(epoch))
        in_quorum = by_quorum[key]
        lowest = min(in_quorum, key=lambda c: c.step)
        if highest is not None and lowest.step <= highest.step:
            groups = sorted({c.group for c in in_quorum if c.step == lowest.step})
            violations.append(
                Violation(
                    MONOTONIC_STEPS,
                    lowest.step,
                    groups[0],
                    f"quorum {key[1]} committed step {lowest.step} (by {', '.join(groups)}) although step "
                    f"{highest.step} had been committed under earlier quorum {highest.quorum_id} (by {highest.group}): "
                    "committed steps were lost (training rolled back)",
                )
            )
        top = max(in_quorum, key=lambda c: c.step)
        if highest is None or top.step > highest.step:
            highest = top
    if not all_commits:
        return Verdict(MONOTONIC_STEPS, "not_checked", "no committed steps")
    note = f"{len(all_commits)} commits in {len(last)} process incarnations and {len(by_quorum)} quorums"
    if epoch_starts:
        note += f", {len(epoch_starts) + 1} epochs (every group killed {len(epoch_starts)}x, resumed from disk)"
    return verdict(MONOTONIC_STEPS, violations, note)


def resume_steps(events: Sequence[Event], epoch_starts: Sequence[float]) -> dict[int, int]:
    """Epoch -> the highest ``checkpoint_step`` its groups resumed from (epochs without a resume left out)."""
    resumed: dict[int, int] = {}
    for e in events:
        if e["event"] == "resume" and isinstance(e.get("checkpoint_step"), int):
            epoch = epoch_of(float(e["ts"]), epoch_starts)
            resumed[epoch] = max(resumed.get(epoch, -1), int(e["checkpoint_step"]))
    return resumed


def _below_resume(first_quorum: Sequence[Commit], epoch: int, resume_step: int | None) -> list[Violation]:
    """The first quorum of an epoch must commit above the step its groups resumed from."""
    if resume_step is None:
        return []
    lowest = min(first_quorum, key=lambda c: c.step)
    if lowest.step > resume_step:
        return []
    return [
        Violation(
            MONOTONIC_STEPS,
            lowest.step,
            lowest.group,
            f"after every group was killed (epoch {epoch}) the job resumed from checkpoint step {resume_step} "
            f"but quorum {lowest.quorum_id} committed step {lowest.step}: steps at or below the resume point "
            "were committed again",
        )
    ]


def check_exactly_once_samples(events: Sequence[Event], epoch_starts: Sequence[float] = ()) -> Verdict:
    """Invariant 3: the sample ranges of the job's committed steps tile the global order.

    ``replicaft.data.ExactlyOnceSampler`` annotates each commit with ``samples: [start, stop]``,
    the positions of the global sample order the whole step consumed (split among the
    contributing groups by ``replicaft.data.assign_share``, which has its own unit tests). So
    exactly-once holds when every group that committed a step reports the same range, the
    job's first step starts at position 0, and each step starts where the previous one stopped:
    a gap is samples never trained, an overlap samples trained twice. Steps whose commit no
    group reported are not judged across (noted). Without ``samples`` in the events (a
    training script without the sampler) the invariant is reported as not checked.

    After a resume from disk the job redoes steps; the history that counts is the surviving
    one: the steps up to the resume point from before, then the new epoch's commits.
    """
    if any(e["event"] == "commit" and "sample_ranges" in e for e in events):
        return _check_leased_samples(events)
    by_epoch: dict[int, dict[int, dict[str, tuple[int, int]]]] = defaultdict(lambda: defaultdict(dict))
    for e in events:
        if (
            e["event"] == "commit"
            and e.get("committed")
            and isinstance(e.get("samples"), list)
            and len(e["samples"]) == 2
        ):
            epoch = epoch_of(float(e["ts"]), epoch_starts)
            by_epoch[epoch][int(e["step"])].setdefault(
                str(e["replica_id"]), (int(e["samples"][0]), int(e["samples"][1]))
            )
    resumed = resume_steps(events, epoch_starts)
    ranges: dict[int, dict[str, tuple[int, int]]] = {}
    for epoch in sorted(by_epoch):
        if epoch:
            keep = resumed.get(epoch, 0)
            ranges = {step: r for step, r in ranges.items() if step <= keep}
        ranges.update(by_epoch[epoch])
    if not ranges:
        return Verdict(
            EXACTLY_ONCE_SAMPLES,
            "not_checked",
            "no commit event carries 'samples' (the training script does not use "
            "replicaft.data.ExactlyOnceSampler), so sample consumption cannot be checked",
        )
    violations = []
    agreed: dict[int, tuple[int, int]] = {}
    for step, by_group in sorted(ranges.items()):
        counts = Counter(by_group.values())
        agreed[step] = counts.most_common(1)[0][0]
        if len(counts) > 1:
            shown = ", ".join(f"{g}=[{a}, {b})" for g, (a, b) in sorted(by_group.items()))
            violations.append(
                Violation(EXACTLY_ONCE_SAMPLES, step, None, f"groups disagree on the samples of step {step}: {shown}")
            )
    unjudged = 0
    for step, (start, stop) in sorted(agreed.items()):
        if step == 1 and start != 0:
            violations.append(
                Violation(
                    EXACTLY_ONCE_SAMPLES,
                    step,
                    None,
                    f"the job's first step consumed [{start}, {stop}); positions [0, {start}) were never trained",
                )
            )
        if step - 1 not in agreed:
            unjudged += step > 1
            continue
        prev_stop = agreed[step - 1][1]
        if start > prev_stop:
            violations.append(
                Violation(
                    EXACTLY_ONCE_SAMPLES,
                    step,
                    None,
                    f"step {step} consumed [{start}, {stop}) but step {step - 1} stopped at {prev_stop}: "
                    f"positions [{prev_stop}, {start}) were never trained",
                )
            )
        elif start < prev_stop:
            violations.append(
                Violation(
                    EXACTLY_ONCE_SAMPLES,
                    step,
                    None,
                    f"step {step} consumed [{start}, {stop}) but step {step - 1} already took up to {prev_stop}: "
                    f"positions [{start}, {min(stop, prev_stop)}) were trained twice",
                )
            )
    cursor = agreed[max(agreed)][1]
    note = (
        f"{len(agreed)} committed steps tile positions [0, {cursor})"
        if not violations
        else f"{len(agreed)} committed steps with sample ranges"
    )
    if unjudged:
        note += f"; {unjudged} steps follow a step with no reported range and were not judged against it"
    return verdict(EXACTLY_ONCE_SAMPLES, violations, note)


def _check_leased_samples(events: Sequence[Event]) -> Verdict:
    """Invariant 3 for semi-synchronous training (replicaft.local_sgd.leases): each committed
    sync reports the ranges it consumed (``sample_ranges``) and, after it, the ranges leased
    but not consumed yet (``samples_open``) below ``samples_cursor``. Exactly once holds when
    the groups agree per step, no position is consumed by two steps, and at the last step the
    consumed and open ranges tile [0, cursor) with neither gap nor overlap."""
    reported: dict[int, dict[str, tuple[tuple[tuple[int, int], ...], tuple[tuple[int, int], ...], int]]] = defaultdict(
        dict
    )
    for e in events:
        if e["event"] == "commit" and e.get("committed") and "sample_ranges" in e:
            key = (
                tuple((int(a), int(b)) for a, b in e["sample_ranges"]),
                tuple((int(a), int(b)) for a, b in e.get("samples_open", [])),
                int(e.get("samples_cursor", 0)),
            )
            reported[int(e["step"])].setdefault(str(e["replica_id"]), key)
    violations = []
    owner: dict[int, int] = {}
    agreed = {}
    for step, by_group in sorted(reported.items()):
        counts = Counter(by_group.values())
        agreed[step] = counts.most_common(1)[0][0]
        if len(counts) > 1:
            shown = ", ".join(f"{g}={list(v[0])}" for g, v in sorted(by_group.items()))
            violations.append(
                Violation(EXACTLY_ONCE_SAMPLES, step, None, f"groups disagree on the samples of sync {step}: {shown}")
            )
        for a, b in agreed[step][0]:
            for position in range(a, b):
                if position in owner:
                    violations.append(
                        Violation(
                            EXACTLY_ONCE_SAMPLES,
                            step,
                            None,
                            f"position {position} consumed by step {owner[position]} and again by step {step}",
                        )
                    )
                    break
                owner[position] = step
    last = max(agreed)
    open_positions = {p for a, b in agreed[last][1] for p in range(a, b)}
    cursor = agreed[last][2]
    both = open_positions & {p for p, s in owner.items() if s <= last}
    lost = set(range(cursor)) - open_positions - set(owner)
    if both:
        violations.append(
            Violation(
                EXACTLY_ONCE_SAMPLES,
                last,
                None,
                f"{len(both)} positions both consumed and still leased, e.g. {min(both)}",
            )
        )
    if lost:
        violations.append(
            Violation(
                EXACTLY_ONCE_SAMPLES,
                last,
                None,
                f"{len(lost)} positions below {cursor} neither consumed nor leased, e.g. {min(lost)}",
            )
        )
    note = (
        f"{len(agreed)} committed syncs consumed {len(owner)} positions exactly once; {len(open_positions)} leased, "
        f"none lost, below cursor {cursor}"
    )
    return verdict(EXACTLY_ONCE_SAMPLES, violations, note)


def check_no_hang(events: Sequence[Event], faults: Sequence[InjectedFault], options: CheckOptions) -> Verdict:
    """Invariant 4: after every fault some group commits a new step within ``hang_bound_s``.

    "New" = above the job's highest committed step at the fault: the survivors' commits of
    the step that was in flight when the fault hit show nothing about recovery. After every
    group was killed, any commit is new (every process committing it was started afterwards).

    Also a hang: the job ending below ``target_steps`` (the run was cut off by its deadline,
    or every group gave up), and the run's deadline passing before every group had ended, even
    after the target step (a group that would not finish its last steps or exit).
    """
    all_commits = commits(events)
    violations = []
    for f in faults:
        above = -1 if f.kind in ALL_GROUPS_KINDS else frontier(all_commits, f.ts)
        nxt = next_commit(all_commits, f.ts, above_step=above)
        waited = None if nxt is None else nxt.ts - f.ts
        if waited is None or waited > options.hang_bound_s:
            seen = (
                "no committed step afterwards"
                if waited is None
                else f"the next committed step came {waited:.1f}s later"
            )
            violations.append(
                Violation(
                    NO_HANG,
                    frontier(all_commits, f.ts),
                    f.target,
                    f"{f.kind} of {f.target}: {seen} (bound {options.hang_bound_s:g}s)",
                )
            )
    final = max((c.step for c in all_commits), default=0)
    if options.target_steps is not None and final < options.target_steps:
        violations.append(Violation(NO_HANG, final, None, f"the job stopped at step {final} of {options.target_steps}"))
    elif options.deadline_exceeded:
        violations.append(
            Violation(NO_HANG, final, None, f"the run's deadline passed at step {final} before every group had ended")
        )
    return verdict(NO_HANG, violations, f"{len(faults)} faults, bound {options.hang_bound_s:g}s")


def _reports_loss(e: Event) -> bool:
    # events.py documents ``loss`` on the ``committed`` event; ``Manager.annotate_commit`` (how
    # the sampler reports ``samples``) puts fields on the ``commit`` event: accept either.
    committed = e["event"] == "committed" or (e["event"] == "commit" and e.get("committed"))
    return bool(committed) and isinstance(e.get("loss"), int | float)


def final_loss(events: Sequence[Event], window: int = 100) -> float | None:
    """The median, over the last ``window`` committed steps that report a ``loss``, of the
    mean over groups of that step's loss.

    Not the last step's loss alone: near convergence one batch's loss swings by tens of percent
    from step to step (the soak's fault-free run: mean 4.1e-4, standard deviation 1.3e-4), and
    a step just after a fault is trained by fewer groups on a smaller global batch, so its loss
    can spike. The median of a window ignores both and still moves when training really went
    worse.
    """
    losses: dict[int, dict[str, float]] = defaultdict(dict)
    for e in events:
        if _reports_loss(e):
            losses[int(e["step"])][str(e["replica_id"])] = float(e["loss"])
    if not losses:
        return None
    last = sorted(losses)[-window:]
    return statistics.median(sum(losses[s].values()) / len(losses[s]) for s in last)


def check_final_loss(events: Sequence[Event], options: CheckOptions) -> Verdict:
    """Invariant 5: ``|loss - reference| <= loss_tolerance * |reference|``, when both are known."""
    loss = final_loss(events, options.loss_window)
    if loss is None:
        return Verdict(
            FINAL_LOSS,
            "not_checked",
            "no committed step reports a 'loss' (the training script does not pass one to Manager.annotate_commit)",
        )
    ref = options.reference_final_loss
    if ref is None:
        return Verdict(
            FINAL_LOSS, "not_checked", f"final loss {loss:.6g}, but no fault-free reference run to compare with"
        )
    step = max((int(e["step"]) for e in events if _reports_loss(e)), default=None)
    allowed = options.loss_tolerance * abs(ref)
    note = (
        f"final loss {loss:.6g} vs fault-free {ref:.6g} (median of the last {options.loss_window} steps; "
        f"allowed difference {allowed:.3g})"
    )
    if abs(loss - ref) > allowed:
        return verdict(FINAL_LOSS, [Violation(FINAL_LOSS, step, None, note)], note)
    return verdict(FINAL_LOSS, [], note)


def check_no_crash(exits: Sequence[ProcessExit]) -> Verdict:
    """No group exits with an error that no injected fault explains.

    Not one of DESIGN's five, but its failure model promises that training continues with a
    clear message: a group dying by itself (a traceback, an unhandled error) is a failure the
    harness must report rather than quietly restart.
    """
    violations = [
        Violation(NO_CRASH, x.step, x.group, f"{x.group} exited with code {x.code} with no fault injected: {x.detail}")
        for x in exits
        if x.caused_by is None and x.code != 0
    ]
    return verdict(NO_CRASH, violations, f"{len(exits)} process exits during the run")


def check_all(
    events: Sequence[Event], faults: Sequence[InjectedFault], exits: Sequence[ProcessExit], options: CheckOptions
) -> tuple[Verdict, ...]:
    """Every verdict, in DESIGN's order, then the harness's own."""
    return (
        check_identical_digests(events, options.epoch_starts),
        check_monotonic_steps(events, options.epoch_starts),
        check_exactly_once_samples(events, options.epoch_starts),
        check_no_hang(events, faults, options),
        check_final_loss(events, options),
        check_no_crash(exits),
    )
