"""The step's data loader: this rank's share of each step, loaded ahead by DataLoader workers.

The sampler (``sampler.py``) decides which positions of the global order a step trains on;
the loader turns them into batches, prefetching the next step's expected share while this one
trains and discarding any batch a changed membership or an aborted step made stale.
"""

from __future__ import annotations

import collections
import functools
import multiprocessing
import multiprocessing.context
from collections.abc import Iterator
from typing import Any

import torch

from replicaft.data.sampler import ExactlyOnceSampler, epoch_permutation, sample_ids
from replicaft.deterministic.rules import check_shards
from replicaft.errors import OptionsError
from replicaft.process.process_tree import die_with_parent


class StepDataLoader:
    """Loads this rank's share of each step through ``torch.utils.data.DataLoader``, exactly once.

    A step's samples are known only once its quorum is (they depend on the cursor and the
    contributors), but worker processes should load ahead. So one long-lived DataLoader (its
    workers start once) reads *positions* of the global order from a plan this class fills:
    at each step it plans the step's actual micro-batches if they were not already planned,
    then the *expected* micro-batches of the next step (same contributors, this step
    committed), which the workers prefetch while the step trains. Every batch comes back
    tagged with its positions; one that is not what the step needs (a stale prediction: the
    membership changed or the step aborted) is discarded, never trained on. When the plan runs
    dry the sampler hands out an empty placeholder instead of blocking (a DataLoader asks its
    sampler for more from the training thread, so blocking there would deadlock).

    With ``num_workers=0`` the share is loaded directly, in the training thread. Workers are
    started with the ``forkserver`` method: this process runs gRPC threads, which make a plain
    ``fork()`` unsafe; the dataset must therefore be picklable.

    ``micro_batches()`` returns ``(batch, loss weight)`` pairs: the share split into
    micro-batches of ``micro_batch_size`` (run all but the last backward under
    ``ddp.no_sync()``), each weighted by its fraction of the share times ``loss_scale``.
    """

    def __init__(
        self,
        sampler: ExactlyOnceSampler,
        dataset: torch.utils.data.Dataset,
        *,
        micro_batch_size: int | None = None,
        num_workers: int = 0,
        collate_fn: Any = None,
        timeout_s: float = 120.0,
    ) -> None:
        if micro_batch_size is not None and micro_batch_size < 1:
            raise OptionsError(f"micro_batch_size={micro_batch_size}; use None or at least 1")
        if num_workers < 0:
            raise OptionsError(f"num_workers={num_workers}; use 0 (load in this process) or more")
        if sampler.deterministic:
            shard_size = check_shards(sampler.batch_size, sampler.num_shards)
            if micro_batch_size not in (None, shard_size):
                raise OptionsError(
                    f"micro_batch_size={micro_batch_size} with deterministic=True: each micro-batch is "
                    f"one virtual shard ({sampler.batch_size} / {sampler.num_shards} = {shard_size} "
                    "samples); leave micro_batch_size unset"
                )
            micro_batch_size = shard_size
        self.sampler = sampler
        self.dataset = dataset
        self.micro_batch_size = micro_batch_size
        self.num_workers = num_workers
        self.collate_fn = collate_fn or torch.utils.data.default_collate
        self.timeout_s = timeout_s
        self.discarded_batches = 0
        self._plan: collections.deque[list[int]] = collections.deque()
        self._predicted: list[list[int]] = []
        self._iterator: Any = None

    def micro_batches(self) -> list[tuple[Any, float]]:
        """This step's (batch, loss weight) pairs; empty for a healer (it contributes zeros)."""
        share = self.sampler.share()
        wanted = self._split(share.start, share.stop)
        n = max(share.num_samples, 1)
        if not wanted:
            return []
        if self.num_workers == 0:
            batches = [self._load_here(positions) for positions in wanted]
        else:
            if self._predicted != wanted:
                self._plan.extend(wanted)
            total = share.step_stop - share.step_start
            self._predicted = self._split(share.start + total, share.stop + total)
            self._plan.extend(self._predicted)
            batches = self._receive(wanted)
        if self.sampler.deterministic:  # exactly 1.0: a computed weight would round differently per group
            return [(b, 1.0) for b in batches]
        return [(b, len(positions) / n * share.loss_scale) for b, positions in zip(batches, wanted, strict=True)]

    def _split(self, start: int, stop: int) -> list[list[int]]:
        size = self.micro_batch_size or max(stop - start, 1)
        return [list(range(i, min(i + size, stop))) for i in range(start, stop, size)]

    def _load_here(self, positions: list[int]) -> Any:
        ids = sample_ids(positions[0], positions[-1] + 1, self.sampler.dataset_len, self.sampler.seed)
        return self.collate_fn([self.dataset[i] for i in ids])

    def _receive(self, wanted: list[list[int]]) -> list[Any]:
        if self._iterator is None:
            loader = torch.utils.data.DataLoader(
                _PositionDataset(self.dataset, self.sampler.dataset_len, self.sampler.seed),
                batch_sampler=_PlanSampler(self._plan),
                num_workers=self.num_workers,
                collate_fn=_PositionCollate(self.collate_fn),
                timeout=self.timeout_s,
                multiprocessing_context=_forkserver_context(),
                worker_init_fn=_die_with_parent,
            )
            self._iterator = iter(loader)
        out: list[Any] = []
        while len(out) < len(wanted):
            positions, batch = next(self._iterator)
            if positions == wanted[len(out)]:
                out.append(batch)
            elif positions != [_PLACEHOLDER]:
                self.discarded_batches += 1
        return out

    def close(self) -> None:
        self._iterator = None


_PLACEHOLDER = -1


class _PlanSampler:
    """Yields planned micro-batches of positions, or a placeholder when none is planned."""

    def __init__(self, plan: collections.deque[list[int]]) -> None:
        self._plan = plan

    def __iter__(self) -> Iterator[list[int]]:
        while True:
            try:
                yield self._plan.popleft()
            except IndexError:
                yield [_PLACEHOLDER]


class _PositionDataset(torch.utils.data.Dataset):
    """Maps a global position to its sample; runs in the DataLoader's workers."""

    def __init__(self, dataset: torch.utils.data.Dataset, dataset_len: int, seed: int) -> None:
        self.dataset = dataset
        self.dataset_len = dataset_len
        self.seed = seed

    def __getitem__(self, position: int) -> tuple[int, Any]:
        if position == _PLACEHOLDER:
            return position, None
        epoch, offset = divmod(position, self.dataset_len)
        return position, self.dataset[int(_cached_permutation(epoch, self.dataset_len, self.seed)[offset])]


class _PositionCollate:
    def __init__(self, collate: Any) -> None:
        self.collate = collate

    def __call__(self, items: list[tuple[int, Any]]) -> tuple[list[int], Any]:
        positions = [p for p, _ in items]
        if positions == [_PLACEHOLDER]:
            return positions, None
        return positions, self.collate([item for _, item in items])


def _forkserver_context() -> multiprocessing.context.BaseContext:
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["replicaft.process._forkserver"])
    return ctx


def _die_with_parent(worker_id: int) -> None:
    """Workers are children of the forkserver, which dies with this process (even by SIGKILL,
    see replicaft/process/_forkserver.py); without this they would outlive a killed group."""
    die_with_parent(exit_if_orphaned=True)


@functools.lru_cache(maxsize=4)
def _cached_permutation(epoch: int, dataset_len: int, seed: int) -> torch.Tensor:
    return epoch_permutation(epoch, dataset_len, seed)
