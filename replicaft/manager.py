"""The manager: one per rank; turns a training step into quorum, all-reduce and commit.

The step, as the wrappers drive it::

    optimizer.zero_grad()  -> start_quorum()     quorum + column rebuild run in the background
    loss.backward()        -> allreduce(bucket)  waits for the plan, then sums across groups
    optimizer.step()       -> should_commit()    heal applied, "ok" flag reduced, group vote,
                                                 lighthouse fence; the real step only on commit

Threads, and who owns what:

* the training thread calls every public method and is the only one that applies a plan,
  touches training state, or advances the step;
* one quorum thread runs ``_run_quorum`` (group quorum RPC, column rebuild, donor snapshot)
  and hands back a :class:`StepPlan` through a future;
* one heal thread fetches a donor snapshot (healers only) and hands back the verified buffer
  through a future; the training thread applies it in ``should_commit``;
* lighthouse notices arrive on the group server's loop (rank 0) or the watch thread (ranks
  > 0) and only set ``_abort``, which in-flight waits poll.

A peer's failure never raises into the user's loop: it is recorded (``report_error``), later
collectives of the step become no-ops, and the step does not commit. Only misconfiguration,
or ``max_quorum_failures`` consecutive quorum timeouts, raise.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import datetime
import hashlib
import logging
import math
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from lighthouse.envelope import check_float
from lighthouse.errors import ProtocolError, QuorumTimeout
from lighthouse.plan import StepPlan, plan_step
from lighthouse.protocol import Notice
from replicaft import reserve
from replicaft.catchup import CatchUp
from replicaft.errors import GroupBroken, GroupError, HealError, StateError
from replicaft.events import EventLog
from replicaft.faults import parse_fault_points, reached, slow_serve_hook, write_served_due
from replicaft.group_protocol import VoteResponse
from replicaft.group_server import GroupClient, GroupServer
from replicaft.options import ManagerOptions
from replicaft.persistence import PREEMPTED_EXIT_CODE, Persistence
from replicaft.process_group import (
    CollectiveError,
    CollectiveHandle,
    ColumnSpec,
    FaultTolerantProcessGroup,
)
from replicaft.state import SMALL_TENSOR_BYTES, Flat, digest, flatten, unflatten
from replicaft.transfer.client import Donor, HealResult, fetch_state
from replicaft.transfer.live import LiveSnapshot
from replicaft.transfer.server import StateServer
from replicaft.transfer.snapshot import SpareBuffer

logger = logging.getLogger(__name__)

GROUP_ADDRESS_KEY = "replicaft/group_manager_address"
POLL_S = 0.02
HEAL_WAIT_FRACTION = 1.0
"""At the end of a step during a heal, a donor waits for its healers to be sent the rest of its
live snapshot (live.py), and a healer for its fetch to arrive, at most this fraction of the
step's own time so far: the step's time minus what it spent blocked on the quorum and on
collectives (``Manager._own_step_s``), i.e. its own forward and backward. A transfer about to
end then ends without a copy on the donor, or a recorded step and its replay on the healer,
while a transfer holds a donor at most as long again as its own forward and backward (the
issue's bound). Not the step's whole time: a step that waited long for its quorum (a peer
restarting) or for a slow peer's all-reduce would wait as long again.

A healer's wait holds its donors too (in the step's ok-flag all-reduce), so it is bounded by
the donors' own time as well: each publishes its last step's own time with its quorum request
(``own_step_s``), and the healer waits at most the shortest of those and its own. A restarted
healer's first step runs cold (first touch of its gradient buckets beside the receive): in one
measured 1 GB restart its own time was 3.4 s against the donor's 0.5 s."""
HOLD_FLAG = 1.0 / 1024
"""A holding healer's share of the ok-flag sum: exact in float32 and, for fewer than 1024
holding ranks, summing to less than one failure (see ``Manager._reduce_ok_flag``)."""

StateDictFn = Callable[[], dict[str, Any]]
LoadStateDictFn = Callable[[dict[str, Any]], None]


class StepHooks:
    """Callbacks a wrapper registers to act at step boundaries, and to replay a step.

    ``on_*`` run in the training thread at the start of a step and at its end. The replay
    methods serve the non-blocking heal (catchup.py): ``capture_step`` returns what this step
    did to the hook's state (e.g. the averaged gradients), ``replay_prepare`` and then
    ``replay_apply`` redo a captured step on healed state (prepare sets inputs such as
    gradients for every hook before any applies), and ``end_replay`` puts back the current
    step's inputs after the replays.
    """

    def on_step_start(self) -> None: ...
    def on_commit(self) -> None: ...
    def on_abort(self) -> None: ...
    def capture_step(self) -> Any:
        return None

    def replay_prepare(self, record: Any) -> None: ...
    def replay_apply(self, record: Any) -> None: ...
    def end_replay(self) -> None: ...


class ManagedWork:
    """An all-reduce issued through the manager; ``wait()`` never raises for a peer's failure."""

    def __init__(self, manager: Manager, handle: CollectiveHandle | None, tensor: torch.Tensor, divisor: int) -> None:
        self._manager = manager
        self._handle = handle
        self._tensor = tensor
        self._divisor = divisor
        self._waited = False

    def wait(self) -> bool:
        """Block until the reduction is done; returns False if the step will not commit."""
        if self._waited or self._handle is None:
            return self._manager.errored() is None
        self._waited = True
        blocked_from = time.monotonic()
        try:
            self._handle.wait(
                blocked_from + self._manager.options.collective_timeout_s,
                self._manager._abort,
                self._manager._tick,
            )
        except CollectiveError as e:
            self._manager.report_error(e, abandoned=True)
            return False
        finally:
            self._manager._step_blocked_s += time.monotonic() - blocked_from
        if self._divisor > 1:
            self._tensor.div_(self._divisor)
        return True

    def tensor(self) -> torch.Tensor:
        return self._tensor


class Manager:
    """Build with options; ``start()`` opens servers and connections; use as a context manager."""

    def __init__(self, options: ManagerOptions, *, init_sync: bool = True) -> None:
        self.options = options
        self.init_sync = init_sync
        """At step 0 every group but one heals from it, so all start from identical weights."""
        self._states: dict[str, tuple[StateDictFn, LoadStateDictFn]] = {}
        self._hooks: list[StepHooks] = []
        self._step = 0
        self._commit_failures = 0
        self._quorum_failures = 0
        self._broken: GroupBroken | None = None
        self._leaving = False
        """The group's last vote said a rank was asked to stop: leave at the next boundary."""
        self._hold_next_heal = False
        """The last catch-up outran its replay bounds: the next one holds the donors (catchup.py)."""
        self._torn = False
        """A heal has written into this rank's tensors in place and none has completed since:
        the state is not a valid one (see catchup.py)."""
        self._not_in_place: set[str] = set()
        self._serving: LiveSnapshot | None = None
        """The snapshot this step serves to healers from the live state, until sealed (donors)."""
        self._withdrawn: int | None = None
        """The step of the last snapshot withdrawn because the state changed while it was
        served; healers whose base it is start over (``_run_quorum``)."""
        self._abandon_generation = 0
        self._error: Exception | None = None
        self._abort = threading.Event()
        self._lost_before_plan: list[Notice] = []
        self._plan: StepPlan | None = None
        self._plan_future: concurrent.futures.Future[StepPlan] | None = None
        self._catchup: CatchUp | None = None
        self._step_started = 0.0
        self._step_blocked_s = 0.0
        """Time this step spent blocked on its quorum and its collectives (``_own_step_s``)."""
        self._last_own_step_s: float | None = None
        """The last step's own time, published with the quorum request (``HEAL_WAIT_FRACTION``)."""
        self._digest_due: int | None = None
        self._state_size_reported = False
        self._commit_fields: dict[str, Any] = {}
        self._first_quorum = True
        self._resume_pending = False
        self._quorum_pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="replicaft-quorum")
        self._heal_pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="replicaft-heal")
        backend = options.backend or ("nccl" if torch.cuda.is_available() else "gloo")
        self._pg = FaultTolerantProcessGroup(
            backend,
            collective_timeout_s=options.collective_timeout_s,
            connect_timeout_s=options.connect_timeout_s,
            host=options.host,
        )
        self._device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")
        self._faults = parse_fault_points(options.fault_points)
        self._events = EventLog(options.events_dir, options.replica_id, options.group_rank)
        self._spare = SpareBuffer()
        """The host buffer the checkpoint writer's snapshots and a donor's kept chunks reuse."""
        self._persistence = Persistence(options, self._emit, self._spare)
        self._store: dist.TCPStore | None = None
        self._state_server: StateServer | None = None
        self._group_server: GroupServer | None = None
        self._group: GroupClient | None = None
        self._rank_data: dict[str, str] = {}
        self.register_state("replicaft", self._own_state_dict, self._load_own_state_dict)

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> Manager:
        o = self.options
        self._store = dist.TCPStore(o.host, 0, is_master=True, wait_for_workers=False)
        self._state_server = StateServer(o.host, o.token, fault_hook=slow_serve_hook(self._faults, self.current_step))
        state_address = self._state_server.start()
        self._rank_data = {"store": f"{o.host}:{self._store.port}", "state": state_address}
        if o.group_rank == 0:
            self._group_server = GroupServer(o, self._on_notice)
            address = self._group_server.start()
            if o.group_world_size > 1:
                self._group_store().set(GROUP_ADDRESS_KEY, address)
        else:
            address = self._group_store().get(GROUP_ADDRESS_KEY).decode()
        self._group = GroupClient(address, o.group_rank, o.token)
        if o.group_rank != 0:
            self._group.watch(self._on_notice)
        self._persistence.start()
        self._emit("start", world_size=o.group_world_size, pid=os.getpid())
        self._log(logging.INFO, "started; group manager at %s", address)
        return self

    def _group_store(self) -> dist.TCPStore:
        assert self.options.group_store is not None
        host, port = self.options.group_store.rsplit(":", 1)
        return dist.TCPStore(host, int(port), is_master=False, timeout=datetime.timedelta(seconds=self.options.connect_timeout_s), wait_for_workers=False)

    def shutdown(self) -> None:
        """Stop every thread and server this manager started. Safe to call twice."""
        self._after_commit()
        self._persistence.close()
        self._abort.set()
        self._quorum_pool.shutdown(wait=False, cancel_futures=True)
        self._heal_pool.shutdown(wait=False, cancel_futures=True)
        if self._group is not None:
            self._group.close()
        if self._group_server is not None:
            self._group_server.stop()
        if self._state_server is not None:
            self._state_server.stop()
        self._pg.shutdown()
        self._emit("stop", reason="shutdown")
        self._events.close()

    def __enter__(self) -> Manager:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    # -- registration --------------------------------------------------------------------------

    def register_state(self, name: str, state_dict: StateDictFn, load_state_dict: LoadStateDictFn) -> None:
        """Add a piece of training state that a heal transfers and a checkpoint saves.

        ``state_dict()`` must return tensors and plain values only (no pickle travels); it is
        called on the quorum thread while the training thread runs forward/backward, so it must
        not depend on anything forward changes (the DDP wrapper serves buffers from a copy).
        """
        if name in self._states:
            raise StateError(f"state {name!r} is registered twice; pick another name")
        self._states[name] = (state_dict, load_state_dict)

    def register_hooks(self, hooks: StepHooks) -> None:
        self._hooks.append(hooks)

    def annotate_commit(self, **fields: Any) -> None:
        """Add fields to this step's "commit" event (e.g. the data sampler's sample range)."""
        self._commit_fields.update(fields)

    def state_dict(self) -> dict[str, Any]:
        return {name: fn() for name, (fn, _) in self._states.items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._persistence.settle()  # a checkpoint copy still reading the state ends first
        missing = set(self._states) - set(state)
        if missing:
            raise StateError(f"state to load lacks {sorted(missing)}; registered: {sorted(self._states)}")
        for name, (_, load) in self._states.items():
            load(state[name])

    def _own_state_dict(self) -> dict[str, Any]:
        return {"step": self._step}

    def _load_own_state_dict(self, state: dict[str, Any]) -> None:
        self._step = int(state["step"])

    # -- queries -------------------------------------------------------------------------------

    def current_step(self) -> int:
        return self._step

    @property
    def plan(self) -> StepPlan | None:
        return self._plan

    def is_healing(self) -> bool:
        return self._plan is not None and self._plan.healing

    def num_participants(self) -> int:
        """Groups contributing real gradients this step (the divisor of the average)."""
        return 0 if self._plan is None else self._plan.num_contributors

    def errored(self) -> Exception | None:
        return self._error

    @property
    def abandon_generation(self) -> int:
        """Bumped whenever a collective is abandoned; its buffers must not be reused."""
        return self._abandon_generation

    def step_seed(self) -> int:
        """A seed for this step's randomness, from (seed, step, replica rank), so a step's result
        depends only on (state, step, membership) and no RNG state has to travel in a heal.

        Blocks until this step's quorum is known (the replica rank comes from it)."""
        plan = self.wait_quorum()
        rank = 0 if plan is None else plan.replica_rank
        h = hashlib.blake2b(f"{self.options.seed}/{self._step}/{rank}".encode(), digest_size=8)
        return int.from_bytes(h.digest(), "little") & (2**63 - 1)

    # -- the step ------------------------------------------------------------------------------

    def start_quorum(self) -> None:
        """Begin a step: ask for a quorum in the background. Call from the training thread."""
        self._after_commit()
        if self._leaving:
            self._leave_preempted()
        if self._plan_future is not None and not self._plan_future.done():
            raise GroupError("start_quorum() called twice in one step; call should_commit() in between")
        self._seal_served()  # a step that never reached should_commit (its loop raised)
        self._error = None
        self._abort.clear()
        self._lost_before_plan = []
        self._plan = None
        self._commit_fields = {}
        self._step_started = time.monotonic()
        self._step_blocked_s = 0.0
        for h in self._hooks:
            h.on_step_start()
        self._tick()
        self._plan_future = self._quorum_pool.submit(self._run_quorum, self._step, self._commit_failures)

    def wait_quorum(self) -> StepPlan | None:
        """The plan of this step, or None if the quorum failed (the step will not commit)."""
        if self._plan is not None or self._plan_future is None:
            return self._plan
        future = self._plan_future
        blocked_from = time.monotonic()
        deadline = blocked_from + self.options.quorum_timeout_s + self.options.connect_timeout_s + 5.0
        while not _wait_future(future, POLL_S):
            self._tick()
            if self._persistence.preempted.is_set():
                # SIGTERM: this step will not commit; start_quorum leaves at the boundary.
                self.report_error(GroupError("preempted (SIGTERM) while waiting for the quorum"))
                return None
            if time.monotonic() > deadline:
                self.report_error(GroupError("the quorum thread did not answer in time"))
                return None
        self._step_blocked_s += time.monotonic() - blocked_from
        try:
            self._plan = future.result()
            self._quorum_failures = 0
            if any(self._plan.lost_participant(notice) for notice in self._lost_before_plan):
                self._abort.set()
        except GroupBroken as e:
            self._broken = e  # raised at the end of the step, where the loop can take it
            self.report_error(e)
        except (QuorumTimeout, GroupError) as e:
            self._quorum_failures += 1
            self.report_error(e)
            if self._quorum_failures >= self.options.max_quorum_failures:
                raise
        except Exception as e:
            self.report_error(e)
        return self._plan

    def allreduce(self, tensor: torch.Tensor) -> ManagedWork:
        """Average ``tensor`` in place across the groups that contribute this step."""
        if self._error is not None:
            return ManagedWork(self, None, tensor, 1)
        plan = self.wait_quorum()
        if plan is None or self._error is not None:
            return ManagedWork(self, None, tensor, 1)
        if plan.healing:
            tensor.zero_()
        try:
            handle = self._pg.allreduce(tensor)
        except CollectiveError as e:
            self.report_error(e)
            return ManagedWork(self, None, tensor, 1)
        reached(self._faults, "allreduce", self._step)
        return ManagedWork(self, handle, tensor, plan.num_contributors)

    def report_error(self, error: Exception, *, abandoned: bool = False) -> None:
        """Record that this step must not commit. Safe from any thread; the first error wins."""
        if abandoned:
            self._abandon_generation += 1
        if self._error is None:
            self._error = error
            self._log(logging.WARNING, "step will not commit: %s", error)
            self._emit("collective_error", error=f"{type(error).__name__}: {error}")

    def should_commit(self) -> bool:
        """End the step: True if every rank of every participating group may apply it.

        Every rank of the group must call it once per step. Blocks for the heal (healers), the
        "ok" flag all-reduce and the group vote, each under its own deadline.
        """
        plan = self.wait_quorum()
        own = self._own_step_s()
        self._last_own_step_s = round(own, 4)
        self._seal_served()
        cu = self._catchup
        if plan is not None and plan.healing and cu is not None and not cu.hold and not cu.fetched:
            donors = donor_own_step_s(plan, self.options.group_rank)
            _wait_future(cu.future, HEAL_WAIT_FRACTION * (own if donors is None else min(own, donors)))
        if self._resume_pending:
            self._persistence.settle()
            self._resume_from_disk()
        caught_up = plan is None or not plan.healing or self._catchup_ready(plan)
        ok = (
            self._error is None
            and plan is not None
            and plan.num_replicas >= self.options.min_replicas
            and caught_up
        )
        catching_up = plan is not None and plan.healing and not caught_up and self._error is None
        holding = catching_up and self._catchup is not None and self._catchup.hold
        shared_ok = held = False
        if plan is not None and not self._pg.broken:
            # A healer contributed zeros, so nothing it does taints anyone's update: it never
            # vetoes the donors' commit (it votes for itself separately, below), unless it
            # holds them until its fetch has arrived (catchup.py).
            shared_ok, held = self._reduce_ok_flag(ok or (plan.healing and not holding), hold=holding)
            ok = ok and shared_ok
        reason = "" if ok else str(
            self._error
            or ("catching up" if not caught_up else "held: a healer is receiving its base state" if held
                else "fewer groups than min_replicas")
        )
        decision = self._vote(plan, ok, reason)
        self._leaving = decision.leave
        # A step a healer did not commit because it is still catching up, or one a donor did not
        # commit because a healer held it, is no failure: counted as one, it would make the
        # lighthouse form a new quorum id, and every group rebuild its process group, each step.
        expected = held or (catching_up and shared_ok)
        # A checkpoint copy may still be running behind this step: it must end before
        # anything below writes the state (a heal's catch-up, the hooks, the optimizer).
        self._persistence.settle()
        reached(self._faults, "commit", self._step)
        if plan is not None and plan.healing and shared_ok and not decision.commit and self._catchup is not None:
            # Recorded after the vote: a rank whose own fetch is done still records a step
            # its group could not commit (another rank was not ready), so every rank's records
            # stay in line with the group's step.
            recorded = self._catchup.record(plan.max_step, [h.capture_step() for h in self._hooks])
            if recorded != "recorded":
                self._hold_next_heal = recorded == "full"
                self._emit("heal_end", ok=False, error=f"recorded steps {recorded}; restarting the heal"
                           + (" holding the donors" if self._hold_next_heal else ""))
                self._catchup = None
        if decision.commit and plan is not None and plan.healing:
            self._apply_catchup(plan)
        self._finish_step(plan, decision.commit, decision.reason, failed=not decision.commit and not expected)
        if self._broken is not None:
            self._emit("stop", reason=str(self._broken))
            raise self._broken
        return decision.commit

    # -- step internals --------------------------------------------------------------------------

    def _run_quorum(self, step: int, commit_failures: int) -> StepPlan:
        assert self._group is not None
        started = time.monotonic()
        rank_data = dict(self._rank_data)
        if self._catchup is not None:
            rank_data["heal_base"] = self._catchup.base_step
        if self._withdrawn is not None:
            rank_data["withdrawn"] = self._withdrawn
        if self._last_own_step_s is not None:
            rank_data["own_step_s"] = self._last_own_step_s
        quorum = self._group.quorum(step, self.options.quorum_timeout_s, commit_failures=commit_failures, rank_data=rank_data)
        plan = plan_step(quorum, self.options.replica_id)
        if self._first_quorum:
            self._first_quorum = False
            if plan.max_step == 0 and self._persistence.enabled and self._persistence.has_checkpoint():
                # Nobody in the quorum is ahead: every group died (or the job restarts). Resume
                # from disk in the training thread; this first step serves only to load.
                self._resume_pending = True
        plan = self._adjust_for_init_sync(plan)
        sizes = {m.world_size for m in plan.participants}
        if sizes != {self.options.group_world_size}:
            raise GroupError(f"groups of the quorum have {sorted(sizes)} ranks; every group must have the same W")
        reconfigured = self._pg.spec is None or self._pg.spec.quorum_id != plan.quorum_id or self._pg.broken is not None
        if reconfigured:
            self._configure_column(plan)
        if plan.healing:
            if self._catchup is not None and self._base_withdrawn(plan, self._catchup.base_step):
                self._catchup = None
                self._emit("heal_end", ok=False, error="a donor withdrew the snapshot this heal fetched: its state "
                           "changed while it was served; healing again from the current step")
            if self._catchup is None:
                targets = self._heal_targets()
                self._torn = self._torn or bool(targets)
                versions = {n: t._version for n, t in targets.items()}
                self._catchup = CatchUp(plan.max_step, self._heal_pool.submit(self._fetch, plan, targets),
                                        targets=targets, versions=versions, hold=self._hold_next_heal,
                                        max_records=self.options.heal_replay_steps,
                                        max_record_bytes=self.options.heal_replay_bytes)
                reached(self._faults, "heal", self._step)
        elif self._torn:
            raise GroupBroken(
                f"group {self.options.replica_id!r} is at step {plan.max_step} with no group ahead of it, but a heal "
                "that failed may have written part of its state in place; restart the group: it will heal "
                "from a peer or resume from the newest checkpoint"
            )
        else:
            self._catchup = None
            self._serve_healers(plan)
        self._emit(
            "quorum",
            quorum_id=plan.quorum_id,
            latency_s=time.monotonic() - started,
            num_replicas=plan.num_replicas,
            replica_rank=plan.replica_rank,
            max_step=plan.max_step,
            healing=plan.healing,
            participants=[m.replica_id for m in plan.participants],
            reconfigured=reconfigured,
        )
        return plan

    def _adjust_for_init_sync(self, plan: StepPlan) -> StepPlan:
        if not self.init_sync or plan.max_step != 0 or len(plan.donors) < 2 or self._resume_pending:
            return plan
        primary = plan.donors[0]
        return dataclasses.replace(
            plan, donors=(primary,), healers=tuple(m.replica_id for m in plan.participants if m.replica_id != primary)
        )

    def _configure_column(self, plan: StepPlan) -> None:
        r = self.options.group_rank
        owner = plan.column_store_owner(r)
        try:
            store = owner.data["ranks"][r]["store"]
        except (KeyError, IndexError, TypeError):
            raise GroupError(f"quorum member {owner.replica_id!r} published no store for group rank {r}") from None
        self._pg.configure(ColumnSpec(store, f"{plan.store_prefix}/{r}", plan.replica_rank, plan.num_replicas, plan.quorum_id))

    def _heal_targets(self) -> dict[str, torch.Tensor]:
        """This rank's own tensors a heal may receive into in place (see catchup.py): the large
        ones (small ones, such as BatchNorm statistics, are written by forward and cost
        nothing to place elsewhere), minus any seen written during an earlier fetch."""
        flat = flatten(self.state_dict())
        return {
            name: t for name, t in zip(flat.names, flat.tensors, strict=True)
            if name not in self._not_in_place and t.numel() * t.element_size() >= SMALL_TENSOR_BYTES
        }

    def _fetch(self, plan: StepPlan, targets: dict[str, torch.Tensor]) -> HealResult:
        r = self.options.group_rank
        donors = []
        for rid in plan.donors:
            member = plan.member(rid)
            assert member is not None
            try:
                donors.append(Donor(rid, member.data["ranks"][r]["state"]))
            except (KeyError, IndexError, TypeError):
                logger.warning("donor %s published no state server for group rank %d", rid, r)
        self._emit("heal_start", quorum_id=plan.quorum_id, donors=list(plan.donors), max_step=plan.max_step,
                   hold=self._hold_next_heal)
        return fetch_state(
            donors,
            plan.max_step,
            token=self.options.token,
            timeout_s=self.options.heal_timeout_s,
            healer_index=plan.healers.index(self.options.replica_id),
            into=targets,
            reader=self.options.replica_id,
            connections=self.options.heal_connections,
        )

    def _serve_healers(self, plan: StepPlan) -> None:
        """Publish the snapshot healers need; keep serving the bases of heals in progress.

        The snapshot is served from the live state (live.py): healers get the manifest at
        once, and ``_seal_served`` keeps what they still need before the optimizer steps.
        """
        assert self._state_server is not None
        r = self.options.group_rank
        bases: dict[str, int] = {}
        for rid in plan.healers:
            ranks = _rank_entries(plan, rid)
            base = ranks[r].get("heal_base") if len(ranks) > r else None
            bases[rid] = base if isinstance(base, int) else plan.max_step
        if plan.max_step in bases.values() and plan.max_step not in self._state_server.published_steps:
            readers = frozenset(rid for rid, base in bases.items() if base == plan.max_step)
            self._serving = LiveSnapshot(flatten(self.state_dict()), step=plan.max_step, quorum_id=plan.quorum_id,
                                         replica_id=self.options.replica_id, readers=readers, spare=self._spare)
            self._state_server.publish(self._serving)
            reached(self._faults, "serve", self._step)
            if write_served_due(self._faults, self._step):
                self._faults = frozenset(p for p in self._faults if p[0] != "write_served")
                _write_largest_optimizer_tensor(flatten(self.state_dict()))
        self._state_server.retain(set(bases.values()))

    def _own_step_s(self) -> float:
        """The step's own time so far: its time minus what it spent blocked on its quorum and
        its collectives, i.e. its own forward and backward (see ``HEAL_WAIT_FRACTION``)."""
        return max(0.0, time.monotonic() - self._step_started - self._step_blocked_s)

    def _seal_served(self) -> None:
        """Stop serving this step's snapshot from the live state, before anything writes it.

        The healers get up to ``HEAL_WAIT_FRACTION`` of the step's own time so far to be sent
        what they have not been sent yet; the rest is copied (live.py). If the state changed
        while it was served (user code writing it in place during forward or backward), what
        went out may mix two states: it is withdrawn, this step fails, and healers fetching it
        are told through the next quorum (``withdrawn``), before any could apply it at a
        commit (a failed step commits nowhere).
        """
        served, self._serving = self._serving, None
        if served is None:
            return
        assert self._state_server is not None
        why = served.seal(HEAL_WAIT_FRACTION * self._own_step_s())
        self._emit("serve_end", served_step=served.step, readers=sorted(served.readers), waited_s=served.waited_s,
                   kept_bytes=served.kept_bytes, reused_buffer=served.reused_buffer, shut=served.shut, ok=not why, error=why or None)
        if not why:
            if self._withdrawn == served.step:
                self._withdrawn = None  # served again, whole this time
            return
        self._withdrawn = served.step
        self._state_server.retain(self._state_server.published_steps - {served.step})
        self.report_error(StateError(f"snapshot of step {served.step} withdrawn from healers: {why}"))

    def _base_withdrawn(self, plan: StepPlan, base: int) -> bool:
        r = self.options.group_rank
        return any(
            len(ranks) > r and ranks[r].get("withdrawn") == base
            for ranks in (_rank_entries(plan, rid) for rid in plan.donors)
        )

    def _catchup_ready(self, plan: StepPlan) -> bool:
        """Non-blocking: has the background fetch arrived, verified, and do records lead on?"""
        cu = self._catchup
        if cu is None or not cu.fetched:
            return False
        try:
            cu.future.result()
        except Exception as e:
            self._catchup = None
            self._emit("heal_end", ok=False, error=f"{type(e).__name__}: {e}")
            self.report_error(e if isinstance(e, HealError) else HealError(f"heal failed: {e}"))
            return False
        written = cu.written_meanwhile(cu.future.result().in_place)
        if written:
            self._catchup = None
            self._not_in_place |= set(written)
            self._emit("heal_end", ok=False, error=f"this group's own steps wrote {written[:3]} while they were being "
                       "received in place; healing again with them received into new memory")
            return False
        if not cu.leads_to(plan.max_step):
            self._catchup = None
            self._emit("heal_end", ok=False, error=f"base {cu.base_step} + {len(cu.records)} recorded steps != {plan.max_step}")
            return False
        return True

    def _apply_catchup(self, plan: StepPlan) -> None:
        """Apply the verified base state, replay the recorded steps, keep this step's effect.

        Runs only after the group voted to commit, so every rank applies or none. A failure
        here means the state does not fit this program (a user error): it raises, and the
        group must be restarted rather than train on partly applied state.
        """
        cu = self._catchup
        assert cu is not None
        result = cu.future.result()
        self.load_state_dict(unflatten(result.manifest.skeleton, result.tensors))
        self._torn = self._hold_next_heal = False
        for record in cu.records:
            for h, r in zip(self._hooks, record, strict=True):
                h.replay_prepare(r)
            for h, r in zip(self._hooks, record, strict=True):
                h.replay_apply(r)
            self._step += 1
        if cu.records:
            for h in self._hooks:
                h.end_replay()
        self._catchup = None
        self._emit(
            "heal_end",
            ok=True,
            num_bytes=result.manifest.total_bytes,
            in_place_bytes=result.in_place_bytes,
            seconds=result.seconds,
            bytes_by_donor=result.bytes_by_donor,
            refetched_stripes=result.refetched_stripes,
            taken_over_stripes=result.taken_over_stripes,
            replayed_steps=len(cu.records),
            base_step=cu.base_step,
        )

    def _reduce_ok_flag(self, ok: bool, *, hold: bool = False) -> tuple[bool, bool]:
        """(every rank of this column is ok, a healer held the step).

        Each rank adds 0 (ok), 1 (its step failed) or ``HOLD_FLAG`` (a healer holding the
        donors): a sum of 1 or more counts failures, a sum strictly between 0 and 1 is holds only.
        """
        flag = torch.tensor([0.0 if ok else HOLD_FLAG if hold else 1.0], device=self._device)
        try:
            self._pg.allreduce(flag, op="ok-flag allreduce").wait(
                time.monotonic() + self.options.collective_timeout_s, self._abort, self._tick
            )
        except CollectiveError as e:
            self.report_error(e, abandoned=True)
            return False, False
        total = flag.item()
        if total >= 1.0:
            self.report_error(GroupError(f"{int(total)} participant rank(s) of this column reported a failed step"))
            return False, False
        return ok and total == 0.0, total > 0.0

    def _vote(self, plan: StepPlan | None, ok: bool, reason: str) -> VoteResponse:
        """The group's decision on this step, and whether the group leaves after it.

        A rank that cannot reach its group's vote leaves on its own if it was asked to.
        """
        assert self._group is not None
        quorum_id = plan.quorum_id if plan is not None else 0
        leaving = self._persistence.preempted.is_set()
        try:
            return self._group.vote(self._step, quorum_id, ok, reason, self.options.collective_timeout_s, leaving=leaving)
        except GroupError as e:
            return VoteResponse(False, f"vote failed: {e}", leaving)

    def _finish_step(self, plan: StepPlan | None, commit: bool, reason: str, *, failed: bool) -> None:
        if commit:
            assert plan is not None
            for h in self._hooks:
                h.on_commit()
            self._step = plan.max_step + 1
            self._commit_failures = 0
            self._digest_due = self._step
        else:
            for h in self._hooks:
                h.on_abort()
            self._commit_failures += failed
        self._emit(
            "commit",
            quorum_id=plan.quorum_id if plan else -1,
            committed=commit,
            reason=reason,
            num_contributors=plan.num_contributors if plan else 0,
            healing=bool(plan and plan.healing),
            step_time_s=time.monotonic() - self._step_started,
            **self._commit_fields,
        )
        self._tick()

    def _after_commit(self) -> None:
        """At the boundary after a committed step (the optimizer has stepped): digest, checkpoint."""
        step, self._digest_due = self._digest_due, None
        if step is None:
            return
        every = self.options.digest_every_steps
        if every and step % every == 0 and self._events.path is not None:
            self._emit("committed", digest=digest(flatten(self.state_dict())))
        if not self._state_size_reported and self._events.path is not None:
            self._state_size_reported = True
            self._report_state_size()
        plan = self._plan
        quorum_id = plan.quorum_id if plan is not None else -1
        self._persistence.after_commit(
            step,
            is_writer=plan is not None and plan.replica_rank == 0,
            state=self.state_dict,
            quorum_id=quorum_id,
        )

    def _report_state_size(self) -> None:
        """Once per process, after its first commit (the optimizer's state exists by then): the
        launcher sizes a warm standby's memory reserve from it (reserve.py)."""
        sizes = [(t.numel() * t.element_size(), t.device.type) for t in flatten(self.state_dict()).tensors]
        held = reserve.installed()
        self._emit("state_size", num_bytes=sum(n for n, _ in sizes), cpu_bytes=sum(n for n, d in sizes if d == "cpu"),
                   reserve_bytes=held.num_bytes if held else 0, reserve_used_bytes=held.used_bytes if held else 0)

    def _resume_from_disk(self) -> None:
        self._resume_pending = False
        loaded = self._persistence.load_latest(self.state_dict())
        if loaded is None:
            self._log(logging.WARNING, "no valid checkpoint to resume from; starting at step 0")
            return
        self.load_state_dict(loaded.state)
        self._emit("resume", checkpoint_step=loaded.step, path=str(loaded.path), digest=digest(flatten(self.state_dict())))
        self.report_error(GroupError(f"resumed from checkpoint step {loaded.step} ({loaded.path}); this step only loaded"))

    def _leave_preempted(self) -> None:
        """SIGTERM reached a rank of this group, and the group's vote on the last step said so
        to every rank: all ranks are at the same step boundary. The writer group saves what it
        has (every rank its shards); every group then exits."""
        plan = self._plan
        if plan is not None and plan.replica_rank == 0:
            self._persistence.emergency_save(
                self._step, self.state_dict, plan.quorum_id
            )
        self._emit("stop", reason="preempted (SIGTERM)")
        raise SystemExit(PREEMPTED_EXIT_CODE)

    # -- notices, progress, logging ---------------------------------------------------------------

    def _on_notice(self, notice: Notice) -> None:
        """Runs on a notice thread: only sets flags the training thread polls."""
        plan = self._plan
        if notice.kind == "member_lost":
            if plan is None:
                # The step's quorum is not known yet: decide once it is (wait_quorum). A loss
                # that predates the new quorum is not in it and must not abort its step.
                self._lost_before_plan.append(notice)
            elif plan.lost_participant(notice):
                self._abort.set()
        elif notice.kind == "fenced" and notice.replica_id == self.options.replica_id:
            self._abort.set()
            self._emit("fenced", reason=notice.reason)

    def _tick(self) -> None:
        if self._group_server is not None:
            self._group_server.record_progress(self._step)

    def _emit(self, event: str, **fields: Any) -> None:
        fields.setdefault("quorum_id", self._plan.quorum_id if self._plan else -1)
        self._events.emit(event, step=self._step, **fields)

    def _log(self, level: int, msg: str, *args: Any) -> None:
        o = self.options
        q = self._plan.quorum_id if self._plan else "-"
        logger.log(level, f"[{o.replica_id}/{o.group_rank} step=%d quorum=%s] {msg}", self._step, q, *args)


def _write_largest_optimizer_tensor(flat: Flat) -> None:
    """The ``write_served`` fault (faults.py): state written in place while it is served."""
    candidates = [t for n, t in zip(flat.names, flat.tensors, strict=True)
                  if n.startswith("state.optimizer") and t.is_floating_point()]
    if candidates:
        with torch.no_grad():
            max(candidates, key=torch.Tensor.numel).add_(1.0)


def donor_own_step_s(plan: StepPlan, group_rank: int) -> float | None:
    """The shortest own step time this rank's donors published (``HEAL_WAIT_FRACTION``), None
    if none did. Malformed values are ignored: they came over the wire and only bound a wait."""
    times = []
    for rid in plan.donors:
        ranks = _rank_entries(plan, rid)
        value = ranks[group_rank].get("own_step_s") if len(ranks) > group_rank else None
        if value is None:
            continue
        try:
            times.append(check_float(f"donor {rid}", f"ranks[{group_rank}].own_step_s", value, 0.0, math.inf))
        except ProtocolError:
            continue
    return min(times, default=None)


def _rank_entries(plan: StepPlan, replica_id: str) -> list[dict[str, Any]]:
    """A quorum member's per-rank data (what each rank put in ``rank_data``), ``[]`` if absent
    or malformed: it came over the wire and is only read for hints."""
    member = plan.member(replica_id)
    ranks = member.data.get("ranks") if member is not None else None
    if not isinstance(ranks, list):
        return []
    return [entry if isinstance(entry, dict) else {} for entry in ranks]


def _wait_future(future: concurrent.futures.Future[Any], timeout_s: float) -> bool:
    try:
        future.exception(timeout_s)
    except concurrent.futures.TimeoutError:
        return False
    except concurrent.futures.CancelledError:
        return True
    return True

