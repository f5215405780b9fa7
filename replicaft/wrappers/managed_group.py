"""A real ``torch.distributed.ProcessGroup`` whose all-reduce is the manager's fault-tolerant one.

Why. Code that is not ours averages across the replicate dimension through c10d: torchtitan's
HSDP hands FSDP2 an all-reduce hook that calls ``dist.all_reduce(grad, group=pg, op=AVG)``, and
its loss reductions call ``funcol.all_reduce(loss, "avg", group=pg)``. A
:class:`ManagedProcessGroup` is such a ``pg``: a Python subclass of c10d's ``ProcessGroup``
(torch calls a Python subclass's methods from its C++ side too, so the functional collectives
reach it), whose ``allreduce`` is ``Manager.allreduce``. A peer group's failure therefore never
raises into the caller: the step is simply not committed, as with replicaft's own wrappers.

The group as c10d sees it. Membership changes per quorum, which c10d's fixed-size groups cannot
express, so the group is a world of one rank (rank 0, the c10d size 1) and :meth:`size`
reports the number of groups contributing this step (torchft's choice too). :meth:`register`
enters it in c10d's registry (a backend whose factory returns this object, then
``dist.new_group`` over this process's own global rank), which the functional collectives
and ``DeviceMesh.from_group`` need; ``dist.all_reduce(group=pg)`` works without it.

Buffers. The collective runs on a private copy of the caller's tensor, copied back only
when it succeeded. A hung all-reduce is abandoned, never aborted in place (column/process_group.py),
and an abandoned Gloo operation may complete later and write into its buffer; FSDP2 cuts
gradients as views out of the tensor its hook is handed, so reducing that tensor in place
would let a late write land in live gradients. The copy costs one pass over the reduced bytes
each way. On failure the caller's tensor keeps its own value (this group's local average,
harmless: the step does not commit).

Heals. A healer that records steps while its fetch runs replays them from the gradients the
registered optimizers' parameters held at each step's end (gradient_record.py), since the
tensors handed to ``allreduce`` may be transient (FSDP2's reduce-scatter outputs).

Only ``allreduce`` (SUM, AVG, MAX, of one tensor) is offered: that is the replicate dimension's
one collective. Anything else raises c10d's "not supported" error; use the group's own process
group for collectives inside a replica group.
"""

from __future__ import annotations

import datetime

import torch
import torch.distributed as dist

from replicaft.column.process_group import ManagedWork
from replicaft.errors import OptionsError
from replicaft.manager import Manager
from replicaft.wrappers.gradient_record import GradientRecord

__all__ = ["ManagedProcessGroup", "StepWork"]


class StepWork(dist.Work):
    """The c10d ``Work`` of one managed all-reduce: ``wait()`` blocks until it ends, copies
    the result into the caller's tensor if it succeeded, and returns whether it did; it never
    raises for a peer's failure. Call ``wait`` (or ``get_future``) on the training thread:
    the manager's step bookkeeping lives there."""

    def __init__(self, target: torch.Tensor, staged: torch.Tensor, work: ManagedWork) -> None:
        super().__init__()
        self._target = target
        self._staged = staged
        self._work = work
        self._ok: bool | None = None
        self._future: torch.futures.Future[list[torch.Tensor]] | None = None

    def wait(self, timeout: datetime.timedelta | None = None) -> bool:
        """``timeout`` is accepted for c10d's signature; the manager's collective deadline bounds the wait."""
        if self._ok is None:
            self._ok = self._work.wait()
            if self._ok and self._staged is not self._target:
                self._target.copy_(self._staged)
        return self._ok

    def is_completed(self) -> bool:
        return self._ok is not None

    def is_success(self) -> bool:
        return bool(self._ok)

    def get_future(self) -> torch.futures.Future[list[torch.Tensor]]:
        """A completed future of ``[tensor]``. It waits first: the manager's waits run on the
        training thread, so the future cannot be completed from another one later."""
        if self._future is None:
            self.wait()
            self._future = torch.futures.Future()
            self._future.set_result([self._target])
        return self._future


def _reduction(opts: object) -> tuple[str, bool]:
    """(reduce, average) for ``Manager.allreduce`` from c10d's options (or a bare ReduceOp, as torchft accepts)."""
    op = opts.reduceOp if isinstance(opts, dist.AllreduceOptions) else opts
    if op == dist.ReduceOp.AVG:
        return "sum", True
    if op == dist.ReduceOp.SUM:
        return "sum", False
    if op == dist.ReduceOp.MAX:
        return "max", False
    raise OptionsError(f"ManagedProcessGroup.allreduce(op={op}): only SUM, AVG and MAX are fault tolerant")


class ManagedProcessGroup(dist.ProcessGroup):
    """``manager``'s cross-group all-reduce as a c10d process group (see the module docstring).

    Build one per manager, after the optimizer is registered with it (``replicaft.Optimizer``)
    and before the first step; the step contract stays the manager's: ``start_quorum`` (the
    optimizer wrapper's ``zero_grad``) begins it, ``should_commit`` ends it, and every rank of
    every group issues the same all-reduces in the same order.
    """

    def __init__(self, manager: Manager) -> None:
        if not isinstance(manager, Manager):
            raise OptionsError(
                f"ManagedProcessGroup({manager!r}): pass a replicaft.Manager (torchft's Manager: "
                "torchft.process_group.ManagedProcessGroup)"
            )
        super().__init__(0, 1)
        self._manager = manager
        self._group_name: str | None = None
        manager.register_hooks(GradientRecord(manager))

    @property
    def manager(self) -> Manager:
        return self._manager

    def allreduce(self, tensors: list[torch.Tensor], opts: object = None) -> dist.Work:
        """Start the fault-tolerant all-reduce of ``tensors[0]`` (one tensor) and return its Work.
        Training thread; blocks until the step's quorum is known."""
        if len(tensors) != 1:
            raise OptionsError(f"ManagedProcessGroup.allreduce takes one tensor, got {len(tensors)}")
        reduce, average = _reduction(dist.ReduceOp.SUM if opts is None else opts)
        tensor = tensors[0]
        if average and not tensor.is_floating_point():
            raise OptionsError(f"ManagedProcessGroup.allreduce(op=AVG) of a {tensor.dtype} tensor: AVG needs floats")
        staged = tensor.detach().clone()
        return StepWork(tensor, staged, self._manager.allreduce(staged, reduce=reduce, average=average))

    def size(self) -> int:
        """The groups contributing this step once its quorum is known (the divisor of AVG); 1 before."""
        return self._manager.num_participants() or 1

    def getBackendName(self) -> str:
        return f"replicaft-{self._manager.options.backend or 'managed'}"

    def errored(self) -> Exception | None:
        """Why this step will not commit, if it will not."""
        return self._manager.errored()

    # -- c10d's registry ------------------------------------------------------------------------

    def register(self, name: str) -> ManagedProcessGroup:
        """Enter this group in c10d's registry as ``<backend>:<name>``, so that the functional
        collectives and ``DeviceMesh.from_group`` accept it; returns ``self``. Once per name,
        after ``torch.distributed.init_process_group`` (the replica group's own default group)."""
        if not dist.is_initialized():
            raise OptionsError(
                f"ManagedProcessGroup.register({name!r}) needs torch.distributed.init_process_group first (the "
                "replica group's own group, e.g. under torchrun); dist.all_reduce(group=pg) works without registering"
            )
        backend = f"{self.getBackendName()}:{name}"
        if hasattr(dist.Backend, backend.upper()):
            raise OptionsError(f"a process group is already registered as {backend!r}; pick another name")
        devices = ["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"]
        dist.Backend.register_backend(backend, lambda *_: self, devices=devices)
        group = dist.new_group(ranks=[dist.get_rank()], backend=backend, group_desc=backend)
        assert group is self, "c10d returns a Python process group from its backend factory as it is"
        return self

    def unregister(self) -> None:
        """Remove this group from c10d's registry (``dist.destroy_process_group``)."""
        dist.destroy_process_group(self)

    @property
    def group_name(self) -> str:
        # c10d keeps a group's name in its C++ backends, which a Python group has none of.
        if self._group_name is None:
            raise OptionsError("this ManagedProcessGroup is not registered; call register(name) first")
        return self._group_name

    def _set_group_name(self, name: str) -> None:
        self._group_name = name
