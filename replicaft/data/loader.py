"""The step's data loader: this rank's share of each step, loaded ahead by DataLoader workers.

The sampler (``sampler.py``) decides which positions of the global order a step trains on;
the loader turns them into batches, prefetching the next step's expected share while this one
trains and discarding any batch a changed membership or an aborted step made stale.
``StepDataLoader.from_loader`` does the same through a user's torchdata ``StatefulDataLoader``
(stateful.py: its settings, and its state carried by checkpoints).
"""

from __future__ import annotations

import collections
import itertools
import multiprocessing
import multiprocessing.context
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch

from replicaft.data.sampler import ExactlyOnceSampler, cached_epoch_permutation, sample_ids
from replicaft.deterministic.rules import check_shards
from replicaft.errors import OptionsError
from replicaft.process.process_tree import die_with_parent

if TYPE_CHECKING:
    from replicaft.data.stateful import LoaderState


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

    With ``num_workers=0`` the share is loaded directly, in the training thread (through
    :meth:`from_loader`, by the StatefulDataLoader, in this thread too, nothing ahead). Workers are
    started with the ``forkserver`` method: this process runs gRPC threads, which make a plain
    ``fork()`` unsafe; the dataset must therefore be picklable.

    ``micro_batches()`` returns ``(batch, loss weight)`` pairs: the share split into
    micro-batches of ``micro_batch_size`` (run all but the last backward under
    ``ddp.no_sync()``), each weighted by its fraction of the share times ``loss_scale``; or,
    with ``micro_batches_per_step``, into exactly that many, as even as possible (a loop that
    runs a fixed number of backward passes a step, as Lightning's ``accumulate_grad_batches``).
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
        micro_batches_per_step: int | None = None,
    ) -> None:
        if micro_batch_size is not None and micro_batch_size < 1:
            raise OptionsError(f"micro_batch_size={micro_batch_size}; use None or at least 1")
        if micro_batches_per_step is not None and (micro_batches_per_step < 1 or micro_batch_size is not None):
            raise OptionsError(
                f"micro_batches_per_step={micro_batches_per_step} with micro_batch_size={micro_batch_size}; "
                "give at most one of them, and a count of at least 1"
            )
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
        self.micro_batches_per_step = micro_batches_per_step
        self.num_workers = num_workers
        self.collate_fn = collate_fn or torch.utils.data.default_collate
        self.timeout_s = timeout_s
        self.discarded_batches = 0
        self._plan: collections.deque[list[int]] = collections.deque()
        self._predicted: list[list[int]] = []
        self._iterator: Any = None
        self._state: LoaderState | None = None
        """Set by :meth:`from_loader`: the user's StatefulDataLoader settings and its committed state."""

    @classmethod
    def from_loader(
        cls, sampler: ExactlyOnceSampler, loader: Any, *, timeout_s: float = 120.0, state_name: str = "data_loader"
    ) -> StepDataLoader:
        """A step loader that loads through a ``torchdata.stateful_dataloader.StatefulDataLoader``
        with ``loader``'s settings (dataset, ``batch_size`` as the micro-batch, collate_fn,
        workers, prefetch, pinning, worker init, generator), the positions still the sampler's;
        its state as of the last committed step is registered with the manager as
        ``state_name``, this group's own: checkpoints carry it, heals do not (stateful.py says
        why). ``OptionsError`` for a loader that exactly-once cannot honour (an iterable-style
        dataset such as a ``datasets.IterableDataset``, a sampler of its own, ``drop_last``)."""
        from replicaft.data.stateful import LoaderState, loader_settings  # torchdata is an optional dependency

        settings = loader_settings(sampler, loader)
        out = cls(
            sampler,
            settings.dataset,
            micro_batch_size=settings.batch_size,
            num_workers=settings.num_workers,
            collate_fn=settings.collate_fn,
            timeout_s=timeout_s,
        )
        out._state = LoaderState(sampler.manager, settings, state_name)
        return out

    def micro_batches(self) -> list[tuple[Any, float]]:
        """This step's (batch, loss weight) pairs; empty for a healer (it contributes zeros)."""
        share = self.sampler.share()
        wanted = self._split(share.start, share.stop)
        n = max(share.num_samples, 1)
        if not wanted:
            return []
        if self.num_workers == 0 and self._state is None:
            batches = [self._load_here(positions) for positions in wanted]
        else:
            got = None
            while got is None:  # twice at most: a loader started again holds no stale batch
                if self._state is not None and self._state.restart_due:
                    self._restart()
                if self._predicted != wanted:
                    self._plan.extend(wanted)
                if self.num_workers:  # only workers load ahead
                    total = share.step_stop - share.step_start
                    self._predicted = self._split(share.start + total, share.stop + total)
                    self._plan.extend(self._predicted)
                got = self._receive(wanted)
            batches = got
        if self.sampler.deterministic:  # exactly 1.0: a computed weight would round differently per group
            return [(b, 1.0) for b in batches]
        return [(b, len(positions) / n * share.loss_scale) for b, positions in zip(batches, wanted, strict=True)]

    def _split(self, start: int, stop: int) -> list[list[int]]:
        parts = self.micro_batches_per_step
        if parts is not None and stop > start:
            if stop - start < parts:
                raise OptionsError(
                    f"this rank's share of the step is {stop - start} samples, fewer than "
                    f"micro_batches_per_step={parts}; raise the global batch or lower the count"
                )
            base, extra = divmod(stop - start, parts)
            bounds = [start + i * base + min(i, extra) for i in range(parts + 1)]
            return [list(range(a, b)) for a, b in itertools.pairwise(bounds)]
        size = self.micro_batch_size or max(stop - start, 1)
        return [list(range(i, min(i + size, stop))) for i in range(start, stop, size)]

    def _load_here(self, positions: list[int]) -> Any:
        ids = sample_ids(positions[0], positions[-1] + 1, self.sampler.dataset_len, self.sampler.seed)
        return self.collate_fn([self.dataset[i] for i in ids])

    def _receive(self, wanted: list[list[int]]) -> list[Any] | None:
        """The planned batches ``wanted``, stale ones discarded; None when a discarded one must
        be rolled back (its load is in a ``Stateful`` dataset's state): start again and replan."""
        if self._iterator is None:
            self._iterator = self._start()
        out: list[Any] = []
        while len(out) < len(wanted):
            positions, batch = next(self._iterator)
            if positions == wanted[len(out)]:
                out.append(batch)
            elif positions != [_PLACEHOLDER]:
                self.discarded_batches += 1
                if self._state is not None and self._state.rolls_back:
                    self._state.restart_due = True
                    return None
        return out

    def _start(self) -> Any:
        kind = _StatefulPositionDataset if self._state is not None and self._state.rolls_back else _PositionDataset
        dataset = kind(self.dataset, self.sampler.dataset_len, self.sampler.seed)
        plan, collate = _PlanSampler(self._plan), _PositionCollate(self.collate_fn)
        if self._state is not None:
            return self._state.start(dataset, plan, collate, self.timeout_s)
        loader = torch.utils.data.DataLoader(
            dataset,
            batch_sampler=plan,
            num_workers=self.num_workers,
            collate_fn=collate,
            timeout=self.timeout_s,
            multiprocessing_context=forkserver_context(),
            worker_init_fn=_die_with_parent,
            # Worker seeds from a generator of its own: the global one is training state (rng_state.py).
            generator=torch.Generator().manual_seed(self.sampler.seed),
        )
        return iter(loader)

    def _restart(self) -> None:
        """Drop the running workers and the plan they were reading; the next load starts new ones."""
        self._iterator = None
        self._plan.clear()
        self._predicted = []

    def close(self) -> None:
        self._iterator = None
        if self._state is not None:
            self._state.live = None


_PLACEHOLDER = -1


class _PlanSampler:
    """Yields planned micro-batches of positions, or a placeholder when none is planned.

    Stateful (torchdata's protocol) with no state: the plan comes from the replicated cursor,
    and a StatefulDataLoader restoring a sampler without ``state_dict`` would fast-forward it
    by the batches it had yielded, eating the plan."""

    def __init__(self, plan: collections.deque[list[int]]) -> None:
        self._plan = plan

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass

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

    def _index(self, position: int) -> int:
        epoch, offset = divmod(position, self.dataset_len)
        return int(cached_epoch_permutation(epoch, self.dataset_len, self.seed)[offset])

    def __getitem__(self, position: int) -> tuple[int, Any]:
        if position == _PLACEHOLDER:
            return position, None
        return position, self.dataset[self._index(position)]

    def __getitems__(self, positions: list[int]) -> list[tuple[int, Any]]:
        """A batch at once, through the dataset's own batched read where it has one (a
        ``datasets.Dataset`` reads one Arrow slice instead of a row at a time)."""
        getitems = getattr(self.dataset, "__getitems__", None)
        if positions == [_PLACEHOLDER] or getitems is None:
            return [self[p] for p in positions]
        return list(zip(positions, getitems([self._index(p) for p in positions]), strict=True))


class _StatefulPositionDataset(_PositionDataset):
    """A ``_PositionDataset`` over a torchdata ``Stateful`` dataset, so each worker's copy of
    its state reaches StatefulDataLoader's snapshot (which asks the dataset it was given)."""

    def state_dict(self) -> dict[str, Any]:
        return self.dataset.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.dataset.load_state_dict(state)


class _PositionCollate:
    def __init__(self, collate: Any) -> None:
        self.collate = collate

    def __call__(self, items: list[tuple[int, Any]]) -> tuple[list[int], Any]:
        positions = [p for p, _ in items]
        if positions == [_PLACEHOLDER]:
            return positions, None
        return positions, self.collate([item for _, item in items])


def forkserver_context() -> multiprocessing.context.BaseContext:
    """Where DataLoader workers start: this process runs gRPC threads, which make a plain
    ``fork()`` unsafe, and the forkserver dies with it (replicaft/process/_forkserver.py). It
    imports torch once, so that each worker forks with it imported (stateful.py starts workers
    again to roll them back: its test of 8 worker starts took 21.7 s without, 16.6 s with, on
    the 2-core host)."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["replicaft.process._forkserver", "torch"])
    return ctx


def _die_with_parent(worker_id: int) -> None:
    """Workers are children of the forkserver, which dies with this process (even by SIGKILL,
    see replicaft/process/_forkserver.py); without this they would outlive a killed group."""
    die_with_parent(exit_if_orphaned=True)
