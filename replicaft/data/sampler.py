"""Exactly-once data: every sample of a deterministic global order trains in exactly one committed step.

The global order is the concatenation of per-epoch permutations of ``range(dataset_len)``,
each a seeded shuffle, so a *position* ``p`` names sample ``perm(p // n)[p % n]`` and a batch
may span an epoch boundary (a dataset length not divisible by the batch is no special case).

The **cursor** (positions consumed by committed steps) is replicated training state: it is
registered with the manager, advances only when a step commits, travels with a heal and is
saved in checkpoints. Each step takes the next ``global_batch`` positions from the cursor and
splits them by contributor rank among the groups that contribute real gradients (donors);
healers take none (their gradient is replaced by zeros). Within a group of W ranks, a rank
takes its slice of the group's share (the FSDP/HSDP convention: ranks of a group see
different samples). An aborted step consumes nothing, so its positions are the first the next
quorum trains on. torchft's sampler, by contrast, shards by group count, so a dead group's
shard and a failed step's batches are silently skipped (study §7.4).

Two batch policies: ``per_group`` (each contributor takes ``batch_size``; the global batch
follows the quorum size) and ``global`` (``batch_size`` is the global batch, split as evenly
as possible; ``loss_scale`` corrects the gradient when shares are unequal, and a share larger
than ``micro_batch_size`` is split into micro-batches for gradient accumulation).

In the deterministic mode (``ManagerOptions.deterministic``, ``policy="global"`` only) a
group's share is the run of whole virtual shards it owns (deterministic.py), and each
micro-batch is exactly one shard, with loss weight 1.0: the DDP wrapper takes each backward as
one shard's gradient and divides the exact sum by the number of shards.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Literal

import torch

from replicaft.deterministic.rules import check_shards, shard_bounds, step_shards
from replicaft.errors import OptionsError
from replicaft.manager import Manager
from replicaft.state.registry import StepHooks

BatchPolicy = Literal["per_group", "global"]


@dataclass(frozen=True, slots=True)
class Share:
    """What one rank trains on in one step: a range of global positions."""

    step_start: int
    """The cursor at the step's start; the step covers [step_start, step_stop)."""
    step_stop: int
    start: int
    stop: int
    loss_scale: float
    """Multiply the mean loss over this share by this, so the averaged gradient is the mean over
    every sample of the step (1.0 unless global-batch shares are unequal)."""

    @property
    def num_samples(self) -> int:
        return self.stop - self.start


def assign_share(
    cursor: int,
    *,
    batch_size: int,
    policy: BatchPolicy,
    num_contributors: int,
    contributor_rank: int | None,
    group_rank: int = 0,
    group_world_size: int = 1,
) -> Share:
    """This rank's positions for the step starting at ``cursor`` (pure)."""
    if num_contributors < 1:
        raise ValueError(f"num_contributors={num_contributors}; a step needs at least one")
    total = batch_size * num_contributors if policy == "per_group" else batch_size
    if contributor_rank is None:
        return Share(cursor, cursor + total, cursor, cursor, 0.0)
    base, extra = divmod(total, num_contributors)
    g_start = cursor + contributor_rank * base + min(contributor_rank, extra)
    g_size = base + (1 if contributor_rank < extra else 0)
    r_base, r_extra = divmod(g_size, group_world_size)
    start = g_start + group_rank * r_base + min(group_rank, r_extra)
    size = r_base + (1 if group_rank < r_extra else 0)
    mean_share = total / (num_contributors * group_world_size)
    scale = size / mean_share if mean_share else 0.0
    return Share(cursor, cursor + total, start, start + size, scale)


def shard_share(cursor: int, *, batch_size: int, num_shards: int, shards: range) -> Share:
    """The positions of ``shards`` (virtual shards owned by one group) of the step at ``cursor``
    (pure): contiguous, since a group owns a contiguous run; none for a group that owns none.
    ``loss_scale`` is the number of shards, as the sum of their gradients is divided by the
    number of all shards, not of contributors."""
    if not shards:
        return Share(cursor, cursor + batch_size, cursor, cursor, 0.0)
    start, _ = shard_bounds(cursor, batch_size, num_shards, shards[0])
    _, stop = shard_bounds(cursor, batch_size, num_shards, shards[-1])
    return Share(cursor, cursor + batch_size, start, stop, float(len(shards)))


def epoch_permutation(epoch: int, dataset_len: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    return torch.randperm(dataset_len, generator=g)


@functools.lru_cache(maxsize=4)
def cached_epoch_permutation(epoch: int, dataset_len: int, seed: int) -> torch.Tensor:
    """``epoch_permutation``, kept for the epochs in use: a step reads one or two, and drawing
    a permutation of 10,000 took a fifth of the data's time in a Lightning step. Shared: read
    it, never write it."""
    return epoch_permutation(epoch, dataset_len, seed)


def sample_ids(start: int, stop: int, dataset_len: int, seed: int) -> list[int]:
    """Dataset indices at global positions [start, stop)."""
    ids: list[int] = []
    position = start
    while position < stop:
        epoch, offset = divmod(position, dataset_len)
        take = min(stop - position, dataset_len - offset)
        ids += cached_epoch_permutation(epoch, dataset_len, seed)[offset : offset + take].tolist()
        position += take
    return ids


class ExactlyOnceSampler(StepHooks):
    """Per-step indices for this rank, with the cursor kept in the manager's replicated state.

    Call :meth:`step_indices` after ``zero_grad()`` (it waits for the step's quorum); load
    those samples (through a DataLoader or directly) and train on them; the cursor advances
    when the step commits.
    """

    def __init__(
        self,
        manager: Manager,
        dataset_len: int,
        batch_size: int,
        *,
        policy: BatchPolicy = "per_group",
        seed: int = 0,
        state_name: str = "data_cursor",
    ) -> None:
        if dataset_len < 1 or batch_size < 1:
            raise OptionsError(f"dataset_len={dataset_len} and batch_size={batch_size} must both be at least 1")
        if policy not in ("per_group", "global"):
            raise OptionsError(f"policy={policy!r}; use 'per_group' or 'global'")
        self.deterministic = manager.options.deterministic
        self.num_shards = manager.options.virtual_shards
        if self.deterministic:
            if policy != "global":
                raise OptionsError(
                    f"policy={policy!r} with deterministic=True: the deterministic mode cuts a fixed "
                    "global batch into virtual shards; use policy='global' (batch_size is then the "
                    "global batch)"
                )
            check_shards(batch_size, self.num_shards)
        self.manager = manager
        self.dataset_len = dataset_len
        self.batch_size = batch_size
        self.policy = policy
        self.seed = seed
        self.cursor = 0
        self._share: Share | None = None
        manager.register_state(state_name, self.state_dict, self.load_state_dict)
        manager.register_hooks(self)

    @property
    def epoch(self) -> int:
        return self.cursor // self.dataset_len

    def share(self) -> Share:
        """This rank's share of the current step (blocks until the quorum is known)."""
        if self._share is None and self.deterministic:
            shards = step_shards(self.manager.wait_quorum(), self.num_shards)
            self._share = shard_share(
                self.cursor, batch_size=self.batch_size, num_shards=self.num_shards, shards=shards
            )
        if self._share is None:
            plan = self.manager.wait_quorum()
            num = plan.num_contributors if plan is not None else 1
            rank = None
            if plan is not None and not plan.healing and plan.replica_id in plan.donors:
                rank = plan.donors.index(plan.replica_id)
            o = self.manager.options
            self._share = assign_share(
                self.cursor,
                batch_size=self.batch_size,
                policy=self.policy,
                num_contributors=num,
                contributor_rank=rank,
                group_rank=o.group_rank,
                group_world_size=o.group_world_size,
            )
        return self._share

    def step_indices(self) -> list[int]:
        s = self.share()
        return sample_ids(s.start, s.stop, self.dataset_len, self.seed)

    def on_step_start(self) -> None:
        self._share = None

    def on_commit(self) -> None:
        share = self.share()
        self.manager.annotate_commit(samples=[share.step_start, share.step_stop])
        self.cursor = share.step_stop
        self._share = None

    def on_abort(self) -> None:
        self._share = None

    def capture_step(self) -> int:
        """How far this step moves the cursor (a healer's own cursor is stale; the advance is not)."""
        share = self.share()
        return share.step_stop - share.step_start

    def replay_apply(self, record: int) -> None:
        self.cursor += record
        self._share = None

    def state_dict(self) -> dict[str, Any]:
        return {"cursor": self.cursor, "dataset_len": self.dataset_len, "seed": self.seed}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state["dataset_len"] != self.dataset_len or state["seed"] != self.seed:
            raise OptionsError(
                f"data cursor from a run with dataset_len={state['dataset_len']} seed={state['seed']}; "
                f"this run has dataset_len={self.dataset_len} seed={self.seed}"
            )
        self.cursor = int(state["cursor"])
        self._share = None
