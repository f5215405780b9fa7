"""A user's ``torchdata`` ``StatefulDataLoader`` under exactly-once: their loader's settings, the cursor's positions.

``StepDataLoader.from_loader(sampler, loader)`` takes the loader a user already has (its
dataset, ``batch_size``, ``collate_fn``, ``num_workers``, ``prefetch_factor``, ``pin_memory``,
``persistent_workers``, ``worker_init_fn``, ``generator``) and drives a ``StatefulDataLoader``
with those settings whose batch sampler is replicaft's plan: the positions still come from
the exactly-once cursor (sampler.py), never from a sampler of the loader. ``batch_size`` is
the micro-batch: a rank's share of a step larger than it is split for gradient accumulation.

What is refused, and why (an ``OptionsError`` at ``from_loader``): what exactly-once cannot
read by position (map_style.py: an iterable-style dataset, such as a ``datasets.IterableDataset``
or an ``IterDataPipe``; a ``sampler`` or ``batch_sampler`` of the user's; ``shuffle`` is
accepted: the order is the cursor's seeded per-epoch permutation either way); ``drop_last=True``
(exactly-once drops nothing; batches span epochs); ``in_order=False`` and
``snapshot_every_n_steps`` other than 1 (the loader's state would not be that of the
batches received); a ``fork`` multiprocessing context (this process runs gRPC threads).

**The loader's state** (``StatefulDataLoader.state_dict()``: the workers' dataset state, for
a dataset implementing torchdata's ``Stateful``, and the seeds) is registered with the manager
as it was at the last committed step: :class:`LoaderState` snapshots it when a step commits.
StatefulDataLoader's snapshot counts the batches it yielded, so the next step's batches the
workers are prefetching are not in it. With a ``Stateful`` dataset, workers that loaded
anything that did not commit (an aborted step's batches, a stale prediction a membership
change made the loader discard) are started again from the committed state, so an aborted
step leaves no trace in them either; without one the state is seeds and counters, and the
workers keep running.

It is each group's own state (``register_state(..., healed=False)``, as DiLoCo's inner
optimizer): checkpoints carry it, heals do not. Groups load different shares, so their
workers' dataset states differ by design and two donors would never agree on one (a heal
believes only the state a majority of donors serves); a healer keeps its own loader (a
restarted group, a fresh one). What exactly-once needs across a heal, the data position, is
the cursor, which is replicated and healed. A resume from a checkpoint gives every group the
writing group's loader state; one saved with another ``num_workers`` is refused for a
``Stateful`` dataset (StatefulDataLoader restores worker states one for one) and otherwise
dropped with a warning (it then holds only seeds and counters).

The workers' seeds come from ``generator`` (a private one seeded with the sampler's seed when
the loader has none), so that starting them draws nothing from torch's global generator,
which the manager carries as training state and which must advance alike in every group.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import BatchSampler, RandomSampler
from torchdata.stateful_dataloader import Stateful, StatefulDataLoader
from torchdata.stateful_dataloader import sampler as stateful_sampler

from replicaft.data.loader import forkserver_context
from replicaft.data.map_style import check_map_style, type_name
from replicaft.data.sampler import ExactlyOnceSampler
from replicaft.deterministic.rules import check_shards
from replicaft.errors import OptionsError
from replicaft.manager import Manager
from replicaft.process.process_tree import die_with_parent
from replicaft.state.registry import StepHooks

logger = logging.getLogger(__name__)

WHERE = "StepDataLoader.from_loader"


@dataclass(frozen=True, slots=True)
class LoaderSettings:
    """What replicaft keeps of a user's loader, checked."""

    dataset: Any
    batch_size: int
    num_workers: int
    collate_fn: Callable[[list[Any]], Any]
    stateful_dataset: bool
    """The dataset implements torchdata's ``Stateful``: its workers' copies hold state to roll back."""
    options: dict[str, Any]
    """The other ``StatefulDataLoader`` arguments kept (pinning; with workers: prefetch, init, context)."""
    generator: torch.Generator


def loader_settings(sampler: ExactlyOnceSampler, loader: Any) -> LoaderSettings:
    """The settings of ``loader`` that replicaft keeps; ``OptionsError`` naming what cannot be kept and why."""
    if not isinstance(loader, StatefulDataLoader):
        raise OptionsError(
            f"{WHERE}: loader is a {type_name(loader)}; pass a torchdata.stateful_dataloader.StatefulDataLoader, "
            "or hand a plain dataset to StepDataLoader(sampler, dataset, ...)"
        )
    check_map_style(
        loader,
        where=WHERE,
        loader_name="the loader",
        random_samplers=(RandomSampler, stateful_sampler.RandomSampler),
        batch_samplers=(BatchSampler, stateful_sampler.BatchSampler),
    )
    dataset = loader.dataset
    if len(dataset) != sampler.dataset_len:
        raise OptionsError(
            f"{WHERE}: the loader's dataset holds {len(dataset)} samples but the ExactlyOnceSampler was made "
            f"with dataset_len={sampler.dataset_len}; make it with len(dataset)"
        )
    if loader.drop_last:
        raise OptionsError(
            f"{WHERE}: drop_last=True: exactly-once trains every sample, and batches span epoch boundaries, "
            "so there is no short last batch to drop; leave drop_last=False"
        )
    if loader.batch_size is None:
        raise OptionsError(
            f"{WHERE}: the loader has batch_size=None (no batching); set batch_size: it is the micro-batch "
            "replicaft loads (a rank's share of a step larger than it is split for gradient accumulation)"
        )
    if not loader.in_order:
        raise OptionsError(
            f"{WHERE}: in_order=False: batches would arrive out of order, and StatefulDataLoader's state "
            "would not be that of the batches received; leave in_order=True"
        )
    if loader.snapshot_every_n_steps != 1:
        raise OptionsError(
            f"{WHERE}: snapshot_every_n_steps={loader.snapshot_every_n_steps}: the loader's state must be "
            "that of the batches of the last committed step, so it is snapshotted with every batch; "
            "leave snapshot_every_n_steps=1"
        )
    if sampler.deterministic:
        shard_size = check_shards(sampler.batch_size, sampler.num_shards)
        if loader.batch_size != shard_size:
            raise OptionsError(
                f"{WHERE}: the loader's batch_size={loader.batch_size} with deterministic=True: each "
                f"micro-batch is one virtual shard ({sampler.batch_size} / {sampler.num_shards} = "
                f"{shard_size} samples); make the loader with batch_size={shard_size}"
            )
    return LoaderSettings(
        dataset=dataset,
        batch_size=loader.batch_size,
        num_workers=loader.num_workers,
        collate_fn=loader.collate_fn,
        stateful_dataset=isinstance(dataset, Stateful),
        options=_options(loader),
        generator=loader.generator or torch.Generator().manual_seed(sampler.seed),
    )


def _options(loader: StatefulDataLoader) -> dict[str, Any]:
    pinning = {"pin_memory": loader.pin_memory, "pin_memory_device": loader.pin_memory_device}
    if not loader.num_workers:
        return pinning
    ctx = loader.multiprocessing_context
    method = ctx.get_start_method() if ctx is not None else "forkserver"
    if method == "fork":
        raise OptionsError(
            f"{WHERE}: multiprocessing_context='fork': this process runs gRPC threads, which make fork() "
            "unsafe in its children; leave it unset (replicaft starts workers with forkserver) or use 'spawn'"
        )
    return {
        **pinning,
        "prefetch_factor": loader.prefetch_factor,
        "persistent_workers": loader.persistent_workers,
        "timeout": loader.timeout,
        "worker_init_fn": _WorkerInit(loader.worker_init_fn),
        "multiprocessing_context": forkserver_context() if method == "forkserver" else ctx,
    }


class _WorkerInit:
    """Workers die with their parent (else they outlive a SIGKILLed group), then the user's init runs."""

    def __init__(self, user_fn: Callable[[int], None] | None) -> None:
        self.user_fn = user_fn

    def __call__(self, worker_id: int) -> None:
        die_with_parent(exit_if_orphaned=True)
        if self.user_fn is not None:
            self.user_fn(worker_id)


class LoaderState(StepHooks):
    """The ``StatefulDataLoader``'s state as of the last committed step, registered as this group's own.

    ``live`` is the running loader (the step loader sets it when it starts one). ``restart_due``
    tells the step loader to start its workers again from :attr:`committed` before it loads:
    after a step aborted (with a ``Stateful`` dataset), after a stale batch was discarded (the
    step loader sets it then), or after a checkpoint's state was loaded.
    """

    def __init__(self, manager: Manager, settings: LoaderSettings, state_name: str) -> None:
        self.settings = settings
        self.committed: dict[str, Any] = {}
        """``StatefulDataLoader.state_dict()`` at the last commit; empty: a fresh loader."""
        self.live: StatefulDataLoader | None = None
        self.restart_due = False
        manager.register_state(state_name, self.state_dict, self.load_state_dict, healed=False)
        manager.register_hooks(self)

    @property
    def rolls_back(self) -> bool:
        """Whether a load that did not commit must be undone (only a ``Stateful`` dataset keeps a trace of one)."""
        return self.settings.stateful_dataset

    def start(self, dataset: Any, batch_sampler: Any, collate_fn: Any, timeout_s: float) -> Any:
        """A new ``StatefulDataLoader`` over the plan, from the committed state; returns its iterator."""
        s = self.settings
        options = dict(s.options)
        if s.num_workers:
            options["timeout"] = options["timeout"] or timeout_s  # every wait has a deadline
        loader = StatefulDataLoader(
            dataset,
            batch_sampler=batch_sampler,
            num_workers=s.num_workers,
            collate_fn=collate_fn,
            generator=s.generator,
            **options,
        )
        if self.committed:
            loader.load_state_dict(self.committed)
        self.live = loader
        self.restart_due = False
        return iter(loader)

    def on_commit(self) -> None:
        if self.live is not None:
            # A copy: the loader updates its snapshot's worker states in place.
            self.committed = copy.deepcopy(self.live.state_dict())

    def on_abort(self) -> None:
        if self.rolls_back and self.live is not None:
            self.restart_due = True

    def state_dict(self) -> dict[str, Any]:
        return {"num_workers": self.settings.num_workers, "loader": self.committed}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state["num_workers"] != self.settings.num_workers:
            if not self.rolls_back:
                logger.warning(
                    "data loader state from a run with num_workers=%d; this run has num_workers=%d, and its "
                    "dataset keeps no state (not torchdata-Stateful): the loader starts afresh (the data "
                    "position is the cursor's, loaded)",
                    state["num_workers"],
                    self.settings.num_workers,
                )
                return
            raise OptionsError(
                f"data loader state from a run with num_workers={state['num_workers']}; this run has "
                f"num_workers={self.settings.num_workers}, and StatefulDataLoader restores its workers' "
                "states one for one; make the loader with the saved run's num_workers"
            )
        self.committed = state["loader"]
        self.restart_due = True
