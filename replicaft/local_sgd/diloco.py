"""DiLoCo and streaming DiLoCo on replicaft's quorum, commit and heal: a sync is a manager step.

Each group trains alone for the inner steps of a round with its own (inner) optimizer; at a
sync, the fragment's pseudo-gradient (synced copy minus parameters) is averaged across the
quorum and an outer optimizer applies it to the synced copy (DiLoCo, arXiv 2311.08105). With
several fragments, one syncs every ``sync_every / F`` inner steps and its all-reduce may run
under the next ``fragment_sync_delay`` inner steps (streaming DiLoCo, arXiv 2501.18512).

Fault tolerance is the manager's, at sync points:

* **Quorum and commit per sync.** ``start_quorum`` at the sync's start, the pseudo-gradient
  through ``Manager.allreduce``, ``should_commit`` at its end. A sync that does not commit is
  not applied, and is **retried at once** with a new quorum (the survivors' pseudo-gradients
  are still valid: no inner step is lost), where torchft throws the round away.
* **Heal.** The replicated state (each fragment's synced copy, the outer optimizers, the data
  leases) is registered with the manager; this group's inner optimizer too, as its own
  (``healed=False``: checkpointed, never served, since groups' inner states differ by design and
  two donors would never agree on them; a restarted group starts it afresh). A restarted group
  joins by syncing at once (``join``): it waits in the quorum for the others' next sync,
  contributes zeros to it, records it (``capture_step``), and only then fetches their state
  (``fetch_beside_collectives = False``: the sync's all-reduce and the fetch would share its
  link, and the donors would wait for both); at the sync after, it applies the state, replays
  the recorded sync (catchup.py) and leaves with the synced weights. The fragment schedule is
  a function of the manager's step (schedule.py), which travels too.
* **Exactly-once data** through leases (leases.py): a round's samples are leased at the sync
  before it and consumed by the sync after it only if the group contributed.
* **No stall.** A group that falls behind mid-round misses the quorum (the lighthouse's join
  timeout, or its heartbeat deadline if it is stopped); the others commit without it, and it
  heals at their next sync. A healer waits in the commit vote while the donors run the
  ``fragment_sync_delay`` inner steps of an overlapped sync: those steps must take less than
  ``collective_timeout_s``.
* **Sync digests.** With events on, each commit of a group that did not heal carries
  ``sync_digest``, the digest of the replicated state entering the sync: equal across groups
  at every sync point (chaos/invariants.py). The manager's own per-step digest covers the
  inner optimizer too, which differs per group by design, so runs that check invariants set
  ``digest_every_steps=0`` (REPLICAFT_DIGEST_EVERY_STEPS=0).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from lighthouse.rules.plan import StepPlan
from replicaft.data.sampler import sample_ids
from replicaft.errors import GroupError, OptionsError, StateError
from replicaft.local_sgd import leases as lease_rules
from replicaft.local_sgd.fragment import Fragment
from replicaft.local_sgd.leases import Leases
from replicaft.local_sgd.reduce import PendingReduce, finish_reduce, start_reduce
from replicaft.local_sgd.schedule import SyncSchedule
from replicaft.local_sgd.wire import Wire, check_wire
from replicaft.manager import Manager
from replicaft.state.flat import flatten, step_digest
from replicaft.state.registry import StepHooks
from replicaft.wrappers.fsdp import shard_optimizer_state

logger = logging.getLogger(__name__)


@dataclass
class _Sync:
    plan: StepPlan | None
    fragment: int | None
    pending: PendingReduce | None


@dataclass(frozen=True, slots=True)
class _Record:
    """What a committed sync did to the replicated state, for a healer's replay."""

    fragment: int | None
    average: torch.Tensor | None
    participants: tuple[str, ...]
    contributors: tuple[str, ...]


class DiLoCo(StepHooks):
    """Semi-synchronous training on ``manager``; use as a context manager around the loop.

    Entering joins the job (a first, blocking sync) and hooks ``inner_optimizer.step()``:
    every inner step counts, and the step that completes a round syncs. ``batch_indices()``
    gives the dataset indices of this group's next inner step when ``dataset_len`` and
    ``batch_size`` are set.
    """

    fetch_beside_collectives = False
    """A healer fetches after its sync's all-reduce, not beside it (registry.py): the all-reduce
    passes the whole model through the healer's link too, and the donors waited for both."""

    def __init__(
        self,
        manager: Manager,
        model_fragments: nn.Module | Sequence[nn.Module],
        inner_optimizer: torch.optim.Optimizer,
        outer_optimizer: torch.optim.Optimizer | Sequence[torch.optim.Optimizer],
        sync_every: int,
        *,
        fragment_sync_delay: int = 0,
        fragment_update_alpha: float = 0.0,
        wire: Wire = "fp32",
        dataset_len: int | None = None,
        batch_size: int | None = None,
        data_seed: int = 0,
        digest_syncs: bool | None = None,
        join_on_enter: bool = True,
        state_name: str = "diloco",
    ) -> None:
        modules = [model_fragments] if isinstance(model_fragments, nn.Module) else list(model_fragments)
        outers = list(outer_optimizer) if isinstance(outer_optimizer, Sequence) else [outer_optimizer] * len(modules)
        if len(outers) != len(modules):
            raise OptionsError(
                f"{len(outers)} outer optimizers for {len(modules)} model fragments; pass one, or one per fragment"
            )
        if not 0.0 <= fragment_update_alpha <= 1.0:
            raise OptionsError(
                f"fragment_update_alpha={fragment_update_alpha}; it mixes local into global weights, so 0 <= alpha <= 1"
            )
        if (dataset_len is None) != (batch_size is None) or (
            batch_size is not None and (batch_size < 1 or dataset_len < 1)
        ):  # type: ignore[operator]
            raise OptionsError(
                f"dataset_len={dataset_len}, batch_size={batch_size}: set both (>= 1) for exactly-once data, or neither"
            )
        self.manager = manager
        self.schedule = SyncSchedule(sync_every, len(modules), fragment_sync_delay)
        self.fragments = [Fragment(i, m, o) for i, (m, o) in enumerate(zip(modules, outers, strict=True))]
        self.inner = inner_optimizer
        self.alpha = fragment_update_alpha
        self.wire = check_wire(wire)
        self.dataset_len = dataset_len
        self.batch_size = batch_size or 0
        self.data_seed = data_seed
        self.digest_syncs = manager.options.events_dir is not None if digest_syncs is None else digest_syncs
        self.leases = Leases()
        self.local_step = 0
        """Inner steps since the last committed sync."""
        self.syncs_retried = 0
        self._losses: list[float] = []
        self._outers = list({id(o): o for o in outers}.values())
        for outer in self._outers:
            # A heal or a checkpoint hands a DTensor parameter's momentum over as its local shard.
            if any(isinstance(p, DTensor) for group in outer.param_groups for p in group["params"]):
                shard_optimizer_state(outer)
        self._pending: _Sync | None = None
        self._current: _Record | None = None
        self._joined = False
        self._join_on_enter = join_on_enter
        """False: the first inner step ends with the join sync, whose weights replace that
        step's update (torchft's context managers do not communicate on entry, and torchft
        scripts rely on it)."""
        self._hook: Any = None
        manager.register_state(state_name, self._state_dict, self._load_state_dict)
        # Each group's inner optimizer state is its own (its moments follow its own batches),
        # so no two donors agree on it: served, it failed every heal with two or more donors
        # ("donors disagree on the state ... no version has a majority"; issue 21). A healer
        # keeps its own, fresh after a restart, as a new DiLoCo worker starts; checkpoints
        # still carry it.
        manager.register_state(
            f"{state_name}_inner", inner_optimizer.state_dict, inner_optimizer.load_state_dict, healed=False
        )
        manager.register_hooks(self)

    # -- the loop's side -------------------------------------------------------------------------

    def __enter__(self) -> DiLoCo:
        if self._join_on_enter:
            self.join()
        self._hook = self.inner.register_step_post_hook(lambda *_: self.after_inner_step())
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._hook is not None:
            self._hook.remove()
            self._hook = None

    def join(self) -> None:
        """Sync at once (blocking): the job's first sync, or a restarted group's way in."""
        self._until_committed(self._begin())
        self._joined = True

    def after_inner_step(self) -> None:
        """Count an inner step; start, finish or run the sync it makes due (the optimizer hook)."""
        if not self._joined:
            if self._join_on_enter:
                raise GroupError(
                    "an inner step before DiLoCo joined the job: enter `with DiLoCo(...)` (or call join()) first"
                )
            self.join()
            return
        self.local_step += 1
        _report_progress(self.manager)
        if self._pending is None and self.local_step >= self.schedule.start_at:
            sync = self._begin()
            if self.schedule.fragment_sync_delay and sync.plan is not None:
                self._pending = sync
            else:
                self._until_committed(sync)
        elif self._pending is not None and self.local_step >= self.schedule.interval:
            sync, self._pending = self._pending, None
            self._until_committed(sync)

    def observe_loss(self, loss: float) -> None:
        """Record an inner step's loss: the next sync's commit event carries the round's mean."""
        self._losses.append(float(loss))

    def batch_indices(self) -> list[int]:
        """Dataset indices for this group's next inner step, from its lease (exactly once)."""
        if not self.batch_size or self.dataset_len is None:
            raise OptionsError("batch_indices() needs DiLoCo(..., dataset_len=N, batch_size=B)")
        lease = self.leases.held.get(self.manager.options.replica_id)
        if lease is None:
            raise GroupError("this group holds no data lease: enter `with DiLoCo(...)` (or call join()) first")
        wanted = lease_rules.positions(lease, self.local_step * self.batch_size, self.batch_size)
        ids: list[int] = []
        run_start = 0
        for i in range(1, len(wanted) + 1):
            if i == len(wanted) or wanted[i] != wanted[i - 1] + 1:
                ids += sample_ids(wanted[run_start], wanted[i - 1] + 1, self.dataset_len, self.data_seed)
                run_start = i
        return ids

    # -- a sync ------------------------------------------------------------------------------------

    def _begin(self) -> _Sync:
        m = self.manager
        m.start_quorum()
        plan = m.wait_quorum()
        if plan is None:
            return _Sync(None, None, None)
        fragment = self.schedule.fragment_of(plan.max_step)
        if fragment is None:
            return _Sync(plan, None, start_reduce(m, plan, self._join_payload(plan), "fp32"))
        return _Sync(plan, fragment, start_reduce(m, plan, self.fragments[fragment].pseudo_gradient(), self.wire))

    def _join_payload(self, plan: StepPlan) -> torch.Tensor:
        """The join sync (step 0) carries the first contributor's weights and zeros from the
        others, so every group leaves it with the same weights even when the manager does not
        heal at step 0 (``Manager(options, init_sync=False)``): then nobody waits for a heal
        and misses the first round. The average times the contributors is that sum."""
        flat = torch.cat([f.synced_flat() for f in self.fragments])
        if not plan.donors or plan.donors[0] != plan.replica_id:
            flat.zero_()
        return flat

    def _until_committed(self, sync: _Sync) -> None:
        started = self.manager.current_step()
        while not self._finish(sync):
            if self.manager.current_step() != started:
                # A heal finished while no quorum came (its donors all left: heal/departure.py):
                # the group holds their state after their last sync, so this one is moot.
                logger.info("healed to step %d instead of syncing: no retry", self.manager.current_step())
                for f in self.fragments:
                    f.load_params()
                self.local_step = 0
                self._losses = []
                return
            logger.info("sync at step %d did not commit; retrying at once", started)
            self.syncs_retried += 1
            sync = self._begin()

    def _finish(self, sync: _Sync) -> bool:
        m = self.manager
        average = finish_reduce(sync.pending) if sync.pending is not None else None
        plan = sync.plan
        if plan is not None:
            participants = tuple(p.replica_id for p in plan.participants)
            self._current = _Record(sync.fragment, average, participants, plan.donors)
            if not plan.healing:
                self._annotate(self._current)
        local = self.fragments[sync.fragment].local_params() if sync.fragment is not None and self.alpha > 0 else None
        committed = m.should_commit()
        record, self._current = self._current, None
        if not committed:
            return False
        assert plan is not None and record is not None and average is not None
        self._apply(record)
        if plan.healing or sync.fragment is None:
            for f in self.fragments:
                f.load_params()
        else:
            self.fragments[sync.fragment].load_params(self.alpha, local)
        self.local_step = 0
        self._losses = []
        return True

    def _apply(self, record: _Record) -> None:
        """What a committed sync does to the replicated state (also a healer's replay)."""
        assert record.average is not None
        if record.fragment is not None:
            self.fragments[record.fragment].outer_step(record.average)
        else:
            weights = record.average * len(record.contributors)
            offset = 0
            for f in self.fragments:
                f.load_synced_flat(weights[offset : offset + f.numel])
                offset += f.numel
        self.leases, _ = lease_rules.settle(
            self.leases, record.participants, record.contributors, self.schedule.interval * self.batch_size
        )

    def _annotate(self, record: _Record) -> None:
        fields: dict[str, Any] = {"fragment": record.fragment}
        if self._losses:
            fields["loss"] = sum(self._losses) / len(self._losses)
        if self.batch_size:
            after, consumed = lease_rules.settle(
                self.leases, record.participants, record.contributors, self.schedule.interval * self.batch_size
            )
            fields["sample_ranges"] = [list(r) for r in consumed]
            fields["samples_open"] = [list(r) for r in after.open_ranges()]
            fields["samples_cursor"] = after.cursor
        if self.digest_syncs and record.fragment is not None:
            # Not at the join: groups may enter it with different weights; it makes them equal.
            fields["sync_digest"] = self.state_digest()
        self.manager.annotate_commit(**fields)

    # -- manager hooks: a healer records syncs it cannot apply yet and replays them -------------

    def capture_step(self) -> _Record | None:
        record = self._current
        if record is None or record.average is None:
            return record
        return _Record(record.fragment, record.average.clone(), record.participants, record.contributors)

    def replay_apply(self, record: _Record | None) -> None:
        if record is None or record.average is None:
            # The donors committed a sync whose average this healer never received (its own
            # all-reduce failed, theirs did not): replaying without it would diverge silently.
            raise StateError(
                "a recorded sync has no averaged pseudo-gradient to replay; restart the group to heal again"
            )
        self._apply(record)

    def state_digest(self) -> str:
        """Digest of the replicated state (synced copies, outer optimizers, leases): equal
        across the groups after every committed sync."""
        return step_digest(flatten(self._state_dict()))

    # -- state ------------------------------------------------------------------------------------

    def _state_dict(self) -> dict[str, Any]:
        return {
            "fragments": [f.state_dict() for f in self.fragments],
            "outer": [o.state_dict() for o in self._outers],
            "leases": self.leases.to_state(),
        }

    def _load_state_dict(self, state: dict[str, Any]) -> None:
        if len(state["fragments"]) != len(self.fragments) or len(state["outer"]) != len(self._outers):
            raise OptionsError(
                f"the healed DiLoCo state has {len(state['fragments'])} fragments and {len(state['outer'])} outer "
                f"optimizers; this group has {len(self.fragments)} and {len(self._outers)}: build the same model"
            )
        for f, s in zip(self.fragments, state["fragments"], strict=True):
            f.load_state_dict(s)
            f.load_params()
        for o, s in zip(self._outers, state["outer"], strict=True):
            o.load_state_dict(s)
        self.leases = Leases.from_state(state["leases"])


class LocalSGD(DiLoCo):
    """Average the parameters every ``sync_every`` inner steps (arXiv 1805.09767).

    DiLoCo with an outer SGD of learning rate 1 and no momentum: ``synced - (synced - mean)``
    is the mean of the groups' parameters, with the same quorum, retry and heal.
    """

    def __init__(
        self, manager: Manager, model: nn.Module, optimizer: torch.optim.Optimizer, sync_every: int, **kwargs: Any
    ) -> None:
        super().__init__(manager, model, optimizer, torch.optim.SGD(model.parameters(), lr=1.0), sync_every, **kwargs)


def _report_progress(manager: Manager) -> None:
    """Tell the lighthouse this group's loop progresses between syncs: it drops a group whose
    progress has not moved for its progress timeout although it heartbeats, and a DiLoCo round
    of inner steps can be longer than that."""
    manager.record_progress()
