"""The layout and size of a save, planned from the snapshot before any I/O
(replicaft/checkpoint/saveplan.py): pure, so a table over group widths and shardings."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from replicaft.checkpoint.saveplan import CHUNK_OVERHEAD_BYTES, new_chunk_bytes, plan_save
from replicaft.state.flat import Sharding, flatten
from replicaft.transfer.snapshot import Snapshot


def snapshot(sharded: bool) -> Snapshot:
    state = {"weight": torch.zeros(4, 4), "running_mean": torch.zeros(4)}
    taken = Snapshot.capture(flatten(state), step=1, quorum_id=1, replica_id="g0", with_checksums=False)
    if not sharded:
        return taken
    names = [t.name for t in taken.manifest.tensors]
    # The weight is this rank's half of an (8, 4) tensor; the statistics are a plain tensor.
    shardings = tuple(Sharding(None, (), torch.Size([8, 4]), (4, 1)) if n.endswith("weight") else None for n in names)
    return dataclasses.replace(taken, shardings=shardings)


@pytest.mark.parametrize(
    ("sharded", "world_size", "own_ranks", "weight_shape", "mean_own", "bytes_factor"),
    [
        (False, 1, 0, (4, 4), False, 1),  # replicated state: written once, whatever the width
        (False, 4, 0, (4, 4), False, 1),
        (True, 1, 0, (8, 4), False, 1),  # one rank holds every shard: nothing of its own
        (True, 2, 2, (8, 4), True, 2),  # each rank its shards and its own plain tensors
    ],
)
def test_the_plan_follows_the_sharding_and_the_group_width(
    sharded: bool, world_size: int, own_ranks: int, weight_shape: tuple[int, ...], mean_own: bool, bytes_factor: int
) -> None:
    taken = snapshot(sharded)
    plan = plan_save(taken, world_size)
    saved = {t.name.rsplit(".", 1)[-1]: t for t in plan.layout.tensors}
    assert plan.layout.own_ranks == own_ranks
    assert saved["weight"].shape == weight_shape and not saved["weight"].own
    assert saved["running_mean"].own is mean_own
    assert len(plan.shardings) == len(plan.layout.tensors)
    single = plan_save(taken, 1).estimated_bytes
    assert plan.estimated_bytes >= taken.manifest.total_bytes * bytes_factor
    if bytes_factor > 1:
        assert plan.estimated_bytes > single


@pytest.mark.parametrize(("world_size", "num_copies"), [(1, 1), (2, 2)])
def test_a_new_chunk_two_tensors_share_counts_once_per_rank_that_may_write_it(world_size: int, num_copies: int) -> None:
    # With W > 1, DCP may hand the two replicated tensors to two ranks, and each writes the
    # chunk: counting it once would under-estimate.
    state = {"a": torch.ones(100), "b": torch.ones(100), "c": torch.zeros(100)}
    taken = Snapshot.capture(flatten(state), step=1, quorum_id=1, replica_id="g0", with_checksums=False)
    ids = [(b"one",), (b"one",), (b"zero",)]
    counted = new_chunk_bytes(
        plan_save(taken, world_size), taken, ids, {b"zero"}, rank=0, group_world_size=world_size, sealed=False
    )
    assert counted == num_copies * (400 + CHUNK_OVERHEAD_BYTES)
