"""Retention: which published checkpoints to delete. Pure: facts in, a verdict per checkpoint out.

A checkpoint directory grows by one checkpoint per save, so something must delete old ones,
and deleting the wrong one is the only way retention can lose data. The rules
(``RetentionPolicy``, options.py) are therefore each small, and they only ever *keep*: a
checkpoint is deleted when no rule keeps it.

* **latest**: the newest ``keep_last`` checkpoints (recent state to restart from); the newest
  is kept even with ``keep_last=0``, since it may be the only state left when every replica
  group is gone;
* **milestone**: a step divisible by ``milestone_every``, forever, so a run can go back to a
  known point long after the recent window has moved on;
* **epoch_end**: with ``milestone_at_epoch_end``, the last checkpoint of each epoch, decided
  once a checkpoint of a later epoch exists (until then it is the newest anyway);
* **geometric**: with ``keep_geometric_from=N``, the first checkpoint at or after each of the
  steps N, 2N, 4N, ...; "at or after" because saves need not land on those steps (a heal
  can jump a save past one), and a checkpoint chosen so stays chosen as the run goes on;
* **best**: the ``keep_best_k`` checkpoints with the best ``keep_best_metric`` (lowest with
  mode "min", highest with "max"; ties go to the newer), among those saved with that metric;
* **pending_upload**: a checkpoint a tier has not copied yet (its object-store upload is
  queued or running); the upload reads it, and its chain, from this directory;
* **chain**: a checkpoint that a kept incremental checkpoint needs (the base and the
  increments whose chunks it refers to, chain.py) is kept while that one is.

The decision reads only these facts (steps, epochs, metrics, chains, tier status), never
ages, sizes or clocks, so it is the same on every writer and in tests. The writer applies it
only after a new checkpoint is published, so a failed save never causes a deletion.
Rejected: a policy object per rule, combined by the caller; one function with every rule
makes "kept if any rule keeps it" and "chains and uploads always win" hold in one place.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from replicaft.checkpoint.options import RetentionPolicy

KeptAs = Literal["latest", "milestone", "epoch_end", "geometric", "best", "pending_upload", "chain"]
"""Why a checkpoint is kept, in the order a verdict lists them."""
_ORDER: tuple[KeptAs, ...] = ("latest", "milestone", "epoch_end", "geometric", "best", "pending_upload", "chain")


@dataclass(frozen=True, slots=True)
class CheckpointFacts:
    """What retention knows of one published checkpoint of a lineage."""

    step: int
    epoch: int | None = None
    """The epoch it was saved in (``Manager.checkpoint_tags(epoch=...)``); None when not given."""
    metrics: Mapping[str, float] = field(default_factory=dict)
    """The metrics reported with it (``Manager.report_metrics``)."""
    requires: tuple[int, ...] = ()
    """The steps of its chain: the checkpoints whose chunks it refers to (empty for a base)."""
    pending_upload: bool = False
    """A tier still needs it: its object-store upload is queued or running."""


@dataclass(frozen=True, slots=True)
class Verdict:
    step: int
    kept_as: tuple[KeptAs, ...]
    """The rules that keep it; empty when it is to be deleted."""
    reason: str

    @property
    def keep(self) -> bool:
        return bool(self.kept_as)


@dataclass(frozen=True, slots=True)
class RetentionDecision:
    verdicts: tuple[Verdict, ...]
    """One per checkpoint, by ascending step."""
    reason: str

    @property
    def keep(self) -> tuple[int, ...]:
        """Steps to keep, ascending."""
        return tuple(v.step for v in self.verdicts if v.keep)

    @property
    def delete(self) -> tuple[int, ...]:
        """Steps to delete, ascending."""
        return tuple(v.step for v in self.verdicts if not v.keep)


def decide_retention(checkpoints: Iterable[CheckpointFacts], policy: RetentionPolicy) -> RetentionDecision:
    """Keep or delete each of one lineage's published checkpoints, with the reason.

    Raises ValueError when two facts name the same step (one lineage has one checkpoint per
    step; mixing lineages here would let one history's checkpoints push out another's).
    """
    facts = sorted(checkpoints, key=lambda f: f.step)
    steps = [f.step for f in facts]
    if len(set(steps)) != len(steps):
        duplicated = sorted({s for s in steps if steps.count(s) > 1})
        raise ValueError(
            f"retention was given steps {duplicated} more than once; pass one lineage's checkpoints, one fact per step"
        )
    if not facts:
        return RetentionDecision((), "no published checkpoints")
    kept: dict[int, dict[KeptAs, str]] = {s: {} for s in steps}
    recent = steps[-max(policy.keep_last, 1) :]
    for step in recent:
        kept[step]["latest"] = "the newest" if step == steps[-1] else f"among the newest {policy.keep_last}"
    if policy.milestone_every:
        for step in steps:
            if step % policy.milestone_every == 0:
                kept[step]["milestone"] = f"a milestone (every {policy.milestone_every} steps)"
    if policy.milestone_at_epoch_end:
        for step, epoch in _epoch_ends(facts):
            kept[step]["epoch_end"] = f"the last of epoch {epoch}"
    if policy.keep_geometric_from:
        for step, mark in _geometric(steps, policy.keep_geometric_from):
            kept[step].setdefault(
                "geometric", f"the first at or after step {mark} (geometric from {policy.keep_geometric_from})"
            )
    if policy.keep_best_k and policy.keep_best_metric is not None:
        for rank, (step, value) in enumerate(_best(facts, policy), 1):
            kept[step]["best"] = (
                f"{policy.keep_best_metric}={value:g} is number {rank} of the best "
                f"{policy.keep_best_k} ({policy.keep_best_mode})"
            )
    for f in facts:
        if f.pending_upload:
            kept[f.step]["pending_upload"] = "its upload to the object store is pending"
    for f in facts:
        if kept[f.step]:
            for required in f.requires:
                if required in kept and "chain" not in kept[required]:
                    kept[required]["chain"] = f"in the chain of step {f.step}"
    verdicts = []
    for step in steps:
        why = kept[step]
        kept_as = tuple(k for k in _ORDER if k in why)
        if kept_as:
            reason = "keep: " + "; ".join(why[k] for k in kept_as)
        else:
            reason = f"delete: not among the newest {max(policy.keep_last, 1)} and kept by no other rule"
        verdicts.append(Verdict(step, kept_as, reason))
    return RetentionDecision(tuple(verdicts), _summary(verdicts, policy))


def _epoch_ends(facts: list[CheckpointFacts]) -> Iterable[tuple[int, int]]:
    """(step, epoch) of each checkpoint followed, among those with an epoch, by a later epoch."""
    with_epoch = [f for f in facts if f.epoch is not None]
    for a, b in zip(with_epoch, with_epoch[1:], strict=False):
        assert a.epoch is not None and b.epoch is not None
        if b.epoch > a.epoch:
            yield a.step, a.epoch


def _geometric(steps: list[int], first: int) -> Iterable[tuple[int, int]]:
    """(step, mark) for the first step at or after each mark first * 2**k up to the newest step."""
    mark = first
    while mark <= steps[-1]:
        yield next(s for s in steps if s >= mark), mark
        mark *= 2


def _best(facts: list[CheckpointFacts], policy: RetentionPolicy) -> list[tuple[int, float]]:
    """The best ``keep_best_k`` (step, value), best first; ties go to the newer step."""
    metric = policy.keep_best_metric
    scored = []
    for f in facts:
        value = f.metrics.get(metric) if metric is not None else None
        if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
            scored.append((f.step, float(value)))
    sign = 1.0 if policy.keep_best_mode == "min" else -1.0
    scored.sort(key=lambda sv: (sign * sv[1], -sv[0]))
    return scored[: policy.keep_best_k]


def _summary(verdicts: list[Verdict], policy: RetentionPolicy) -> str:
    """One line: each rule's kept steps not already named by an earlier rule, then the deleted."""
    named: set[int] = set()
    parts = []
    labels: dict[KeptAs, str] = {
        "latest": f"newest {min(max(policy.keep_last, 1), len(verdicts))}",
        "milestone": f"milestones every {policy.milestone_every}",
        "epoch_end": "epoch ends",
        "geometric": f"geometric from {policy.keep_geometric_from}",
        "best": f"best {policy.keep_best_k} by {policy.keep_best_metric} ({policy.keep_best_mode})",
        "pending_upload": "pending uploads",
        "chain": "the chains they build on",
    }
    for kind in _ORDER:
        steps = [v.step for v in verdicts if kind in v.kept_as and v.step not in named]
        if steps:
            parts.append(f"{labels[kind]} {steps}")
            named.update(steps)
    deleted = [v.step for v in verdicts if not v.keep]
    return "keep " + " and ".join(parts) + (f"; delete {deleted}" if deleted else "; nothing to delete")
