"""When to save, and whether the disk can take it. Pure: numbers in, a decision with a reason out.

**Every N steps and/or every T seconds.** A step trigger fires when the step crosses a
multiple of ``interval_steps`` since the last save, not when ``step % N == 0``: a heal can
jump the step over the multiple (390 -> 410), and saving at multiples keeps saves aligned
with milestones (see ``retention.py``). A time trigger bounds the work lost on a slow run.

**A save that falls due while the previous one is still being written is skipped, not
queued or waited for.** Waiting would block the training step on the disk, which is the
one thing an asynchronous checkpoint exists to avoid; queueing would hold one more full host
copy of the state per pending save (unbounded memory when the disk is slower than the
interval) and write ever staler steps. Skipping costs one interval of recency, and a
persistent checkpoint matters only when every replica group is gone. The writer counts and
logs skips: a steady stream of them means the interval is shorter than a save takes. The
one exception is a group of W > 1 ranks, whose ranks must all save the same steps without
talking: there the writer waits for the previous save (``CheckpointWriter(wait_when_busy_s=)``).

**Free space** is checked before a save starts, against an estimate from the snapshot plus a
margin, so a full disk is refused up front with a clear message instead of failing halfway
through a multi-gigabyte write. Old checkpoints are deleted only after the new one is
published, so the new one must fit next to them. An increment is sized by the chunks its
parent's chain lacks (saveplan.increment_bytes), not as the full state it refers to: sealed
ones by their keyed ids, and in a sharded group by the sum of what each rank's own shards add.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from replicaft.checkpoint.options import check_fraction, check_interval_options

SaveAction = Literal["save", "skip", "not_due"]

TENSOR_OVERHEAD_BYTES = 4096
"""Per tensor: DCP writes each tensor as its own ``torch.save`` record (zip headers, pickle,
64-byte alignment) plus an entry in ``.metadata``; measured well under 2 KiB on torch 2.13."""
FIXED_OVERHEAD_BYTES = 64 * 1024
"""``.metadata`` header, ``manifest.json`` and directory entries."""


@dataclass(frozen=True, slots=True)
class SaveDecision:
    action: SaveAction
    reason: str

    @property
    def save(self) -> bool:
        return self.action == "save"


@dataclass(frozen=True, slots=True)
class SpaceDecision:
    ok: bool
    required_bytes: int
    reason: str


def should_save(
    *,
    step: int,
    now: float,
    last_saved_step: int,
    last_saved_time: float,
    interval_steps: int,
    interval_s: float,
    save_in_progress: bool,
) -> SaveDecision:
    """Decide whether to checkpoint the state after committed step ``step``.

    ``last_saved_step`` / ``last_saved_time`` are the step and (monotonic) time of the last
    save started *or skipped*, or, before the first one, where training started: a skipped
    save moves the baseline too, so it is skipped once rather than retried every step.
    An interval of 0 disables that trigger; both 0 disables periodic saves.
    """
    check_interval_options(interval_steps, interval_s)
    if interval_steps == 0 and interval_s == 0:
        return SaveDecision("not_due", "periodic checkpoints are disabled (interval_steps=0, interval_s=0)")
    if step <= last_saved_step:
        return SaveDecision("not_due", f"step {step} is not after the last save point, step {last_saved_step}")
    due = []
    if interval_steps and step // interval_steps > last_saved_step // interval_steps:
        due.append(f"step {step} crossed a multiple of interval_steps={interval_steps} since step {last_saved_step}")
    elapsed_s = now - last_saved_time
    if interval_s and elapsed_s >= interval_s:
        due.append(f"{elapsed_s:.1f}s since the last save point >= interval_s={interval_s:g}")
    if not due:
        return SaveDecision("not_due", f"step {step}: no interval has elapsed")
    if save_in_progress:
        return SaveDecision(
            "skip",
            f"checkpoint of step {step} due ({'; '.join(due)}) but the previous save is still being "
            "written; skipping it rather than blocking training",
        )
    return SaveDecision("save", "; ".join(due))


def estimate_checkpoint_bytes(*, num_tensor_bytes: int, num_tensors: int, num_skeleton_bytes: int) -> int:
    """Bytes a checkpoint of this state will take on disk (an upper estimate)."""
    return num_tensor_bytes + num_skeleton_bytes + num_tensors * TENSOR_OVERHEAD_BYTES + FIXED_OVERHEAD_BYTES


def enough_space(free_bytes: int, estimated_bytes: int, margin: float) -> SpaceDecision:
    """Whether ``free_bytes`` holds ``estimated_bytes`` plus ``margin`` (a fraction, 0.1 = 10%).

    The margin leaves room for the estimate's error and for other writers on the same disk.
    """
    check_fraction("free space margin", margin)
    required = int(estimated_bytes * (1 + margin))
    if free_bytes >= required:
        return SpaceDecision(True, required, f"{free_bytes} bytes free >= {required} needed")
    return SpaceDecision(
        False,
        required,
        f"needs {required} bytes ({estimated_bytes} estimated + {margin:.0%} margin) but only {free_bytes} are free",
    )
