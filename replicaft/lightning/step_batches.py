"""The training data of a Lightning run, read in replicaft's exactly-once order.

Lightning fetches a batch before the step that trains on it, and one batch ahead besides, but
which samples a step trains on is known only once its quorum is (they depend on the data
cursor and on which groups contribute). So the strategy hands Lightning a placeholder per
step (:class:`StepBatch`) and replaces it with the step's real batch in ``training_step``,
after the quorum: the group's share of the step's global batch, loaded by
``replicaft.data.StepDataLoader`` through the user's dataset, collate function and worker
count. The data position is the sampler's cursor, which heals and checkpoints carry.

A Lightning epoch is ``len(dataset) // global_batch`` optimizer steps; the global order runs
on across epochs (a step may span two passes over the data), so no sample is dropped or
repeated. With ``accumulate_grad_batches=k`` a step is k of Lightning's batches: the rank's
share of the step split into k micro-batches, all trained before the one optimizer step, so
a step that does not commit gives all k back (the cursor never moved).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from replicaft.data import ExactlyOnceSampler, StepDataLoader, sample_ids
from replicaft.data.map_style import check_map_style
from replicaft.errors import OptionsError
from replicaft.manager import Manager

WHERE = "FaultTolerantStrategy"


class StepBatch:
    """Stands in for a step's batch until the step's quorum says which samples it holds."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "StepBatch(resolved in training_step)"


_STEP_BATCH = StepBatch()


class StepBatches:
    """What Lightning iterates as the train dataloader: a placeholder per micro-batch, without
    end; its length is the epoch's, so Lightning ends the epoch after ``len()`` batches."""

    def __init__(self, steps_per_epoch: int, micro_batches: int = 1) -> None:
        self.steps_per_epoch = steps_per_epoch
        self.micro_batches = micro_batches

    def __len__(self) -> int:
        return self.steps_per_epoch * self.micro_batches

    def __iter__(self) -> Iterator[StepBatch]:
        while True:
            yield _STEP_BATCH


class StepData:
    """This rank's share of each step, from the user's train ``DataLoader``'s dataset."""

    def __init__(
        self,
        manager: Manager,
        dataloader: Any,
        *,
        global_batch_size: int | None,
        groups: int,
        seed: int,
        micro_batches: int = 1,
    ) -> None:
        """``global_batch_size`` None: the DataLoader's ``batch_size`` times the job's ranks
        (``groups`` times the ranks per group) times ``micro_batches``, so each rank trains on
        ``batch_size`` samples a micro-batch, as with Lightning's own DDP, while all groups are
        up (and more while some are down: the global batch, which the optimizer's settings
        assume, holds)."""
        dataset, batch_size = _check_dataloader(dataloader)
        ranks = groups * manager.options.group_world_size
        self.micro_batches = micro_batches
        if global_batch_size is None:
            global_batch_size = batch_size * ranks * micro_batches
        self.global_batch_size = global_batch_size
        if self.global_batch_size < ranks * micro_batches:
            raise OptionsError(
                f"global_batch_size={global_batch_size} is fewer than one sample per micro-batch for each of the "
                f"job's {ranks} ranks ({groups} groups) times accumulate_grad_batches={micro_batches}; use at least "
                f"{ranks * micro_batches}"
            )
        self.steps_per_epoch = len(dataset) // self.global_batch_size
        if self.steps_per_epoch < 1:
            raise OptionsError(
                f"the train dataset holds {len(dataset)} samples, fewer than one global batch of "
                f"{self.global_batch_size}; lower global_batch_size or the DataLoader's batch_size"
            )
        self.sampler = ExactlyOnceSampler(manager, len(dataset), self.global_batch_size, policy="global", seed=seed)
        self.loader = StepDataLoader(
            self.sampler,
            dataset,
            num_workers=dataloader.num_workers,
            collate_fn=dataloader.collate_fn,
            micro_batches_per_step=micro_batches if micro_batches > 1 else None,
        )
        self._dataset = dataset
        self._collate = dataloader.collate_fn

    def batches(self) -> list[tuple[Any, float]]:
        """This step's ``micro_batches`` batches, each with the loss weight that makes the
        average over the contributing ranks the mean over the step's global batch (blocks for
        the quorum). A healer, whose gradient does not count, gets samples of the size a
        contributor's micro-batch has, so its forward and backward run like the others' and
        its collectives line up with theirs."""
        batches = self.loader.micro_batches()
        if batches:
            return batches
        share = self.sampler.share()
        plan = self.sampler.manager.wait_quorum()
        contributors = max(1, plan.num_contributors if plan is not None else 1)
        ranks = contributors * self.sampler.manager.options.group_world_size * self.micro_batches
        size = -(-self.global_batch_size // ranks)
        ids = sample_ids(share.step_start, share.step_start + size, self.sampler.dataset_len, self.sampler.seed)
        return [(self._collate([self._dataset[i] for i in ids]), 1.0)] * self.micro_batches

    def close(self) -> None:
        self.loader.close()


def _check_dataloader(dataloader: Any) -> tuple[torch.utils.data.Dataset, int]:
    """The dataset and batch size of a train DataLoader the exactly-once order can read."""
    if not isinstance(dataloader, torch.utils.data.DataLoader):
        raise OptionsError(
            f"the train dataloader is a {type(dataloader).__name__}; FaultTolerantStrategy reads a "
            "torch.utils.data.DataLoader's dataset in replicaft's exactly-once order"
        )
    check_map_style(dataloader, where=WHERE, loader_name="the train DataLoader")
    if dataloader.batch_size is None:
        raise OptionsError(
            f"{WHERE}: the train DataLoader has batch_size=None (no batching); set batch_size= (the samples "
            "per group per step)"
        )
    return dataloader.dataset, int(dataloader.batch_size)
