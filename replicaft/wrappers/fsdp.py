"""Fault-tolerant HSDP: FSDP2 (``fully_shard``) inside each replica group, replicaft across groups.

The layout. A replica group of W ranks shards the model with FSDP2 over a mesh of its own ranks
(the default process group its script initialised, e.g. under torchrun); FSDP's all-gathers and
reduce-scatters never leave the group. Every group builds the same model with the same W, so
rank r of every group holds the same shard: the rank-r processes of all groups are the
manager's column r, and the cross-group average of a gradient shard is a column all-reduce,
``manager.allreduce``. That all-reduce takes the place of native HSDP's replicate-dimension
all-reduce, and unlike it never raises for a peer group's failure: the step is simply not
committed, and a group that died heals shard by shard (rank r from rank r of a donor).

How gradients travel. FSDP2 reduce-scatters each module's gradients inside the group during
backward, assigns every sharded parameter its gradient shard (a DTensor) and then runs the
parameter's post-accumulate-grad hooks (torch 2.13, ``foreach_reduce``). Our hook copies the
local shard into a flat bucket of our own; a full bucket is all-reduced across the quorum
while backward continues; at the end of backward (an autograd callback queued behind FSDP's
own) the remaining buckets are launched, all are waited for, and the averages are copied back
into the gradient shards. Healers contribute zeros (the manager zeroes their buckets), and the
divisor is the number of contributing groups. Cost: one copy in and one copy out of the
gradient shards (1/W of the model each); in exchange no collective ever writes a buffer FSDP
or the optimizer reads, so an abandoned (hung) all-reduce that completes late writes only into
a bucket we have already dropped (``Manager.abandon_generation``).

Rejected alternatives:

* A 2-D mesh (native HSDP) with a managed replicate dimension, as torchft's
  ``ft_init_device_mesh`` does (study §1.4): FSDP then calls the all-reduce itself, divides by
  the replicate size rather than the number of contributors (healers send zeros), and its
  gradients are views of the buffer being reduced, so an abandoned all-reduce that completes
  late writes into live gradients.
* ``FSDPModule.set_all_reduce_hook``: the hook receives the reduce-scatter output before FSDP
  post-divides it and before the gradients are cut out of it as views; an asynchronous
  all-reduce in place would race that division, and a synchronous one stalls backward for
  every module's cross-group round trip.

State. The registered state is the rank's local shards: the sharded parameters (DTensors,
whose local shard ``replicaft.state.flat.flatten`` takes) and the module's buffers. It is read from
the parameter objects captured here, never through ``module.state_dict()``: FSDP2's
state-dict hook reshards the module, which must not happen on the quorum thread while forward
runs with unsharded parameters. Loading copies into the local shards in place. The optimizer's
moments are DTensors too; a heal or a checkpoint gives them back as plain local tensors, so
:func:`shard_optimizer_state` makes the optimizer wrap them again on load.

Buffers (BatchNorm statistics; FSDP2 does not shard them) are averaged across groups column by
column with the gradients and written back on commit, restored on abort, exactly as
``replicaft.DistributedDataParallel`` does. The ranks of one group see different samples, so
their buffers differ from each other, as in plain FSDP; each equals the same rank's in every
other group.

Persistent checkpoints. Every rank of the writing group saves its own shards: the snapshot
keeps each local shard's DTensor layout (``replicaft.state.flat.Sharding``) and the writer hands
DCP DTensors again, so DCP records where each shard sits in the global tensor. (Handed plain
tensors, DCP takes same-named tensors for replicas and keeps one rank's copy of each: the
first version did that, and a checkpoint was a mixture of the ranks' shards.) A checkpoint
loads into any W: a rank reads just its part of each global tensor into its shards; a
moment the template lacks (a fresh optimizer) is read whole and cut to the rank's shard by
:func:`shard_optimizer_state`'s hook.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor, distribute_tensor

from replicaft.errors import GroupError, OptionsError, StateError
from replicaft.manager import Manager
from replicaft.state.registry import StepHooks
from replicaft.state.shards import like_param, local_shard
from replicaft.wrappers.buckets import (
    DEFAULT_BUCKET_CAP_MB,
    SECOND_BACKWARD,
    Bucket,
    capture,
    cut_buckets,
    launch_in_order,
)
from replicaft.wrappers.buffers import BufferAverager


class FaultTolerantFSDP(nn.Module, StepHooks):
    """Wrap a ``fully_shard``-ed ``module``; gradient shards are averaged across groups.

    Every group must shard the same model the same way over a mesh of its own ranks in group
    rank order (``init_device_mesh(device, (W,))`` over the group's default process group), so
    that group rank r holds the same shard everywhere. Build the wrapper after
    ``fully_shard`` and before the first forward and the optimizer; the step contract is the one of
    ``replicaft.DistributedDataParallel``: ``replicaft.Optimizer.zero_grad()`` starts the
    step, ``loss.backward()`` leaves the cross-group average in every gradient shard, and
    ``replicaft.Optimizer.step()`` commits or skips. Pass the inner optimizer through
    :func:`shard_optimizer_state`. One backward per step; for gradient accumulation run every
    micro-batch but the last under :meth:`no_sync`.
    """

    def __init__(
        self,
        manager: Manager,
        module: nn.Module,
        *,
        bucket_cap_mb: float = DEFAULT_BUCKET_CAP_MB,
        broadcast_buffers: bool = True,
        state_name: str = "model",
    ) -> None:
        if not isinstance(module, FSDPModule):
            raise TypeError(
                f"FaultTolerantFSDP needs the root module after fully_shard (an FSDPModule), got "
                f"{type(module).__name__}; call fully_shard(module, mesh=...) on its blocks and then on it"
            )
        if manager.options.deterministic:
            raise OptionsError(
                "deterministic=True: the deterministic mode (virtual shards, exact sums) is built for "
                "replicaft.DistributedDataParallel only; unset REPLICAFT_DETERMINISTIC to use FSDP"
            )
        super().__init__()
        self.module = module
        self._manager = manager
        self._bucket_cap_bytes = int(bucket_cap_mb * 1024 * 1024)
        # Captured now, while the module is sharded: during forward its attributes are the
        # unsharded parameters, and these (the objects the optimizer holds) stay the shards.
        self._named_params = list(module.named_parameters())
        not_sharded = [n for n, p in self._named_params if not isinstance(p, DTensor)]
        if not_sharded:
            raise TypeError(
                f"parameters {not_sharded[:3]} are not sharded (not DTensors); apply fully_shard to the "
                "modules that own them, or to the root, and wrap before the first forward"
            )
        # Reverse order of definition: roughly the order backward reduces them in.
        self._params = [p for _, p in reversed(self._named_params) if p.requires_grad]
        # The keys module.state_dict() has beyond the parameters (read once, on this thread).
        keys = set(module.state_dict())
        self._persistent_buffers = [n for n, _ in module.named_buffers() if n in keys]
        self._buckets: list[Bucket] = []
        self._bucket_of: dict[int, tuple[Bucket, int]] = {}
        self._generation = manager.abandon_generation
        self._callback_queued = False
        self._next_launch = 0
        """Index of the first bucket not launched yet in this backward (buckets.py)."""
        self._in_step = False
        self._reduced = False
        """This step's buckets were all-reduced (``before_vote``)."""
        self._replay_saved: list[torch.Tensor] | None = None
        """This step's own gradient shards while a healer replays earlier steps into the buckets."""
        self._buffer_sync = BufferAverager(manager, module, enabled=broadcast_buffers)
        self._allocate_buckets()
        for p in self._params:
            p.register_post_accumulate_grad_hook(self._on_grad_ready)
        manager.register_state(state_name, self._state_dict, self._load_state_dict)
        manager.register_hooks(self)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if self._generation != self._manager.abandon_generation:
            self._allocate_buckets()
        return self.module(*args, **kwargs)

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Accumulate gradients without reducing them, inside the group or across groups.

        FSDP2's ``set_requires_gradient_sync(False)`` for the backward passes inside; the
        next backward outside reduce-scatters the accumulated gradients and averages the
        shards across groups.
        """
        module: Any = self.module
        module.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            module.set_requires_gradient_sync(True)

    # -- buckets -------------------------------------------------------------------------------

    def _allocate_buckets(self) -> None:
        """Flat buffers over the local gradient shards, in the order FSDP reduces them."""
        self._generation = self._manager.abandon_generation
        self._buckets = cut_buckets(self._params, self._bucket_cap_bytes, local_shard)
        self._bucket_of = {}
        for bucket in self._buckets:
            for p, offset in zip(bucket.params, bucket.offsets, strict=True):
                self._bucket_of[id(p)] = (bucket, offset)

    def _slots(self, bucket: Bucket) -> Iterator[tuple[nn.Parameter, torch.Tensor]]:
        for p, offset in zip(bucket.params, bucket.offsets, strict=True):
            local = local_shard(p)
            yield p, bucket.buffer[offset : offset + local.numel()].view(local.shape)

    def _on_grad_ready(self, p: torch.Tensor) -> None:
        """FSDP assigned ``p`` its reduce-scattered gradient shard: copy it into its bucket."""
        if not self._callback_queued:
            self._callback_queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._finish_backward)
        bucket, offset = self._bucket_of[id(p)]
        if bucket.work is not None:
            raise GroupError(SECOND_BACKWARD)
        local = _local_grad(p)
        with torch.no_grad():
            bucket.buffer[offset : offset + local.numel()].copy_(local.reshape(-1))
        bucket.ready.add(id(p))
        if bucket.full:
            self._next_launch = launch_in_order(self._buckets, self._next_launch, lambda b: b.full, self._launch)

    def _launch(self, bucket: Bucket) -> None:
        if bucket.buffer.numel() == 0:
            return  # only empty shards (W > rows): nothing to average; same on every group
        bucket.work = self._manager.allreduce(bucket.buffer)

    def _finish_backward(self) -> None:
        """End of backward: launch what is left, wait for every bucket, write the averages back."""
        self._callback_queued = False
        with torch.no_grad():
            for bucket in self._buckets[self._next_launch :]:
                # Parameters that got no gradient this step contribute zeros (or what they hold).
                for p, slot in self._slots(bucket):
                    if id(p) in bucket.ready:
                        continue
                    if p.grad is None:
                        slot.zero_()
                    else:
                        slot.copy_(_local_grad(p))
            self._next_launch = launch_in_order(self._buckets, self._next_launch, lambda _: True, self._launch)
            self._buffer_sync.start_average()
            for bucket in self._buckets:
                if bucket.work is not None:
                    bucket.work.wait()
            self._buffer_sync.wait()
            self._write_grads()
        for bucket in self._buckets:
            bucket.ready.clear()
        self._next_launch = 0
        self._reduced = True

    def _write_grads(self) -> None:
        """Copy the buckets into the gradient shards (creating a gradient where there is none)."""
        with torch.no_grad():
            for bucket in self._buckets:
                for p, slot in self._slots(bucket):
                    if p.grad is None:
                        p.grad = torch.zeros_like(p)
                    _local_grad(p).copy_(slot)

    # -- step hooks (Manager) ------------------------------------------------------------------

    def on_step_start(self) -> None:
        self._in_step = True
        self._reduced = False
        self._callback_queued = False  # a backward that raised may have left it set
        self._next_launch = 0
        if self._generation != self._manager.abandon_generation:
            self._allocate_buckets()
        for bucket in self._buckets:
            bucket.buffer.zero_()
            bucket.ready.clear()
            bucket.work = None
        self._buffer_sync.step_start()

    def before_vote(self) -> None:
        """As ``DistributedDataParallel.before_vote``: a step that failed before its backward
        reduced still runs the all-reduces across groups, with zeros. (FSDP's own collectives
        inside a group of several ranks are torch's: a rank that skips backward there leaves the
        group's other ranks waiting in them.)"""
        if self._in_step and not self._reduced and self._manager.errored() is not None:
            self._finish_backward()

    def on_commit(self) -> None:
        self._in_step = False
        self._buffer_sync.commit()

    def on_abort(self) -> None:
        self._in_step = False
        self._buffer_sync.abort()

    def capture_step(self) -> tuple[list[torch.Tensor], torch.Tensor | None]:
        """This step's averaged gradient shards and buffers (copies), for a healer's replay."""
        return capture(self._buckets), self._buffer_sync.capture()

    def replay_prepare(self, record: tuple[list[torch.Tensor], torch.Tensor | None]) -> None:
        if self._replay_saved is None:  # the first replay: keep this step's own gradients
            self._replay_saved = capture(self._buckets)
        for bucket, grads in zip(self._buckets, record[0], strict=True):
            bucket.buffer.copy_(grads)
        self._write_grads()

    def replay_apply(self, record: tuple[list[torch.Tensor], torch.Tensor | None]) -> None:
        if record[1] is not None:
            self._buffer_sync.write(record[1])

    def end_replay(self) -> None:
        if self._in_step:
            self._buffer_sync.refresh_backup()  # as DistributedDataParallel.end_replay
        saved, self._replay_saved = self._replay_saved, None
        if saved is None:
            return
        for bucket, grads in zip(self._buckets, saved, strict=True):
            bucket.buffer.copy_(grads)
        self._write_grads()

    # -- state (heal and checkpoint) -----------------------------------------------------------

    def _state_dict(self) -> dict[str, Any]:
        """The sharded parameters (flatten takes their local shards) and persistent buffers,
        buffers as of the step's start while a step is in flight. Runs on the quorum thread."""
        state: dict[str, Any] = dict(self._named_params)
        buffers = self._buffer_sync.backup if self._in_step else dict(self.module.named_buffers())
        state.update({n: buffers[n] for n in self._persistent_buffers if n in buffers})
        return state

    def _load_state_dict(self, state: dict[str, Any]) -> None:
        """Copy local shards (plain tensors, from a heal or a checkpoint) into place."""
        expected = [n for n, _ in self._named_params] + self._persistent_buffers
        if sorted(state) != sorted(expected):
            missing, unexpected = sorted(set(expected) - set(state)), sorted(set(state) - set(expected))
            raise StateError(f"model state does not fit this model: missing {missing[:5]}, unexpected {unexpected[:5]}")
        buffers = dict(self.module.named_buffers())
        with torch.no_grad():
            for name, p in self._named_params:
                _copy_checked(local_shard(p), state[name], name)
            for name in self._persistent_buffers:
                _copy_checked(buffers[name], state[name], name)
        if self._in_step:
            self._buffer_sync.refresh_backup()


def shard_optimizer_state(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """Make ``optimizer`` turn loaded plain moments back into DTensors; returns it.

    A heal or a checkpoint carries each moment of a sharded parameter as its local shard (a
    plain tensor); a checkpoint loaded without a template for a moment (a fresh optimizer)
    gives the whole global tensor. ``Optimizer.load_state_dict`` would keep either plain, and
    the next step would fail mixing DTensor parameters with plain moments. The hook installed
    here wraps a tensor shaped like its parameter's local shard into a DTensor with the
    parameter's mesh and placements, and cuts one shaped like the whole parameter down to this
    rank's shard (``distribute_tensor`` from local data: no communication). Scalars such as
    ``step`` stay as they are.
    """
    optimizer.register_load_state_dict_post_hook(_wrap_loaded_state)
    return optimizer


def _wrap_loaded_state(optimizer: torch.optim.Optimizer) -> None:
    for group in optimizer.param_groups:
        for p in group["params"]:
            if not isinstance(p, DTensor) or p not in optimizer.state:
                continue
            local_shape = local_shard(p).shape
            state = optimizer.state[p]
            for key, value in state.items():
                if not isinstance(value, torch.Tensor) or isinstance(value, DTensor) or key == "step":
                    continue
                if value.shape == local_shape:
                    state[key] = like_param(value, p)
                elif value.shape == p.shape:
                    state[key] = distribute_tensor(value, p.device_mesh, p.placements, src_data_rank=None)


def _local_grad(p: torch.Tensor) -> torch.Tensor:
    grad = p.grad
    assert grad is not None
    return local_shard(grad)


def _copy_checked(target: torch.Tensor, value: Any, name: str) -> None:
    if not isinstance(value, torch.Tensor) or value.shape != target.shape or value.dtype != target.dtype:
        got = f"{value.dtype}{list(value.shape)}" if isinstance(value, torch.Tensor) else type(value).__name__
        raise StateError(
            f"model state {name}: got {got}, this rank's shard is {target.dtype}{list(target.shape)}; "
            "every group must shard the same model over the same number of ranks"
        )
    target.copy_(value)
