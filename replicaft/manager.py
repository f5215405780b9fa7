"""The manager: one per rank, the object a training script and the wrappers talk to.

It wires one rank's parts together and exposes them: the servers it runs (services.py), what
is registered for heals and checkpoints (registry.py), and the step, which ``start_quorum``,
``allreduce`` and ``should_commit`` forward to the step driver unchanged (replicaft/step/driver.py: read it for
the step, top-down). The constructor only builds; ``start()`` opens servers and connections.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

import torch

from lighthouse.rules.plan import StepPlan
from lighthouse.wire.progress import Progress
from lighthouse.wire.protocol import Notice
from replicaft.column.process_group import FaultTolerantProcessGroup, ManagedWork, Reduce
from replicaft.config.options import ManagerOptions, check_option_number
from replicaft.heal.donor import DonorSide
from replicaft.heal.healer import Healer
from replicaft.persistence.duties import Persistence
from replicaft.persistence.registration import register_checkpoint_state
from replicaft.process.faults import parse_fault_points
from replicaft.process.services import RankServices
from replicaft.state.registry import LoadStateDictFn, StateDictFn, StateRegistry, StepHooks
from replicaft.state.rng_state import STATE_NAME as RNG_STATE
from replicaft.state.rng_state import RngState, available_sources, step_seed
from replicaft.step.boundary import StepBoundary
from replicaft.step.driver import StepDriver
from replicaft.step.notices import StepNotices
from replicaft.step.plan_applier import PlanApplier
from replicaft.telemetry.events import EventLog
from replicaft.telemetry.metrics import MetricsServer, ProcessMetrics
from replicaft.transfer.spare import SpareBuffer

logger = logging.getLogger(__name__)


class Manager:
    """Build with options; ``start()`` opens servers and connections; use as a context manager.

    ``init_sync``: at step 0 every group but one heals from it, so all start from identical
    weights (and identical random generators).

    ``rng_state`` (default: ``init_sync``): the process-global random generators (Python's
    ``random``, NumPy's, torch's CPU and CUDA ones) are carried by heals and saved by
    checkpoints without the script doing anything, so a script that draws from them (dropout)
    resumes bit for bit (rng_state.py; torch's are left out in the deterministic mode, which
    reseeds them per shard). A heal from several donors needs theirs to agree: ``init_sync``'s
    step-0 heal makes every group's the same, while without it each process's start as it
    seeded them (Python's and NumPy's from OS entropy), so they are then carried only when
    asked for. Pass False when the groups' generators differ by design (seeded per group).
    """

    def __init__(self, options: ManagerOptions, *, init_sync: bool = True, rng_state: bool | None = None) -> None:
        o = self.options = options
        self.init_sync = init_sync
        self._registry = StateRegistry()
        faults = parse_fault_points(o.fault_points)
        self._metrics = ProcessMetrics(o.replica_id, o.group_rank) if o.metrics_port else None
        self._metrics_server = (
            MetricsServer(self._metrics.registry, o.host, o.metrics_port + o.group_rank)
            if self._metrics is not None
            else None
        )
        self._events = EventLog(
            o.events_dir, o.replica_id, o.group_rank, sink=self._metrics.observe if self._metrics is not None else None
        )
        progress = self._progress = Progress()
        notices = StepNotices(o.replica_id, lambda reason: self._emit("fenced", reason=reason))
        self._services = RankServices(o, progress, self._deliver_notice, faults, self.current_step)
        self._column = FaultTolerantProcessGroup(
            o.backend or ("nccl" if torch.cuda.is_available() else "gloo"),
            collective_timeout_s=o.collective_timeout_s,
            connect_timeout_s=o.connect_timeout_s,
            host=o.host,
            token=o.token,
            tls=self._services.tls,
        )
        spare = SpareBuffer()  # the host buffer a checkpoint's snapshots and a donor's kept chunks reuse
        self._persistence = Persistence(o, self._emit, spare)
        self._healer = Healer(o, self._registry, self._emit)
        donor = DonorSide(
            o.replica_id, o.group_rank, self._registry, self._services.state_server, spare, self._emit, faults
        )
        applier = PlanApplier(
            o,
            init_sync=init_sync,
            column=self._column,
            healer=self._healer,
            donor=donor,
            persistence=self._persistence,
            notices=notices,
            emit=self._emit,
            faults=faults,
        )
        self._boundary = StepBoundary(o.digest_every_steps, self._registry, self._persistence, self._events, self._emit)
        self._notices = notices
        self._driver = StepDriver(
            o,
            registry=self._registry,
            services=self._services,
            column=self._column,
            applier=applier,
            healer=self._healer,
            donor=donor,
            persistence=self._persistence,
            boundary=self._boundary,
            notices=notices,
            progress=progress,
            emit=self._emit,
            faults=faults,
        )
        self._registry.register_state("replicaft", lambda: {"step": self._driver.step}, self._load_own_state)
        self._metric_reports = register_checkpoint_state(
            o,
            self._registry,
            self._persistence,
            current_step=self.current_step,
            healing=self.is_healing,
            emit=self._emit,
        )
        if init_sync if rng_state is None else rng_state:
            rng = RngState(
                available_sources(deterministic=o.deterministic),
                lambda: self.plan is not None and bool(self.plan.healers),
                self.annotate_commit,
            )
            self._registry.register_state(
                RNG_STATE, rng.state_dict, rng.load_state_dict, in_digest=False, optional=True
            )
            self._registry.register_hooks(rng)

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self) -> Manager:
        address = self._services.start()
        self._persistence.start()
        metrics_url = self._metrics_server.start() if self._metrics_server is not None else None
        if not self.options.token:
            logger.warning(
                "[%s/%d] no REPLICAFT_TOKEN: this job's lighthouse and state servers accept any process "
                "that can reach them (replicaft-launch makes a secret per job; or set one)",
                self.options.replica_id,
                self.options.group_rank,
            )
        self._emit("start", world_size=self.options.group_world_size, pid=os.getpid(), metrics_url=metrics_url)
        logger.info("[%s/%d] started; group manager at %s", self.options.replica_id, self.options.group_rank, address)
        return self

    def shutdown(self) -> None:
        """Stop every thread and server this manager started. Safe to call twice."""
        self._driver.close()
        self._persistence.close()
        self._notices.abort.set()
        self._healer.close()
        self._services.stop()
        self._column.shutdown()
        self._emit("stop", reason="shutdown")
        if self._metrics_server is not None:
            self._metrics_server.stop()
        self._events.close()

    def __enter__(self) -> Manager:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    # -- registration --------------------------------------------------------------------------

    def register_state(
        self,
        name: str,
        state_dict: StateDictFn,
        load_state_dict: LoadStateDictFn,
        *,
        healed: bool = True,
        in_digest: bool = True,
    ) -> None:
        """Add training state that a heal transfers and a checkpoint saves (registry.py):
        ``state_dict()`` returns tensors and plain values only; it runs on the training thread.
        ``healed=False``: state each group legitimately holds its own of (DiLoCo's inner
        optimizer): checkpoints carry it, heals do not, and a healer keeps its own.
        ``in_digest=False``: state a healer takes from its donor but that groups may hold
        differently without being out of step (a Lightning callback's wall-clock timer), so
        the digest that says two groups agree leaves it out; a checkpoint may lack it."""
        self._registry.register_state(
            name, state_dict, load_state_dict, healed=healed, in_digest=in_digest, optional=not in_digest
        )

    def register_hooks(self, hooks: StepHooks) -> None:
        """Add a wrapper's step-boundary callbacks (registry.py, ``StepHooks``)."""
        self._registry.register_hooks(hooks)

    def register_optimizer(
        self, optimizer: torch.optim.Optimizer, lr_scheduler: torch.optim.lr_scheduler.LRScheduler | None = None
    ) -> None:
        """The optimizer (and scheduler) a healer's replay steps; their state travels with a heal."""
        self._registry.register_optimizer(optimizer, lr_scheduler)

    def optimizer_parameters(self) -> list[torch.Tensor]:
        """The parameters of the optimizers registered so far (what a healer's replay steps)."""
        return self._registry.optimizer_parameters()

    def annotate_commit(self, **fields: Any) -> None:
        """Add fields to this step's "commit" event (e.g. the data sampler's sample range)."""
        self._driver.current.fields.update(fields)

    # -- checkpoint labels (replicaft/checkpoint/labels.py) -----------------------------------

    def checkpoint_tags(self, *, config: Mapping[str, Any] | None = None, **tags: str | int | float | bool) -> None:
        """Tags for every checkpoint saved from now on, until set again: ``experiment="lr-sweep"``,
        ``epoch=3`` (epoch-end retention reads it), anything else; ``config`` (JSON values) is
        stored as its hash. They land in the manifest and the catalog (``replicaft-ckpt find``).
        Training thread; the writing group's rank 0 values are the ones saved. Raises ValueError."""
        self._persistence.labels.set_tags(config=config, **tags)

    def report_metrics(self, **metrics: float) -> None:
        """Metrics for the next checkpoint only (``loss=loss.item()``): keep-best retention and
        ``replicaft-ckpt find --best`` rank checkpoints by them. Report every step to attach the
        loss of the step a checkpoint holds; ``loss`` also joins the trajectory a resume is
        verified against (resume_check.py). Training thread. Raises ValueError for no number; a
        NaN or inf is a training event, not an error (``non_finite_metric``, metric_reports.py)."""
        self._metric_reports.report(**metrics)

    def state_dict(self) -> dict[str, Any]:
        return self._registry.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._persistence.settle()  # a checkpoint copy still reading the state ends first
        self._registry.load_state_dict(state)

    def _deliver_notice(self, notice: Notice) -> None:
        """Any thread: a lighthouse notice, for the step in progress and the checkpoint cadence."""
        self._notices.deliver(notice)
        if self._persistence.cadence is not None:
            self._persistence.cadence.notice(notice)

    def restore_step(self, step: int) -> None:
        """Continue from ``step`` committed steps, as restored from a checkpoint of the script's
        own (torchft's ``Manager.load_state_dict``); only before the first step."""
        self._driver.restore_step(step)

    def _load_own_state(self, state: dict[str, Any]) -> None:
        self._driver.step = int(state["step"])

    # -- the step (replicaft/step/driver.py) --------------------------------------------------------------------

    def start_quorum(self, timeout_s: float | None = None) -> None:
        """Begin a step: the quorum is asked for in the background, within ``timeout_s`` for
        this step (default: ``quorum_timeout_s``). Training thread."""
        if timeout_s is not None:
            check_option_number("quorum_timeout_s", timeout_s, "start_quorum(timeout_s)")
        self._driver.start_quorum(timeout_s)

    def wait_quorum(self) -> StepPlan | None:
        """The plan of this step, applied; None if the quorum failed (the step will not commit)."""
        return self._driver.wait_quorum()

    def allreduce(self, tensor: torch.Tensor, *, reduce: Reduce = "sum", average: bool = True) -> ManagedWork:
        """Average ``tensor`` in place across the groups that contribute this step (with
        ``average=False``, only SUM or MAX it: the deterministic mode's exact sum). A DTensor
        is refused: it has no storage of its own for Gloo or NCCL to read (each group rank
        averages its local shard, ``replicaft.state.shards.local_shard``)."""
        return self._driver.allreduce(tensor, reduce=reduce, average=average)

    def record_progress(self) -> None:
        """Show the lighthouse that this group's loop is alive between steps: a loop that runs
        long stretches without a step (DiLoCo's inner rounds) calls it now and then, or the
        lighthouse would take it for hung. Any thread."""
        self._progress.record(self._driver.step)

    def report_error(self, error: Exception) -> None:
        """Record that this step must not commit (the first error wins). Training thread.

        The step's remaining all-reduces still run, with zeros, because the other groups run
        them; then ``should_commit()`` returns False everywhere. Skipping backward after it is
        fine with ``DistributedDataParallel``, which runs its buckets' all-reduces itself at
        ``should_commit()``; code that calls ``allreduce`` itself must still make the step's
        calls."""
        self._driver.report_error(error)

    def should_commit(self, timeout_s: float | None = None) -> bool:
        """End the step: True if every rank of every participating group may apply it. Every
        rank of the group calls it once per step; it blocks for a healer's fetch (bounded), the
        "ok" flag's exchange and the group's vote, each under its own deadline (the vote's:
        ``timeout_s`` for this step, default ``collective_timeout_s``)."""
        if timeout_s is not None:
            check_option_number("collective_timeout_s", timeout_s, "should_commit(timeout_s)")
        return self._driver.should_commit(timeout_s)

    # -- queries -------------------------------------------------------------------------------

    def current_step(self) -> int:
        return self._driver.step

    @property
    def plan(self) -> StepPlan | None:
        return self._driver.current.plan

    def is_healing(self) -> bool:
        plan = self._driver.current.plan
        return plan is not None and plan.healing

    def num_participants(self) -> int:
        """Groups contributing real gradients this step (the divisor of the average)."""
        plan = self._driver.current.plan
        return 0 if plan is None else plan.num_contributors

    def errored(self) -> Exception | None:
        return self._driver.current.error

    def step_phases(self) -> dict[str, float]:
        """Where the last finished step's seconds went: ``total`` (``zero_grad`` to the
        decision) and the runtime's parts of it — ``boundary`` (digest, checkpoint start),
        ``quorum`` (the wait left after forward), ``plan`` (applying it), ``allreduce`` (waits
        on gradient buckets), ``flag`` (the "ok" flag), ``vote`` (the group's vote with the
        lighthouse's fence). Also in the "commit" event as ``step_time_s`` and for dashboards."""
        return dict(self._driver.last_phases)

    @property
    def abandon_generation(self) -> int:
        """Bumped whenever a collective is abandoned; its buffers must not be reused."""
        return self._driver.abandon_generation

    def step_seed(self) -> int:
        """A seed for this step's randomness, from (seed, step, replica rank), so a step's result
        depends only on (state, step, membership) and no RNG state has to travel in a heal.
        Blocks until this step's quorum is known (the replica rank comes from it)."""
        plan = self.wait_quorum()
        return step_seed(self.options.seed, self._driver.step, 0 if plan is None else plan.replica_rank)

    def _emit(self, event: str, **fields: Any) -> None:
        """The event sink every part of this rank emits through: adds the step and quorum id."""
        plan = self._driver.current.plan
        fields.setdefault("quorum_id", plan.quorum_id if plan is not None else -1)
        self._events.emit(event, step=self._driver.step, **fields)
