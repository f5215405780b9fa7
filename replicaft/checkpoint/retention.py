"""Retention: which published checkpoints to delete. Pure: steps in, steps out.

A checkpoint directory grows by one checkpoint per save, so something must delete old ones,
and deleting the wrong one is the only way retention can lose data. The rule is therefore
small and total:

* the newest ``keep_last`` checkpoints are kept (recent state to restart from);
* a *milestone* (a step divisible by ``milestone_every``) is kept forever, so a run can go
  back to a known point long after the recent window has moved on;
* the newest checkpoint is never deleted, whatever ``keep_last`` says: it may be the only
  state left when every replica group is gone;
* a checkpoint that a kept incremental checkpoint needs (its chain: the base and the
  increments whose chunks it refers to, chain.py) is kept while that one is.

Deciding on step numbers only, never on ages or sizes, keeps the answer identical on every
writer and in tests; the writer applies it only after a new checkpoint is published, so a
failed save never causes a deletion.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

from replicaft.checkpoint.options import check_retention_options


@dataclass(frozen=True, slots=True)
class RetentionDecision:
    keep: tuple[int, ...]
    """Steps to keep, ascending."""
    delete: tuple[int, ...]
    """Steps to delete, ascending."""
    reason: str


def decide_retention(
    published_steps: Iterable[int],
    *,
    keep_last: int,
    milestone_every: int,
    requires: Mapping[int, Collection[int]] | None = None,
) -> RetentionDecision:
    """Split the published steps into those to keep and those to delete.

    ``milestone_every=0`` disables milestones. ``requires`` maps a step to the steps whose
    chunks it refers to (its chain); those are kept with it. Duplicate steps are treated as
    one. Raises OptionsError for negative options.
    """
    check_retention_options(keep_last, milestone_every)
    steps = sorted(set(published_steps))
    if not steps:
        return RetentionDecision((), (), "no published checkpoints")
    recent = set(steps[-max(keep_last, 1) :])
    milestones = {s for s in steps if milestone_every and s % milestone_every == 0}
    chosen = recent | milestones
    needed: set[int] = set()
    for step in chosen:
        needed.update(s for s in (requires or {}).get(step, ()) if s in steps)
    needed -= chosen
    keep = tuple(s for s in steps if s in chosen or s in needed)
    delete = tuple(s for s in steps if s not in keep)
    reason = f"keep newest {len(recent)} {sorted(recent)}"
    if milestones - recent:
        reason += f" and milestones every {milestone_every} {sorted(milestones - recent)}"
    if needed:
        reason += f" and the chains they build on {sorted(needed)}"
    reason += f"; delete {list(delete)}" if delete else "; nothing to delete"
    return RetentionDecision(keep, delete, reason)
