"""The summary of a chaos run: the figures and verdicts that ``summary.json`` holds. Pure.

The keys required by DESIGN.md ("Conventions other tools rely on") are always present:
``scenario``, ``faults_injected``, ``violations``, ``invariants_checked``, ``hangs``,
``committed_steps``, ``goodput``, ``goodput_vs_fault_free``, ``recovery_seconds``. The rest
(per-fault rows, verdict notes, exits, each resume's loss verdict) is there so a reader can see why a figure is what it
is.
"""

from __future__ import annotations

import datetime
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from chaos.bitwise import check_bitwise_equal, step_digests
from chaos.checkpoint_telemetry import cadence_decisions, save_telemetry
from chaos.invariants import NO_HANG, CheckOptions, check_all, epoch_starts, final_loss
from chaos.metrics import goodput, recovery_seconds, rejoin_seconds, summarise
from chaos.outcomes import OutcomeOptions, check_outcomes
from chaos.record import RunRecord
from chaos.timeline import Event, commits, frontier


@dataclass(frozen=True, slots=True)
class Reference:
    """Figures of a fault-free run of the same scenario, for the ``*_vs_fault_free`` comparisons."""

    goodput: float | None
    final_loss: float | None
    out_dir: str
    committed_steps: int
    finished: bool
    """It committed every step; an unfinished reference is no baseline and is not compared with."""
    digests: Mapping[tuple[int, int], str] = field(default_factory=dict)
    """(step, group rank) -> state digest after the step (chaos/bitwise.py)."""


def reference_from(record: RunRecord, events: Sequence[Event]) -> Reference:
    all_commits = commits(events)
    steps = max((c.step for c in all_commits), default=0)
    return Reference(
        goodput(all_commits).value,
        final_loss(events, record.scenario.loss_window),
        str(record.out_dir),
        steps,
        steps >= record.scenario.steps,
        step_digests(events),
    )


def _reference_note(reference: Reference | None, target_steps: int) -> str:
    if reference is None:
        return "null: no fault-free reference run was made (pass --reference to make one)"
    if not reference.finished:
        return (
            f"null: the fault-free reference run in {reference.out_dir} did not finish "
            f"({reference.committed_steps} of {target_steps} steps), so it is no baseline"
        )
    return f"against the fault-free run in {reference.out_dir} (goodput {reference.goodput:.4f})"


def resume_verdicts(events: Sequence[Event], started_ts: float) -> list[dict[str, Any]]:
    """One row per ``resume_verdict`` event (replicaft/persistence/resume_check.py), in time order: did each
    resume from disk train on like the run that wrote its checkpoint? A resume whose run ended
    before its verdict has no row (the ``resume`` events say it happened)."""
    rows = [
        {
            "group": e["replica_id"],
            "group_rank": e["group_rank"],
            "at_s": round(e["ts"] - started_ts, 3),
            "checkpoint_step": e.get("checkpoint_step"),
            "verdict": e.get("verdict"),
            "deviation": e.get("deviation"),
            "allowed": e.get("allowed"),
            "reason": e.get("reason"),
        }
        for e in events
        if e.get("event") == "resume_verdict"
    ]
    return sorted(rows, key=lambda r: r["at_s"])


def build_summary(record: RunRecord, events: Sequence[Event], reference: Reference | None = None) -> dict[str, Any]:
    """The ``summary.json`` object."""
    s = record.scenario
    starts = epoch_starts(record.faults)
    all_commits = commits(events, starts)
    baseline = reference if reference is not None and reference.finished else None
    options = CheckOptions(
        hang_bound_s=s.hang_bound_s,
        target_steps=s.steps,
        reference_final_loss=baseline.final_loss if baseline else None,
        loss_tolerance=s.loss_tolerance,
        loss_window=s.loss_window,
        epoch_starts=starts,
        deadline_exceeded=record.deadline_exceeded,
    )
    outcome_options = OutcomeOptions(
        hang_bound_s=s.hang_bound_s,
        ended_ts=record.ended_ts,
        checkpoint_interval_steps=s.checkpoint_interval_steps,
        resume_slack_steps=s.resume_slack_steps,
        ranks_per_group=s.ranks_per_group,
    )
    verdicts = (
        *check_all(events, record.faults, record.exits, options),
        *check_outcomes(events, record.faults, record.exits, outcome_options),
        check_bitwise_equal(
            events,
            baseline.digests if baseline else None,
            deterministic=s.deterministic,
            target_steps=s.steps,
            epoch_starts=starts,
        ),
    )
    violations = [v.to_dict() for verdict in verdicts for v in verdict.violations]
    recovery: dict[str, list[float]] = defaultdict(list)
    rejoin: dict[str, list[float]] = defaultdict(list)
    fault_rows = []
    for f in record.faults:
        rec, rej = recovery_seconds(all_commits, f), rejoin_seconds(all_commits, f)
        if rec is not None:
            recovery[f.kind].append(rec)
        if rej is not None:
            rejoin[f.kind].append(rej)
        fault_rows.append(
            {
                "kind": f.kind,
                "target": f.target,
                "label": f.label,
                "detail": f.detail,
                "at_s": round(f.ts - record.started_ts, 3),
                "step": frontier(all_commits, f.ts),
                "resumed_at_s": None if f.resumed_ts is None else round(f.resumed_ts - record.started_ts, 3),
                "recovery_s": None if rec is None else round(rec, 3),
                "rejoin_s": None if rej is None else round(rej, 3),
            }
        )
    gp = goodput(all_commits)
    ratio = None
    if baseline is not None and baseline.goodput and gp.value is not None:
        ratio = round(gp.value / baseline.goodput, 4)
    summary: dict[str, Any] = {
        "scenario": s.name,
        "description": s.description,
        "out_dir": str(record.out_dir),
        "started_at": datetime.datetime.fromtimestamp(record.started_ts, datetime.timezone.utc).isoformat(),
        "wall_seconds": round(record.ended_ts - record.started_ts, 3),
        "target_steps": s.steps,
        "groups": s.groups,
        "ranks_per_group": s.ranks_per_group,
        "environment": record.environment,
        "committed_steps": max((c.step for c in all_commits), default=0),
        "faults_injected": dict(sorted(Counter(f.kind for f in record.faults).items())),
        "faults": fault_rows,
        "faults_skipped": [{"fault": what, "reason": why} for what, why in record.skipped],
        "violations": violations,
        "invariants_checked": [v.invariant for v in verdicts if v.status != "not_checked"],
        "invariants": [{"invariant": v.invariant, "status": v.status, "note": v.note} for v in verdicts],
        "hangs": sum(1 for v in violations if v["invariant"] == NO_HANG),
        "deadline_exceeded": record.deadline_exceeded,
        "goodput": None if gp.value is None else round(gp.value, 4),
        "goodput_detail": {"useful_step_seconds": round(gp.useful_s, 3), "window_seconds": round(gp.window_s, 3)},
        "goodput_vs_fault_free": ratio,
        "goodput_vs_fault_free_note": _reference_note(reference, s.steps),
        "recovery_seconds": summarise(recovery),
        "rejoin_seconds": summarise(rejoin),
        "resume_verdicts": resume_verdicts(events, record.started_ts),
        "cadence_decisions": cadence_decisions(events, record.started_ts),
        "save_telemetry": save_telemetry(events),
        "restarts": record.restarts,
        "restarts_in_standby": record.standby_restarts,
        "exits": [x.to_dict() for x in record.exits],
        "stopped_at_end": list(record.stopped_at_end),
    }
    return summary
