"""Which checkpoint a resume tries first when a directory holds more than one history. Pure.

A *lineage* is one history of training (layout.py): a run that resumes from a checkpoint
continues its lineage, a run that starts from nothing begins a new one. One directory can
hold several: an operator restarts a job from scratch beside an old run's checkpoints, or a
run that could not read its checkpoints started over. Picking "the highest step" across
lineages resumes whichever history trained longest, which may be a run abandoned last week;
mixing them (the bug of issue 19: a new run's step 10 counted as saved because an old run
had a ``step-10``) resumes a state no run ever had.

The rule: the lineage written most recently is the live one. Its checkpoints are tried
newest step first; only when none of them loads are older lineages tried, each whole and
newest first, so a resume always loads one complete checkpoint of one history, and the
reason (which lineage, why, what else is there) is logged. "Written most recently" is the
newest ``created_unix_s`` among a lineage's readable manifests: wall-clock time, compared
between histories that ran hours or days apart, not between steps.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from replicaft.checkpoint.layout import lineage_label


@dataclass(frozen=True, slots=True)
class Candidate:
    step: int
    lineage: str
    created_unix_s: float | None
    """From the manifest; None when it cannot be read (the candidate is still tried, last in
    its lineage's order of steps, and its load reports why it fails)."""
    tier: int = 0
    """Where it is: 0 the checkpoint directory, 1 tier 2, 2 the object store; at equal steps
    the nearer copy is tried first."""
    label: str = ""


@dataclass(frozen=True, slots=True)
class ResumeOrder:
    candidates: tuple[Candidate, ...]
    reason: str


def order_for_resume(candidates: Iterable[Candidate]) -> ResumeOrder:
    """Every candidate, in the order a resume should try them, with the reason."""
    by_lineage: dict[str, list[Candidate]] = {}
    for c in candidates:
        by_lineage.setdefault(c.lineage, []).append(c)
    if not by_lineage:
        return ResumeOrder((), "no checkpoints")

    def recency(lineage: str) -> tuple[float, int, str]:
        group = by_lineage[lineage]
        times = [c.created_unix_s for c in group if c.created_unix_s is not None]
        return (max(times) if times else float("-inf"), max(c.step for c in group), lineage)

    lineages = sorted(by_lineage, key=recency, reverse=True)
    ordered = tuple(
        c for lineage in lineages for c in sorted(by_lineage[lineage], key=lambda c: (-c.step, c.tier, c.label))
    )
    live = lineages[0]
    steps = sorted({c.step for c in by_lineage[live]})
    reason = f"lineage {lineage_label(live)} ({_describe(steps)})"
    if len(lineages) == 1:
        return ResumeOrder(ordered, reason + " is the only history here")
    others = "; ".join(
        f"lineage {lineage_label(lin)} ({_describe(sorted({c.step for c in by_lineage[lin]}))})" for lin in lineages[1:]
    )
    reason += (
        f" was written most recently, so it is tried first, newest step first; the other histories here are "
        f"tried only if none of its checkpoints loads, never mixed with it: {others}"
    )
    return ResumeOrder(ordered, reason)


def _describe(steps: list[int]) -> str:
    if len(steps) == 1:
        return f"step {steps[0]}"
    return f"{len(steps)} checkpoints, steps {steps[0]}..{steps[-1]}"
