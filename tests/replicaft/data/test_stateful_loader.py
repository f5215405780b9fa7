"""A user's StatefulDataLoader under exactly-once (replicaft/data/stateful.py), in this process.

The manager is a stand-in that records registrations and runs the hooks at step boundaries as
the step driver does, so each test decides which steps commit, abort or change membership; the
loader is real (torchdata's StatefulDataLoader, real forkserver worker processes, a real
Hugging Face ``datasets.Dataset``). What a step trained on is read off an ``id`` column.
"""

from __future__ import annotations

import multiprocessing
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import datasets
import pytest
import torch
from support.counting_dataset import CountingDataset
from torchdata.stateful_dataloader import StatefulDataLoader

from replicaft.data import ExactlyOnceSampler, StepDataLoader, sample_ids
from replicaft.errors import OptionsError
from replicaft.state.flat import flatten

N = 40
BATCH = 6


@dataclass
class StandInManager:
    """Registrations, a step's plan, and the hooks run at commit and abort as the driver runs them."""

    contributors: list[str] = field(default_factory=lambda: ["g0", "g1"])
    replica_id: str = "g0"
    states: dict[str, tuple[Any, Any, bool]] = field(default_factory=dict)
    hooks: list[Any] = field(default_factory=list)
    annotations: dict[str, Any] = field(default_factory=dict)
    options: SimpleNamespace = field(
        default_factory=lambda: SimpleNamespace(deterministic=False, virtual_shards=0, group_rank=0, group_world_size=1)
    )

    def register_state(self, name: str, state_dict: Any, load_state_dict: Any, *, healed: bool = True) -> None:
        self.states[name] = (state_dict, load_state_dict, healed)

    def register_hooks(self, hooks: Any) -> None:
        self.hooks.append(hooks)

    def wait_quorum(self) -> SimpleNamespace:
        return SimpleNamespace(
            num_contributors=len(self.contributors),
            healing=False,
            replica_id=self.replica_id,
            donors=self.contributors,
        )

    def annotate_commit(self, **fields: Any) -> None:
        self.annotations.update(fields)

    def step(self, loader: StepDataLoader, *, commit: bool = True) -> list[int]:
        """One step: the ids this group trains on, then the commit's (or abort's) hooks."""
        for h in self.hooks:
            h.on_step_start()
        ids = [i for batch, _ in loader.micro_batches() for i in batch["id"].tolist()]
        for h in self.hooks:
            h.on_commit() if commit else h.on_abort()
        return ids


def hf_dataset() -> datasets.Dataset:
    return datasets.Dataset.from_dict({"id": list(range(N)), "x": [[float(i)] * 3 for i in range(N)]}).with_format(
        "torch"
    )


def make(dataset: Any, manager: StandInManager | None = None, **loader_args: Any) -> tuple[StandInManager, Any]:
    manager = manager or StandInManager()
    sampler = ExactlyOnceSampler(manager, N, BATCH, seed=7)  # type: ignore[arg-type]
    loader_args.setdefault("batch_size", BATCH)
    return manager, StepDataLoader.from_loader(sampler, StatefulDataLoader(dataset, **loader_args))


def share_ids(step_start: int, rank: int, contributors: int) -> list[int]:
    start = step_start + rank * BATCH
    return sample_ids(start, start + BATCH, N, seed=7)


def worker_loads(manager: StandInManager) -> int:
    """Samples loaded by all worker copies of the dataset, as the committed loader state says."""
    snapshot = manager.states["data_loader"][0]()["loader"]["_snapshot"]["_worker_snapshots"]
    return sum(w["dataset_state"]["loaded"] for w in snapshot.values())


@pytest.mark.timeout(90)
def test_hf_dataset_through_workers_trains_each_share_once_across_abort_and_membership_change() -> None:
    manager, loader = make(hf_dataset(), num_workers=2, prefetch_factor=1, shuffle=True)
    rng_before = torch.get_rng_state()
    assert manager.step(loader) == share_ids(0, 0, 2)
    assert torch.equal(torch.get_rng_state(), rng_before), "starting workers drew from torch's global generator"
    assert manager.step(loader, commit=False) == share_ids(12, 0, 2), "the predicted share, prefetched"
    assert manager.step(loader) == share_ids(12, 0, 2), "an aborted step's samples come again"
    manager.contributors = ["g1", "g0"]  # membership changed: the prefetched prediction is stale
    assert manager.step(loader) == share_ids(24, 1, 2)
    assert loader.discarded_batches == 2, "the abort's and the membership change's predictions"
    assert manager.annotations["samples"] == [24, 36]
    assert batch_x_is_hf_rows(loader)
    loader.close()


def batch_x_is_hf_rows(loader: StepDataLoader) -> bool:
    ((batch, weight),) = loader.micro_batches()
    return weight == 1.0 and batch["x"].shape == (BATCH, 3) and torch.equal(batch["x"][:, 0], batch["id"].float())


@pytest.mark.timeout(90)
def test_stateful_dataset_state_is_that_of_committed_steps_only_and_a_checkpoint_restores_it() -> None:
    manager, loader = make(CountingDataset(N), num_workers=2, prefetch_factor=1)
    manager.step(loader)
    manager.step(loader, commit=False)  # loaded, then rolled back
    manager.step(loader)
    manager.contributors = ["g1", "g0"]  # the prefetched prediction is loaded, discarded, rolled back
    manager.step(loader)
    assert worker_loads(manager) == 3 * BATCH, "only the three committed shares count"
    saved = manager.states["data_loader"][0]()
    assert saved["num_workers"] == 2 and manager.states["data_loader"][2] is False, "this group's own, not healed"
    flatten({"data_loader": saved})  # plain values and tensors only: a checkpoint can carry it
    loader.close()

    resumed, again = make(CountingDataset(N), num_workers=2, prefetch_factor=1)
    resumed.states["data_loader"][1](saved)
    resumed.states["data_cursor"][1](manager.states["data_cursor"][0]())
    resumed.contributors = ["g1", "g0"]
    assert resumed.step(again) == share_ids(36, 1, 2), "the plan is not fast-forwarded on restore"
    assert worker_loads(resumed) == 4 * BATCH
    again.close()


def test_loader_state_from_another_worker_count_is_refused_for_a_stateful_dataset_only() -> None:
    manager, _ = make(CountingDataset(N))
    with pytest.raises(OptionsError, match="num_workers=2; this run has num_workers=0"):
        manager.states["data_loader"][1]({"num_workers": 2, "loader": {"_snapshot": {}}})
    manager, _ = make(hf_dataset())  # its loader state is seeds and counters: dropped, not refused
    manager.states["data_loader"][1]({"num_workers": 2, "loader": {"_snapshot": {}}})
    assert manager.states["data_loader"][0]() == {"num_workers": 0, "loader": {}}


def test_without_workers_the_dataset_state_lives_here_and_is_rolled_back() -> None:
    dataset = CountingDataset(N)
    manager, loader = make(dataset)
    assert manager.step(loader) == share_ids(0, 0, 2)
    manager.step(loader, commit=False)
    assert manager.step(loader) == share_ids(12, 0, 2)
    assert manager.states["data_loader"][0]()["loader"]["dataset_state"] == {"loaded": 2 * BATCH}


class Stream(torch.utils.data.IterableDataset):
    def __iter__(self) -> Any:
        return iter(range(N))


def counting() -> CountingDataset:
    return CountingDataset(N)


REFUSED: list[tuple[str, Any, dict[str, Any], str]] = [
    ("hf-iterable", lambda: hf_dataset().to_iterable_dataset(), {}, "iterable-style datasets.iterable_dataset"),
    ("torch-iterable", Stream, {}, "without streaming=True"),
    ("sampler", counting, {"sampler": torch.utils.data.SubsetRandomSampler(range(N))}, "sampler=torch.utils"),
    ("replacement", counting, {"sampler": torch.utils.data.RandomSampler(range(N), replacement=True)}, "sampler="),
    ("drop-last", counting, {"drop_last": True}, "drop_last=True"),
    ("no-batching", counting, {"batch_size": None}, "batch_size=None"),
    ("out-of-order", counting, {"num_workers": 1, "in_order": False}, "in_order=False"),
    ("snapshots", counting, {"snapshot_every_n_steps": 4}, "snapshot_every_n_steps=4"),
    ("fork", counting, {"num_workers": 1, "multiprocessing_context": "fork"}, "gRPC threads"),
]


@pytest.mark.parametrize(("dataset", "args", "message"), [r[1:] for r in REFUSED], ids=[r[0] for r in REFUSED])
def test_loader_that_exactly_once_cannot_honour_is_refused_saying_why(
    dataset: Any, args: dict[str, Any], message: str
) -> None:
    with pytest.raises(OptionsError, match=message.replace("(", r"\(")):
        make(dataset(), **args)


def test_batch_sampler_and_plain_loader_and_wrong_length_are_refused() -> None:
    manager = StandInManager()
    sampler = ExactlyOnceSampler(manager, N, BATCH)  # type: ignore[arg-type]
    batches = torch.utils.data.BatchSampler(torch.utils.data.SequentialSampler(range(N)), BATCH, False)
    with pytest.raises(OptionsError, match="batch_sampler=torch.utils.data.sampler.BatchSampler"):
        StepDataLoader.from_loader(sampler, StatefulDataLoader(CountingDataset(N), batch_sampler=batches))
    with pytest.raises(OptionsError, match="torch.utils.data.dataloader.DataLoader; pass a torchdata"):
        StepDataLoader.from_loader(sampler, torch.utils.data.DataLoader(CountingDataset(N)))
    with pytest.raises(OptionsError, match="holds 10 samples but the ExactlyOnceSampler was made with dataset_len=40"):
        StepDataLoader.from_loader(sampler, StatefulDataLoader(range(10)))


def test_spawn_context_is_kept_and_an_unset_one_is_forkserver() -> None:
    from replicaft.data.stateful import loader_settings

    sampler = ExactlyOnceSampler(StandInManager(), N, BATCH)  # type: ignore[arg-type]
    spawn = loader_settings(
        sampler, StatefulDataLoader(CountingDataset(N), num_workers=1, multiprocessing_context="spawn")
    )
    assert spawn.options["multiprocessing_context"].get_start_method() == "spawn"
    unset = loader_settings(sampler, StatefulDataLoader(CountingDataset(N), num_workers=1))
    assert unset.options["multiprocessing_context"] is multiprocessing.get_context("forkserver")


def test_deterministic_mode_needs_the_loader_batch_to_be_one_virtual_shard() -> None:
    manager = StandInManager()
    manager.options.deterministic, manager.options.virtual_shards = True, 2
    sampler = ExactlyOnceSampler(manager, N, 12, policy="global")  # type: ignore[arg-type]
    with pytest.raises(OptionsError, match="batch_size=4 with deterministic=True.*make the loader with batch_size=6"):
        StepDataLoader.from_loader(sampler, StatefulDataLoader(CountingDataset(N), batch_size=4))
    assert (
        StepDataLoader.from_loader(sampler, StatefulDataLoader(CountingDataset(N), batch_size=6)).micro_batch_size == 6
    )
