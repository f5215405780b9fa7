"""The healer side of a heal: fetch a donor snapshot in the background, record, then apply.

A group behind the quorum's ``max_step`` is a healer (lighthouse/rules/plan.py). The step driver
(replicaft/step/driver.py) calls this module at four points of each healing step, all on the training thread:

1. ``begin`` (the plan is applied): start the fetch of the donors' snapshot on the heal
   thread, unless one is running whose base the donors still serve; or, when a hook asks for
   it (``StepHooks.fetch_beside_collectives``), defer the start to ``start_deferred`` (the
   step's end, once its collectives, the "ok" flag included, are over);
2. ``wait`` (the step's end): give a fetch about to arrive a bounded wait (``fetch_wait_s``);
3. ``ready`` (before the vote): has the fetch arrived, verified, and do base + records reach
   the donors' step? A fetch that failed, or was overtaken by this group's own writes into
   tensors it received in place, is dropped here and started again at the next quorum;
4. after the vote, ``record`` (the group could not commit: keep what this step did, to replay
   it) or ``apply`` (it commits: load the verified base state and replay the recorded steps).

The protocol and its guarantees are catchup.py's; what a transfer verifies is
transfer/client.py's. This module keeps the state between those steps, emits the heal events
through the sink it is given, and never calls back into the manager.
"""

from __future__ import annotations

import concurrent.futures
import logging
import math
from collections.abc import Callable, Mapping
from typing import Any

import torch

from lighthouse.errors import ProtocolError
from lighthouse.rules.plan import StepPlan
from lighthouse.wire.envelope import check_float
from replicaft.config.options import ManagerOptions
from replicaft.errors import GroupBroken, HealError
from replicaft.heal import HEAL_WAIT_FRACTION
from replicaft.heal.catchup import CatchUp
from replicaft.heal.departure import departed_at
from replicaft.state.flat import SMALL_TENSOR_BYTES, unflatten
from replicaft.state.registry import StateRegistry
from replicaft.transfer.client import HealResult, fetch_state
from replicaft.transfer.donors import Donor
from replicaft.transfer.progress import FetchProgress

logger = logging.getLogger(__name__)

ETA_SLACK = 2.0
"""A fetch expected to arrive within the healer's own step time is waited for up to this
multiple of its estimate (``fetch_wait_s``): the estimate is the rate so far, and the rest may
come slower (a donor's step ends and it copies what it has not sent yet, transfer/live.py)."""
HEAL_SIZE_FACTOR = 4
HEAL_SIZE_SLACK_BYTES = 256 * 1024 * 1024
"""A donor's state may be larger than the healer's own (an optimizer that creates its state at
its first step: Adam's two moments make it 3x the parameters), but not beyond this factor of
it plus this slack: a manifest claiming more is refused before anything is allocated for it."""

Emit = Callable[..., None]


class Healer:
    """One rank's healer side. Training thread only, but for the fetch on the heal thread."""

    def __init__(self, options: ManagerOptions, registry: StateRegistry, emit: Emit) -> None:
        self._options = options
        self._registry = registry
        self._emit = emit
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="replicaft-heal")
        self._catchup: CatchUp | None = None
        self._hold_next = False
        """The last catch-up outran its replay bounds: the next one holds the donors (catchup.py)."""
        self._torn = False
        """A heal has written into this rank's tensors in place and none has completed since:
        the state is not a valid one (catchup.py)."""
        self._not_in_place: set[str] = set()
        """Tensors seen written during an earlier fetch: received into new memory from then on."""
        self._deferred: tuple[CatchUp, Callable[[], None]] | None = None
        """A catch-up whose fetch waits for the step's collectives to end, and its start."""

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    @property
    def holding(self) -> bool:
        """This catch-up holds the donors (vetoes their steps) until its fetch has arrived."""
        return self._catchup is not None and self._catchup.hold

    @property
    def healing(self) -> bool:
        """A catch-up is under way, from its fetch's start until it is applied or dropped: the
        heartbeats say so (lighthouse/rules/liveness.py: loading its state may stall this process)."""
        return self._catchup is not None

    @property
    def fetching(self) -> bool:
        return self._catchup is not None and not self._catchup.fetched

    def rank_data(self) -> dict[str, int]:
        """What this rank tells its donors with its quorum request: the base it is fetching."""
        return {} if self._catchup is None else {"heal_base": self._catchup.base_step}

    def begin(self, plan: StepPlan, withdrawn: Callable[[int], bool]) -> bool:
        """This rank heals in ``plan``: keep the running fetch, or start one; returns whether
        one was started. ``withdrawn(base)``: the donors withdrew the snapshot of that step."""
        cu = self._catchup
        if cu is not None and withdrawn(cu.base_step):
            self._drop(
                "a donor withdrew the snapshot this heal fetched: its state changed while it was served; "
                "healing again from the current step"
            )
        if self._catchup is not None:
            return False
        targets = self._targets()
        own = self._registry.flat(healed_only=True)
        expected = {
            name: (str(t.dtype).removeprefix("torch."), tuple(t.shape))
            for name, t in zip(own.names, own.tensors, strict=True)
        }
        max_bytes = HEAL_SIZE_FACTOR * sum(t.numel() * t.element_size() for t in own.tensors) + HEAL_SIZE_SLACK_BYTES
        required = self._registry.required
        self._torn = self._torn or bool(targets)
        deferred = not self._registry.fetch_beside_collectives(plan.max_step)
        self._emit(
            "heal_start",
            quorum_id=plan.quorum_id,
            donors=list(plan.donors),
            max_step=plan.max_step,
            hold=self._hold_next,
            deferred=deferred,
        )
        future: concurrent.futures.Future[HealResult] = concurrent.futures.Future()
        self._catchup = CatchUp(
            plan.max_step,
            future,
            targets=targets,
            versions={n: t._version for n, t in targets.items()},
            donors=plan.donors,
            hold=self._hold_next,
            max_records=self._options.heal_replay_steps,
            max_record_bytes=self._options.heal_replay_bytes,
        )

        progress = self._catchup.progress

        def start() -> None:
            fetch = self._pool.submit(self._fetch, plan, targets, expected, max_bytes, required, progress)
            fetch.add_done_callback(lambda done: _settle(future, done))

        if deferred:
            self._deferred = (self._catchup, start)
        else:
            start()
        return True

    def start_deferred(self) -> bool:
        """Once the step's collectives are over (after the "ok" flag, which every donor reduces
        only after sealing its snapshot): start the fetch ``begin`` deferred, if the catch-up it
        belongs to is still the current one; returns whether it started."""
        deferred, self._deferred = self._deferred, None
        if deferred is None or deferred[0] is not self._catchup:
            return False
        deferred[1]()
        return True

    def not_healing(self, plan: StepPlan) -> None:
        """This rank is up to date in ``plan``: nothing to fetch. Raises GroupBroken if a failed
        heal left part of its state written in place and nobody is ahead to heal from."""
        if self._torn:
            raise GroupBroken(
                f"group {self._options.replica_id!r} is at step {plan.max_step} with no group ahead of it, but a heal "
                "that failed may have written part of its state in place; restart the group: it will heal "
                "from a peer or resume from the newest checkpoint"
            )
        self._catchup = None

    def wait(self, plan: StepPlan, own_s: float) -> None:
        """At the step's end, give a fetch in flight a bounded wait to arrive (``fetch_wait_s``,
        from this step's own time ``own_s``, its donors' and the fetch's progress). A holding
        one needs none: its donors abort their steps until it has arrived."""
        cu = self._catchup
        if cu is None or cu.hold or cu.fetched or (self._deferred is not None and self._deferred[0] is cu):
            return  # a deferred fetch has not started: it cannot be about to arrive
        donors_s = donors_own_step_s(plan, self._options.group_rank)
        try:
            cu.future.exception(fetch_wait_s(own_s, donors_s, cu.progress.eta_s()))
        except (concurrent.futures.TimeoutError, concurrent.futures.CancelledError):
            pass

    def ready(self, plan: StepPlan) -> bool | HealError:
        """Non-blocking: True when the fetch has arrived, verified, and base + records lead to
        ``plan.max_step``; the fetch's error when it failed (the step must not commit)."""
        cu = self._catchup
        if cu is None or not cu.fetched:
            return False
        try:
            result = cu.future.result()
        except Exception as e:
            self._catchup = None
            self._emit("heal_end", ok=False, error=f"{type(e).__name__}: {e}")
            return e if isinstance(e, HealError) else HealError(f"heal failed: {e}")
        written = cu.written_meanwhile(result.in_place)
        if written:
            self._not_in_place |= set(written)
            self._drop(
                f"this group's own steps wrote {written[:3]} while they were being received in place; "
                "healing again with them received into new memory"
            )
            return False
        if not cu.leads_to(plan.max_step):
            self._drop(f"base {cu.base_step} + {len(cu.records)} recorded steps != {plan.max_step}")
            return False
        return True

    def finish_if_donors_left(self, left: Mapping[str, int]) -> int | None:
        """Training thread, while no quorum comes: if every donor of the catch-up left cleanly
        at the step its fetch and records reach, apply it and return that step (departure.py);
        else None. A fetch that failed or was written over is left for ``ready`` to report."""
        cu = self._catchup
        if cu is None or not cu.fetched:
            return None
        step = departed_at(cu.donors, left, cu.base_step + len(cu.records))
        if step is None or cu.future.exception() is not None or cu.written_meanwhile(cu.future.result().in_place):
            return None
        self.apply()
        return step

    def record(self, plan: StepPlan, captured: list[Any]) -> None:
        """The group did not commit this step while the fetch runs: keep what it did, to replay."""
        cu = self._catchup
        if cu is None:
            return
        recorded = cu.record(plan.max_step, captured)
        if recorded != "recorded":
            self._hold_next = recorded == "full"
            self._drop(
                f"recorded steps {recorded}; restarting the heal" + (" holding the donors" if self._hold_next else "")
            )

    def apply(self) -> None:
        """The group commits this step: load the verified base state, then replay the steps the
        donors took meanwhile (registry.py). Runs only after the group's vote, so every rank of
        the group applies or none. A failure here means the state does not fit this program (a
        user error): it raises, and the group must be restarted rather than train on partly
        applied state. The manager then counts the step committed (at the donors' step + 1)."""
        cu = self._catchup
        assert cu is not None and cu.fetched, "apply() a heal only after ready() said so"
        r = cu.future.result()
        self._registry.load_state_dict(unflatten(r.manifest.skeleton, r.tensors))
        replayed = self._registry.replay(cu.records)
        self._catchup = None
        self._torn = self._hold_next = False
        self._emit(
            "heal_end",
            ok=True,
            num_bytes=r.manifest.total_bytes,
            in_place_bytes=r.in_place_bytes,
            seconds=r.seconds,
            bytes_by_donor=r.bytes_by_donor,
            refetched_stripes=r.refetched_stripes,
            taken_over_stripes=r.taken_over_stripes,
            replayed_steps=replayed,
            base_step=cu.base_step,
        )

    def _drop(self, why: str) -> None:
        self._catchup = None
        self._emit("heal_end", ok=False, error=why)

    def _targets(self) -> dict[str, torch.Tensor]:
        """This rank's own tensors a heal may receive into in place (catchup.py): the large ones
        (small ones, such as BatchNorm statistics, are written by forward and cost nothing to
        place elsewhere), minus any seen written during an earlier fetch."""
        flat = self._registry.flat(healed_only=True)
        return {
            name: t
            for name, t in zip(flat.names, flat.tensors, strict=True)
            if name not in self._not_in_place and t.numel() * t.element_size() >= SMALL_TENSOR_BYTES
        }

    def _fetch(
        self,
        plan: StepPlan,
        targets: dict[str, torch.Tensor],
        expected: dict[str, tuple[str, tuple[int, ...]]],
        max_bytes: int,
        required: frozenset[str],
        progress: FetchProgress,
    ) -> HealResult:
        """On the heal thread: pull and verify the donors' snapshot of ``plan.max_step``."""
        r = self._options.group_rank
        donors = []
        for rid in plan.donors:
            address = plan.rank_entry(rid, r).get("state")
            if isinstance(address, str):
                donors.append(Donor(rid, address))
            else:
                logger.warning("donor %s published no state server for group rank %d", rid, r)
        tls = self._options.tls()
        return fetch_state(
            donors,
            plan.max_step,
            token=self._options.token,
            timeout_s=self._options.heal_timeout_s,
            healer_index=plan.healers.index(self._options.replica_id),
            into=targets,
            reader=self._options.replica_id,
            connections=self._options.heal_connections,
            tls=tls.client_context() if tls else None,
            expected=expected,
            max_bytes=max_bytes,
            required=required,
            progress=progress,
        )


def _settle(future: concurrent.futures.Future[HealResult], done: concurrent.futures.Future[HealResult]) -> None:
    """Pass the heal thread's outcome to the catch-up's future (created before the fetch starts)."""
    if done.cancelled():
        future.cancel()
    elif (error := done.exception()) is not None:
        future.set_exception(error)
    else:
        future.set_result(done.result())


def fetch_wait_s(own_s: float, donors_s: float | None, eta_s: float | None) -> float:
    """How long a healer waits for its fetch at the end of a step whose own time was ``own_s``,
    its donors' last ``donors_s`` (None: none published), the fetch expected in ``eta_s`` (None:
    no estimate yet). The wait holds the donors (in the "ok" flag exchange), so it is bounded
    by their own time as well as the healer's (``HEAL_WAIT_FRACTION``); but missing a fetch
    that is about to arrive costs more than that: the healer takes another step of zeros, and
    the step it recorded is replayed at the next one while the donors wait in its all-reduce.
    A fetch expected within the healer's own time is therefore waited for, up to ``ETA_SLACK``
    times its estimate and at most that own time (the wait ends as soon as it arrives)."""
    own = HEAL_WAIT_FRACTION * own_s
    bounded = own if donors_s is None else min(own, HEAL_WAIT_FRACTION * donors_s)
    if eta_s is None or eta_s > own:
        return bounded
    return max(bounded, min(own, ETA_SLACK * eta_s))


def donors_own_step_s(plan: StepPlan, group_rank: int) -> float | None:
    """The shortest own step time this rank's donors published (``HEAL_WAIT_FRACTION``), None
    if none did. Malformed values are ignored: they came over the wire and only bound a wait."""
    times = []
    for rid in plan.donors:
        value = plan.rank_entry(rid, group_rank).get("own_step_s")
        if value is None:
            continue
        try:
            times.append(check_float(f"donor {rid}", f"ranks[{group_rank}].own_step_s", value, 0.0, math.inf))
        except ProtocolError:
            continue
    return min(times, default=None)
