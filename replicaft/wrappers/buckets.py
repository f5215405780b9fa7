"""Gradient buckets, as both gradient wrappers (ddp.py, fsdp.py) cut and launch them.

A bucket is one flat buffer over the gradients of a run of parameters, all-reduced across the
quorum as one collective as soon as backward has filled it. Two rules are shared:

* **How parameters are cut into buckets** (``cut_buckets``): in the order given (the wrappers
  pass reverse definition order, roughly the order backward produces gradients), a new bucket
  when the cap would be passed or the dtype or device changes (one collective takes one dtype
  on one device). The first bucket closes as soon as it holds ``FIRST_BUCKET_BYTES``, as
  torch's DDP does: its all-reduce then starts while backward still computes the rest, where
  one bucket under the cap would leave the whole all-reduce after backward (a 10 MB model).
* **The order buckets are launched in** (``launch_in_order``): their index order, on every
  group. Collectives across replica groups are matched by the order each group issues them,
  not by name: the n-th all-reduce of one group meets the n-th of every other. Launching a
  bucket as soon as backward fills it issues them in the order backward happens to fill them,
  and that order follows the graph: a data-dependent model (mixture-of-experts routing, a
  branch taken on some batches) leaves a different bucket unfilled on each group until
  backward ends. Two groups would then pair different buckets: an error when their sizes
  differ, a silently wrong average when they match. So a full bucket waits for every bucket
  before it, as torch's DDP Reducer does; for the usual model, whose buckets fill in index
  order, nothing waits.

What differs stays in the wrappers: DDP's gradients are views into the bucket (no copy), FSDP
copies each gradient shard in and the average back out.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import torch
from torch import nn

from replicaft.column.process_group import ManagedWork
from replicaft.process import reserve

B = TypeVar("B")

DEFAULT_BUCKET_CAP_MB = 25.0
FIRST_BUCKET_BYTES = 1024 * 1024
SECOND_BACKWARD = (
    "a second backward reduced gradients in one step; run every micro-batch but the last under "
    "no_sync(), or call optimizer.zero_grad() between steps"
)
"""Why a bucket cannot be launched twice in one step (both gradient wrappers raise it)."""


@dataclass(eq=False)
class Bucket:
    params: list[nn.Parameter]
    offsets: list[int]
    """Where each parameter's gradient (its local shard, for FSDP) starts in ``buffer``."""
    buffer: torch.Tensor
    ready: set[int] = field(default_factory=set)
    """ids of the parameters whose gradient is in the buffer this backward."""
    work: ManagedWork | None = None

    @property
    def full(self) -> bool:
        return len(self.ready) == len(self.params)


def cut_buckets(
    params: Sequence[nn.Parameter], cap_bytes: int, local: Callable[[nn.Parameter], torch.Tensor]
) -> list[Bucket]:
    """Buckets over ``params`` in order, each at most ``cap_bytes`` (or one parameter), one dtype
    and device each. ``local(p)`` is the tensor whose gradient a bucket holds (a DTensor's local
    shard, for FSDP). The buffers come from the memory reserve where a warm standby made one
    (reserve.py) and are not zeroed: a slot is written (a gradient copied in) or zeroed when its
    parameter's gradient is first attached, so a restarted group asks for its quorum, and
    starts its heal, before it touches its buckets' memory (536 MB of first touch took ~2 s)."""
    runs: list[list[nn.Parameter]] = []
    size = 0
    for p in params:
        t = local(p)
        nbytes = t.numel() * t.element_size()
        first_full = len(runs) == 1 and size >= min(FIRST_BUCKET_BYTES, cap_bytes)
        if (
            not runs
            or first_full
            or size + nbytes > cap_bytes
            or local(runs[-1][0]).dtype != t.dtype
            or local(runs[-1][0]).device != t.device
        ):
            runs.append([])
            size = 0
        runs[-1].append(p)
        size += nbytes
    buckets = []
    for run in runs:
        offsets, total = [], 0
        for p in run:
            offsets.append(total)
            total += local(p).numel()
        first = local(run[0])
        buckets.append(Bucket(run, offsets, reserve.empty(total, first.dtype, first.device)))
    return buckets


def launch_in_order(buckets: Sequence[B], first: int, full: Callable[[B], bool], launch: Callable[[B], None]) -> int:
    """Launch ``buckets[first:]`` in index order up to the first that is not ``full``; returns
    the index of that bucket (``len(buckets)`` once every bucket is launched)."""
    i = first
    while i < len(buckets) and full(buckets[i]):
        launch(buckets[i])
        i += 1
    return i


def capture(buckets: Sequence[Bucket]) -> list[torch.Tensor]:
    """Copies of this step's averaged buckets, for a healer's replay (registry.py)."""
    return [b.buffer.clone() for b in buckets]
