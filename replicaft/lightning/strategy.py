"""``FaultTolerantStrategy``: a Lightning Strategy that trains an unchanged LightningModule
as one replica group of a replicaft job (one rank, or W ranks under torchrun that train as
Lightning's DDP inside the group, ``replica_group.py``).

Each optimizer step is a replicaft step: the quorum is asked for when the batch starts, the
gradients are averaged across the contributing groups by replicaft's DDP wrapper during
backward, and the optimizer (and its step-interval LR schedulers) step only when the step
commits. What a heal moves and a checkpoint saves: the module's parameters and buffers, the
optimizer, the LR schedulers, the data cursor (``step_batches.py``), the callbacks' and the
datamodule's state, and the committed step count, from which Lightning's loop counters are
set after every step (``loop_counters.py``), so ``global_step``, the epoch, ``batch_idx`` and
the logging step count committed steps only, on a healed group too.

With ``accumulate_grad_batches=k`` an optimizer step is k batches: the quorum is asked for
at the first, the first k - 1 backward passes accumulate locally (``no_sync``) and the last
all-reduces, so there is one quorum and one fault-tolerant all-reduce per optimizer step; a
step that does not commit rolls back all k batches (data and counters).

What it does not do (each refused with an error that says so): manual optimization, several
optimizers, and an IterableDataset or a custom sampler for training data.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import pytorch_lightning as pl
import torch
import torch.distributed as dist
from pytorch_lightning.strategies import SingleDeviceStrategy
from pytorch_lightning.trainer.states import RunningStage

from replicaft.config.env_names import NUM_GROUPS_ENV
from replicaft.config.options import ManagerOptions
from replicaft.errors import OptionsError
from replicaft.lightning.loop_counters import counters_after, set_counters
from replicaft.lightning.replica_group import ReplicaGroup
from replicaft.lightning.step_batches import StepBatch, StepBatches, StepData
from replicaft.lightning.training_state import CommittedStepScheduler, LightningExtras
from replicaft.manager import Manager
from replicaft.wrappers.ddp import DistributedDataParallel


class FaultTolerantStrategy(SingleDeviceStrategy):
    """Train as one rank of a replica group: ``Trainer(strategy=FaultTolerantStrategy(), devices=1)``.

    ``options``: the manager's (default: ``ManagerOptions.from_env()``, what
    ``replicaft-launch`` sets, with torchrun's rank and world size for a group of several
    ranks). ``global_batch_size``: samples per optimizer step across the job (default: the
    train DataLoader's ``batch_size`` times the job's ranks, ``$REPLICAFT_NUM_GROUPS`` times
    the ranks per group, times ``accumulate_grad_batches``), split among the groups that
    contribute each step and within a group among its ranks. ``seed``: of the exactly-once
    order.
    """

    strategy_name = "replicaft"

    def __init__(
        self,
        options: ManagerOptions | None = None,
        *,
        global_batch_size: int | None = None,
        seed: int = 0,
        device: str | torch.device = "cpu",
    ) -> None:
        super().__init__(device=device)
        self._options = options
        self._global_batch_size = global_batch_size
        self._seed = seed
        self.manager: Manager | None = None
        self.data: StepData | None = None
        self.group = ReplicaGroup()
        self._ddp: DistributedDataParallel | None = None
        self._micro_batches = 1
        """Lightning's ``accumulate_grad_batches``: batches per optimizer step."""
        self._step_batches: list[tuple[Any, float]] = []
        """The open step's micro-batches not trained yet; empty: no step is open."""
        self._step_open = False
        self._step_loss: list[torch.Tensor] = []
        self._loss_weight = 1.0
        self._committed = True

    # -- set-up and teardown -------------------------------------------------------------------

    def setup_environment(self) -> None:
        super().setup_environment()
        options = self._options or ManagerOptions.from_env()
        self.group.open(options, self.root_device)
        # SingleDeviceStrategy's attributes, which Lightning reads for the rank and size.
        self.global_rank = self.local_rank = self.group.rank
        self.world_size = self.group.size
        self.manager = Manager(options).start()

    def _setup_model(self, model: torch.nn.Module) -> torch.nn.Module:
        self._ddp = DistributedDataParallel(self._started_manager(), model, group=self.group.process_group)
        return self._ddp

    def setup(self, trainer: pl.Trainer) -> None:
        super().setup(trainer)
        module = self.lightning_module
        assert module is not None
        if not module.automatic_optimization:
            raise OptionsError("FaultTolerantStrategy supports automatic optimization only; manual optimization is not")
        self._micro_batches = int(trainer.accumulate_grad_batches)
        if len(self.optimizers) != 1:
            raise OptionsError(f"configure_optimizers returned {len(self.optimizers)} optimizers; use one")
        self._register_optimizer_and_schedulers()
        LightningExtras(self._started_manager(), trainer)
        _pass_placeholders_through(module)

    def _register_optimizer_and_schedulers(self) -> None:
        """The optimizer and the step-interval scheduler a healer's replay steps; every
        scheduler's state travels, and each steps (for Lightning) only after a commit."""
        manager = self._started_manager()
        replayed = None
        for i, config in enumerate(self.lr_scheduler_configs):
            if replayed is None and config.interval == "step" and config.frequency == 1:
                replayed = config.scheduler
            else:
                scheduler = config.scheduler
                manager.register_state(f"lr_scheduler_{i}", scheduler.state_dict, scheduler.load_state_dict)
            config.scheduler = CommittedStepScheduler(config.scheduler, lambda: self._committed)
        manager.register_optimizer(self.optimizers[0], replayed)

    def process_dataloader(self, dataloader: object) -> object:
        trainer = self.lightning_module.trainer if self.lightning_module is not None else None
        if trainer is None or trainer.state.stage != RunningStage.TRAINING:
            return dataloader
        if self.data is None:
            groups = int(os.environ.get(NUM_GROUPS_ENV, "1"))
            self.data = StepData(
                self._started_manager(),
                dataloader,
                global_batch_size=self._global_batch_size,
                groups=groups,
                seed=self._seed,
                micro_batches=self._micro_batches,
            )
        return StepBatches(self.data.steps_per_epoch, self._micro_batches)

    def teardown(self) -> None:
        if self.data is not None:
            self.data.close()
        if self.manager is not None:
            self.manager.shutdown()
            self.manager = None
        self.group.close()
        super().teardown()

    def on_exception(self, exception: BaseException) -> None:
        if self.manager is not None:
            self.manager.shutdown()
            self.manager = None

    # -- the group's ranks (replica_group.py) --------------------------------------------------

    @property
    def is_global_zero(self) -> bool:
        return self.group.rank == 0

    def barrier(self, *args: Any, **kwargs: Any) -> None:
        self.group.barrier()

    def reduce(self, tensor: Any, group: Any = None, reduce_op: Any = "mean") -> Any:
        """Lightning's metric reduction (``sync_dist=True``), over the group's ranks: "mean"
        or "sum" (the default "mean")."""
        if not isinstance(tensor, torch.Tensor) or self.group.size == 1:
            return tensor
        op = str(reduce_op).lower().rsplit(".", 1)[-1] if reduce_op is not None else "mean"
        if op not in ("mean", "avg", "sum"):
            raise OptionsError(f"reduce_op={reduce_op!r}: FaultTolerantStrategy reduces with 'mean' or 'sum'")
        total = self.group.all_reduce(tensor.float() if op != "sum" else tensor, dist.ReduceOp.SUM)
        return total / self.group.size if op != "sum" else total

    def all_gather(self, tensor: torch.Tensor, group: Any = None, sync_grads: bool = False) -> torch.Tensor:
        return self.group.all_gather(tensor)

    def reduce_boolean_decision(self, decision: bool, all: bool = True) -> bool:
        votes = self.group.all_reduce(torch.tensor(int(decision)), dist.ReduceOp.SUM)
        return bool(votes == self.group.size) if all else bool(votes > 0)

    # -- the step ------------------------------------------------------------------------------

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        """The quorum of an optimizer step, asked for at its first batch."""
        if not self._step_open:
            self._started_manager().start_quorum()
            self._step_open = True
            self._step_loss = []

    def batch_to_device(self, batch: Any, device: torch.device | None = None, dataloader_idx: int = 0) -> Any:
        if isinstance(batch, StepBatch):
            return batch
        return super().batch_to_device(batch, device, dataloader_idx)

    def training_step(self, *args: Any, **kwargs: Any) -> Any:
        if args and isinstance(args[0], StepBatch):
            args = (self._step_batch(), *args[1:])
        return super().training_step(*args, **kwargs)

    def _step_batch(self) -> Any:
        """The step's real batch, through the module's batch-transfer hooks as Lightning would
        have sent it; the logger's batch too, so ``self.log`` infers the batch size from it."""
        assert self.data is not None and self.lightning_module is not None
        if not self._step_batches:
            self._step_batches = self.data.batches()
        batch, self._loss_weight = self._step_batches.pop(0)
        module = self.lightning_module
        trainer = module.trainer
        batch = trainer.precision_plugin.convert_input(batch)
        batch = module._on_before_batch_transfer(batch, 0)
        batch = self.batch_to_device(batch, dataloader_idx=0)
        trainer._results.batch = batch
        trainer._results.batch_size = None
        return batch

    def backward(self, closure_loss: torch.Tensor, optimizer: Any, *args: Any, **kwargs: Any) -> torch.Tensor:
        """Lightning divides each batch's loss by ``accumulate_grad_batches``; the micro-batch's
        weight (its part of the share) replaces that division. Every batch of a step but the
        last accumulates locally; the last one's backward all-reduces."""
        self._step_loss.append(closure_loss.detach())
        weight = self._loss_weight * self._micro_batches
        if weight != 1.0:
            closure_loss = closure_loss * weight
        trainer = self.lightning_module.trainer
        if self._micro_batches > 1 and trainer.fit_loop._should_accumulate():
            assert self._ddp is not None
            with self._ddp.no_sync():
                return super().backward(closure_loss, optimizer, *args, **kwargs)
        return super().backward(closure_loss, optimizer, *args, **kwargs)

    def optimizer_step(self, optimizer: Any, closure: Callable[[], Any], model: Any = None, **kwargs: Any) -> Any:
        manager = self._started_manager()
        committing = _CommittingOptimizer(optimizer, manager, lambda: float(sum(self._step_loss)))
        result = super().optimizer_step(committing, closure, model, **kwargs)
        self._committed = committing.committed
        self._step_open = False
        self._step_batches = []
        trainer = self.lightning_module.trainer
        steps_per_epoch = max(1, int(trainer.num_training_batches) // self._micro_batches)
        counters = counters_after(manager.current_step(), self._committed, steps_per_epoch)
        set_counters(trainer.fit_loop, counters, steps_per_epoch, self._micro_batches)
        return result

    def _started_manager(self) -> Manager:
        if self.manager is None:
            raise OptionsError("FaultTolerantStrategy's manager is not running: use it through Trainer.fit")
        return self.manager


class _CommittingOptimizer:
    """The optimizer as the precision plugin steps it: the closure (forward, backward, the
    gradient all-reduce, clipping) runs, then the step is applied only if it commits."""

    def __init__(self, optimizer: torch.optim.Optimizer, manager: Manager, step_loss: Callable[[], float]) -> None:
        self.optimizer = optimizer
        self.manager = manager
        self.step_loss = step_loss
        """The step's loss: the mean over its batches (Lightning's losses divided by their count)."""
        self.committed = False

    def step(self, closure: Callable[[], Any] | None = None, **kwargs: Any) -> Any:
        loss = closure() if closure is not None else None
        if isinstance(loss, torch.Tensor):
            # The commit event's loss (the chaos report's curve), and the checkpoints' metric.
            value = self.step_loss()
            self.manager.annotate_commit(loss=value)
            self.manager.report_metrics(loss=value)
        self.committed = self.manager.should_commit()
        if self.committed:
            self.optimizer.step(**kwargs)
        return loss

    def __getattr__(self, name: str) -> Any:
        return getattr(self.optimizer, name)


def _pass_placeholders_through(module: pl.LightningModule) -> None:
    """Lightning sends each batch through the ``on_before_batch_transfer`` hook (the module's
    or the datamodule's) when it fetches it; a placeholder must pass untouched (the real batch
    goes through it in ``training_step``), so a user's hook never sees one. The dispatcher is
    wrapped, not the hook, so Lightning's choice between the module's and the datamodule's
    hook is left as it was."""
    dispatch = module._on_before_batch_transfer

    def on_before_batch_transfer(batch: Any, dataloader_idx: int = 0) -> Any:
        return batch if isinstance(batch, StepBatch) else dispatch(batch, dataloader_idx)

    module._on_before_batch_transfer = on_before_batch_transfer  # type: ignore[method-assign]
