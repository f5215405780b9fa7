"""Fault-tolerant DistributedDataParallel: bucketed gradient all-reduce across replica groups.

Gradients live directly in flat bucket buffers (each ``param.grad`` is a view into its
bucket, as DDP's ``gradient_as_bucket_view``), so there is no extra copy of the gradients:
autograd accumulates into the bucket, a post-accumulate hook counts ready parameters, and a
full bucket is all-reduced through the manager while backward continues. The end of backward
waits for every bucket (and launches the buckets of parameters that got no gradient).

If a collective is abandoned (a hung peer), its bucket may still be written by it later, so
the wrapper reallocates all buckets before the next step (``Manager.abandon_generation``).

Buffers (BatchNorm running statistics) are kept identical across groups, on by default as
DDP's ``broadcast_buffers`` does within a job: they are averaged across the contributing
groups with the gradients and written back only when the step commits; an aborted step
restores the values from the step's start, so a forward pass of a step that does not commit
leaves no trace. (torchft leaves them to drift apart per group.)

With ``ManagerOptions.deterministic``, every backward of a step is one virtual shard of the
global batch and the buckets are reduced exactly once the group's last shard is done, buffers
included (shard_gradients.py); ``no_sync()`` and ``broadcast_buffers`` have no effect there.

A replica group of several ranks that each hold the whole model (data parallel inside the
group, as Lightning's DDP runs under torchrun) passes its own process group as ``group``:
rank r's buckets are averaged across column r as above, then summed across the group's ranks
(the backward scale already holds 1/W), so every rank of every group ends with the same
average over the step's global batch; the module's state is broadcast from group rank 0 when
the wrapper is built, as torch's DDP does, so the ranks start equal. The column goes first
because its failures are the ones replicaft absorbs: a rank of this group dying takes the
group down anyway. Buffers stay per rank (each equals the same rank's in every other group),
as with the FSDP wrapper.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from replicaft.deterministic.shard_gradients import ShardGradients
from replicaft.errors import GroupError
from replicaft.manager import Manager
from replicaft.state.registry import StepHooks
from replicaft.wrappers.buckets import (
    DEFAULT_BUCKET_CAP_MB,
    SECOND_BACKWARD,
    Bucket,
    capture,
    cut_buckets,
    launch_in_order,
)
from replicaft.wrappers.buffers import BufferAverager


class DistributedDataParallel(nn.Module, StepHooks):
    """Wrap ``module``; gradients are averaged across the quorum's contributing groups."""

    def __init__(
        self,
        manager: Manager,
        module: nn.Module,
        *,
        bucket_cap_mb: float = DEFAULT_BUCKET_CAP_MB,
        broadcast_buffers: bool = True,
        state_name: str = "model",
        group: dist.ProcessGroup | None = None,
    ) -> None:
        super().__init__()
        self._group = group
        self._group_size = group.size() if group is not None else 1
        self.module = module
        self._manager = manager
        self._bucket_cap_bytes = int(bucket_cap_mb * 1024 * 1024)
        self._params = [p for p in reversed(list(module.parameters())) if p.requires_grad]
        self._buckets: list[Bucket] = []
        self._slot_of: dict[int, tuple[Bucket, int]] = {}
        """A parameter's bucket and the offset of its gradient there, by ``id(param)``."""
        self._generation = manager.abandon_generation
        self._callback_queued = False
        self._next_launch = 0
        """Index of the first bucket not launched yet in this backward (buckets.py)."""
        self._scale: float | None = None
        self._scale_known = False
        """``_scale`` is this step's (``_backward_scale``)."""
        self._sync = True
        self._in_step = False
        self._reduced = False
        """This step's buckets were all-reduced (``before_vote``)."""
        self._buffer_sync = BufferAverager(manager, module, enabled=broadcast_buffers)
        self._shards = ShardGradients(manager, self._buffer_sync) if manager.options.deterministic else None
        if group is not None and self._group_size > 1:
            for tensor in module.state_dict().values():
                dist.broadcast(tensor, group=group, group_src=0)
        self._allocate_buckets()
        for p in self._params:
            p.register_post_accumulate_grad_hook(self._on_grad_ready)
        manager.register_state(state_name, self._state_dict, self._load_state_dict)
        manager.register_hooks(self)

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Accumulate gradients locally (no all-reduce) for the backward passes inside.

        For gradient accumulation over micro-batches: run every micro-batch but the last under
        ``no_sync()``; the last backward all-reduces the accumulated buckets.
        """
        previous, self._sync = self._sync, False
        try:
            yield
        finally:
            self._sync = previous

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if self._generation != self._manager.abandon_generation:
            self._allocate_buckets()
        self._attach_grads()
        if self._shards is not None:
            self._shards.before_forward()
        return self.module(*args, **kwargs)

    # -- buckets -------------------------------------------------------------------------------

    def _allocate_buckets(self) -> None:
        self._generation = self._manager.abandon_generation
        self._buckets = cut_buckets(self._params, self._bucket_cap_bytes, lambda p: p)
        self._slot_of = {}
        for bucket in self._buckets:
            for p, offset in zip(bucket.params, bucket.offsets, strict=True):
                self._slot_of[id(p)] = (bucket, offset)
                if p.grad is not None:
                    bucket.buffer[offset : offset + p.numel()].copy_(p.grad.reshape(-1))
                    p.grad = bucket.buffer[offset : offset + p.numel()].view_as(p)

    def _attach_grads(self) -> None:
        """Make every existing gradient a view of its bucket before backward accumulates into it.

        A gradient the user set to None (``zero_grad()``'s default) stays None: autograd then
        hands over the gradient it computed without a pass over memory, and ``_on_grad_ready``
        copies it into its slot (one read and one write, as torch's DDP). Zeroing the slot here
        instead would cost a write pass, and autograd's accumulation into it a read-add-write
        pass: measured ~1 ms a step more for a 10 MB model (benchmarks/step_overhead.py). The
        deterministic mode accumulates its shards in the buckets, so there every slot is zeroed."""
        for bucket in self._buckets:
            for p, offset in zip(bucket.params, bucket.offsets, strict=True):
                if p.grad is None:
                    if self._shards is not None:
                        slot = bucket.buffer[offset : offset + p.numel()]
                        slot.zero_()
                        p.grad = slot.view_as(p)
                else:
                    self._adopt_grad(bucket, p, offset)
            bucket.ready.clear()
            bucket.work = None
        self._next_launch = 0
        self._scale_known = False

    @staticmethod
    def _adopt_grad(bucket: Bucket, p: torch.Tensor, offset: int, scale: float | None = None) -> None:
        """Make ``p.grad`` the view of its slot in ``bucket``, copying the gradient in if it is
        elsewhere; times ``scale`` if given, in the same pass (``_backward_scale``)."""
        assert p.grad is not None
        slot = bucket.buffer[offset : offset + p.numel()]
        if p.grad.data_ptr() != slot.data_ptr():
            if scale is None:
                slot.copy_(p.grad.reshape(-1))
            else:
                torch.mul(p.grad.reshape(-1), scale, out=slot)
            p.grad = slot.view_as(p)
        elif scale is not None:
            slot.mul_(scale)

    def _backward_scale(self) -> float | None:
        """What this step's gradients are multiplied by as they enter their buckets: one over
        the contributing groups (times the ranks of a data-parallel group), so the buckets'
        SUM is the average. Folded into the copy into
        the bucket as torch's DDP does, it saves the pass over the gradients that dividing the
        sum would take (an in-place divide of 4 MB took 98 µs; the copy with the multiply 85 µs
        against 80 µs for a plain copy). None: nothing to divide by."""
        if not self._scale_known:
            plan = self._manager.wait_quorum()
            ranks = (plan.num_contributors if plan is not None else 1) * self._group_size
            self._scale = 1.0 / ranks if ranks > 1 else None
            self._scale_known = True
        return self._scale

    def _on_grad_ready(self, p: torch.Tensor) -> None:
        if not self._sync and self._shards is None:
            return
        if not self._callback_queued:
            self._callback_queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._finish_backward)
        if self._shards is not None:
            return
        bucket, offset = self._slot_of[id(p)]
        self._adopt_grad(bucket, p, offset, self._backward_scale())
        bucket.ready.add(id(p))
        if bucket.full:
            self._next_launch = launch_in_order(self._buckets, self._next_launch, lambda b: b.full, self._launch)

    def _attach_missing(self, bucket: Bucket) -> None:
        """Before a bucket not filled by backward is launched: a parameter that got no gradient
        this backward contributes its accumulated gradient (``no_sync``) or zeros, and its
        gradient becomes the average, as on the groups where it got one."""
        for p, offset in zip(bucket.params, bucket.offsets, strict=True):
            if id(p) in bucket.ready:
                continue
            if p.grad is None:
                slot = bucket.buffer[offset : offset + p.numel()]
                slot.zero_()
                p.grad = slot.view_as(p)
            else:
                self._adopt_grad(bucket, p, offset, self._backward_scale())

    def _launch(self, bucket: Bucket) -> None:
        if bucket.work is not None:
            raise GroupError(SECOND_BACKWARD)
        bucket.work = self._manager.allreduce(bucket.buffer, average=False)  # already scaled

    def _finish_backward(self) -> None:
        self._callback_queued = False
        if self._shards is not None:
            self._shards.backward_done(self._buckets)
            return
        for bucket in self._buckets[self._next_launch :]:
            self._attach_missing(bucket)
        self._next_launch = launch_in_order(self._buckets, self._next_launch, lambda _: True, self._launch)
        self._buffer_sync.start_average()
        for bucket in self._buckets:
            assert bucket.work is not None
            bucket.work.wait()
            bucket.ready.clear()
        self._sum_over_group()
        self._next_launch = 0
        self._buffer_sync.wait()
        self._reduced = True

    def _sum_over_group(self) -> None:
        """Sum the column-averaged buckets across the group's ranks (data parallel inside it).
        Every rank gets here once per step (end of backward, or ``before_vote`` for a step
        that failed first), so the group's collectives line up; a step whose column failed
        still runs it, and then does not commit."""
        if self._group is None or self._group_size == 1:
            return
        works = [dist.all_reduce(b.buffer, group=self._group, async_op=True) for b in self._buckets]
        for work in works:
            assert work is not None
            work.wait()

    # -- step hooks (Manager) ------------------------------------------------------------------

    def on_step_start(self) -> None:
        self._callback_queued = False  # a backward that raised never ran its callback
        self._in_step = True
        self._reduced = False
        self._scale_known = False
        self._buffer_sync.step_start()
        if self._shards is not None:
            self._shards.step_start()

    def before_vote(self) -> None:
        """A step that failed before its backward reduced (the user reported an error and
        skipped backward, or backward raised) still runs the buckets' and buffers' all-reduces,
        with zeros (replicaft/step/driver.py): the other groups run them, and the column's next operation (the
        next step's first bucket) would meet one of theirs."""
        if not self._in_step:
            return
        if self._shards is not None:
            self._shards.before_vote(self._buckets)
            return
        if not self._sync or self._reduced or self._manager.errored() is None:
            return
        if self._generation != self._manager.abandon_generation:
            self._allocate_buckets()  # forward did not run: a parked collective may still hold the old ones
        elif self._next_launch == 0:
            for bucket in self._buckets:
                bucket.work = None  # forward may not have run this step: these are the last step's
        self._finish_backward()

    def on_commit(self) -> None:
        self._in_step = False
        self._buffer_sync.commit()

    def capture_step(self) -> tuple[list[torch.Tensor], torch.Tensor | None]:
        """This step's averaged gradients and buffers (copies), for a healer's later replay."""
        return capture(self._buckets), self._buffer_sync.capture()

    def replay_prepare(self, record: tuple[list[torch.Tensor], torch.Tensor | None]) -> None:
        """Point the gradients at the record's (no copy: the buckets keep this step's)."""
        self._point_grads(record[0])

    def replay_apply(self, record: tuple[list[torch.Tensor], torch.Tensor | None]) -> None:
        if record[1] is not None:
            self._buffer_sync.write(record[1])

    def end_replay(self) -> None:
        self._point_grads([b.buffer for b in self._buckets])
        if self._in_step:
            # The replayed buffers are the step's start now: a step that then does not commit
            # (its donors all left, heal/departure.py) must not restore the pre-heal ones.
            self._buffer_sync.refresh_backup()

    def _point_grads(self, flats: list[torch.Tensor]) -> None:
        """Make every gradient a view of its slot in ``flats`` (one flat tensor per bucket)."""
        for bucket, flat in zip(self._buckets, flats, strict=True):
            for p, offset in zip(bucket.params, bucket.offsets, strict=True):
                p.grad = flat[offset : offset + p.numel()].view_as(p)

    def on_abort(self) -> None:
        self._in_step = False
        self._buffer_sync.abort()

    # -- state (heal and checkpoint) -----------------------------------------------------------

    def _state_dict(self) -> dict[str, Any]:
        """Parameters live; buffers as of the step's start while a step is in flight (forward
        updates them concurrently with the quorum thread that snapshots this)."""
        state = dict(self.module.state_dict())
        if self._in_step:
            state.update({k: v for k, v in self._buffer_sync.backup.items() if k in state})
        return state

    def _load_state_dict(self, state: dict[str, Any]) -> None:
        self.module.load_state_dict(state)
        if self._in_step:
            self._buffer_sync.refresh_backup()
