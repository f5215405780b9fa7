"""One group's gradients in the deterministic mode: one per virtual shard, reduced exactly.

The DDP wrapper (ddp.py) hands this every forward and every end of backward when
``ManagerOptions.deterministic`` is set. In that mode each backward of a step is one virtual
shard of the step's global batch (replicaft/deterministic/rules.py), in the order the group owns them:

* before a shard's forward, torch's global generator is seeded from (seed, step, shard) and the
  module's buffers (BatchNorm running statistics) are put back to their values at the step's
  start, so the shard's forward is the same on whichever group runs it, whatever ran before;
* after its backward, the shard's gradient (every bucket) and the buffers its forward left are
  kept, and the buckets zeroed for the next shard;
* after the last owned shard's backward (a group owning none, such as a healer, runs one
  backward whose result is dropped), one MAX all-reduce agrees each bucket's largest magnitude
  across the quorum, then each bucket's shards are encoded in int64 fixed point, summed here and
  SUM-all-reduced across the quorum (a healer adds zeros), and the total decoded into the bucket
  as the mean over the S shards. The buffers take the same path as one more bucket (in
  float64), so the committed BatchNorm statistics are the mean of what each shard's forward
  left: independent of the grouping too.

Collectives of all groups meet in the same order (the MAX, then one SUM per bucket in index
order, then the buffers'), whatever each group owns. A failed collective makes the step fail
as in the normal mode (the manager records it; the step will not commit). Costs: a backward
per shard instead of per group (no overlap of the all-reduce with backward), a copy of each
owned shard's gradient until the step's reduction, and int64 on the wire (twice float32's
bytes); benchmarks/deterministic.py measures them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from replicaft.column.process_group import ManagedWork
from replicaft.deterministic.rules import (
    decode_mean,
    encode_sum,
    max_abs,
    quantisation_bound,
    scale_exponent,
    shard_seed,
    step_shards,
)
from replicaft.errors import GroupError
from replicaft.manager import Manager
from replicaft.wrappers.buckets import Bucket
from replicaft.wrappers.buffers import BufferAverager


class ShardGradients:
    """The deterministic mode's part of the DDP wrapper. Training thread only."""

    def __init__(self, manager: Manager, buffers: BufferAverager) -> None:
        self._manager = manager
        self._buffers = buffers
        self._num_shards = manager.options.virtual_shards
        self._owned: range | None = None
        self._active = False
        """Between the step's start and its reduction: a forward then computes a shard."""
        self._done = 0
        """Backward passes finished in this step."""
        self._grads: list[list[torch.Tensor]] = []
        """Per owned shard finished so far: a copy of every bucket."""
        self._buffer_values: list[torch.Tensor] = []
        self.last_bound = 0.0
        """The largest fixed-point error bound over the last reduced step's buckets."""

    def step_start(self) -> None:
        self._owned = None
        self._active = True
        self._done = 0
        self._grads = []
        self._buffer_values = []

    def owned(self) -> range:
        """This step's shards for this group (waits for the quorum)."""
        if self._owned is None:
            self._owned = step_shards(self._manager.wait_quorum(), self._num_shards)
        return self._owned

    def before_forward(self) -> None:
        """Seed torch's generator for the shard this forward computes; restore the buffers.
        Outside a step's shards (an evaluation after the commit) it does nothing."""
        if not self._active:
            return
        owned = self.owned()
        plan = self._manager.plan
        step = plan.max_step if plan is not None else self._manager.current_step()
        shard = owned[self._done] if self._done < len(owned) else self._num_shards  # dropped: a healer's
        torch.manual_seed(shard_seed(self._manager.options.seed, step, shard))
        self._buffers.abort()

    def backward_done(self, buckets: Sequence[Bucket]) -> None:
        """Keep the shard's gradient and buffers; after the last owned shard, reduce."""
        owned = self.owned()
        expected = max(len(owned), 1)
        self._done += 1
        if self._done > expected:
            raise GroupError(
                f"backward ran {self._done} times in one step; the deterministic mode takes one "
                f"backward per virtual shard this group owns ({len(owned)}: shards "
                f"{list(owned)}), as StepDataLoader.micro_batches() hands them out"
            )
        if self._done <= len(owned):
            self._grads.append([b.buffer.clone() for b in buckets])
            if self._buffers.backup:
                self._buffer_values.append(self._buffers.flat())
        for b in buckets:
            b.buffer.zero_()
        if self._done == expected:
            self._active = False
            self._reduce(buckets)

    def before_vote(self, buckets: Sequence[Bucket]) -> None:
        """A step whose backward ran fewer times than the shards this group owns (it skipped
        backward after an error, or the loop did not take every micro-batch) fails, and reduces
        what it has: the other groups run the step's collectives, and a rank that skipped them
        would leave theirs waiting and meet them with its next step's."""
        if not self._active:
            return
        self._active = False
        if self._manager.errored() is None:
            expected = max(len(self.owned()), 1)
            self._manager.report_error(
                GroupError(
                    f"backward ran {self._done} of the {expected} times this step takes in the deterministic mode "
                    "(one per virtual shard this group owns, as StepDataLoader.micro_batches() hands them out)"
                )
            )
        self._reduce(buckets)

    def _reduce(self, buckets: Sequence[Bucket]) -> None:
        parts: list[list[torch.Tensor]] = [[g[i] for g in self._grads] for i in range(len(buckets))]
        likes = [b.buffer for b in buckets]
        if self._buffers.backup:
            parts.append(self._buffer_values)
            likes.append(self._buffers.flat())
        maxima = torch.tensor([max_abs(p) for p in parts], dtype=torch.float64, device=likes[0].device)
        agreed_ok = self._manager.allreduce(maxima, reduce="max", average=False).wait()
        agreed = maxima.tolist() if agreed_ok else [0.0] * len(parts)
        exponents = [scale_exponent(m, self._num_shards) if math.isfinite(m) else 0 for m in agreed]
        # Issued even when the step has failed: the other groups issue them (replicaft/step/driver.py).
        works: list[ManagedWork] = []
        for part, like, k in zip(parts, likes, exponents, strict=True):
            works.append(self._manager.allreduce(encode_sum(part, k, like), average=False))
        if not agreed_ok:
            return
        for i, (work, like, k, m) in enumerate(zip(works, likes, exponents, agreed, strict=True)):
            if not work.wait():
                return
            if math.isfinite(m):
                mean = decode_mean(work.tensor(), k, self._num_shards, like.dtype)
            else:
                mean = torch.full_like(like, math.nan)
            if i < len(buckets):
                buckets[i].buffer.copy_(mean)
            else:
                self._buffers.adopt(mean)
        self.last_bound = max(quantisation_bound(m, self._num_shards) if math.isfinite(m) else math.inf for m in agreed)
        if math.isfinite(self.last_bound):
            self._manager.annotate_commit(fixed_point_bound=self.last_bound)
