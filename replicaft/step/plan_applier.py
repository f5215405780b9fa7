"""A step's plan, applied to this rank: its column group, and its part in a heal.

Every manager derives the same :class:`~lighthouse.rules.plan.StepPlan` from a quorum (pure,
lighthouse/rules/plan.py). What the plan then asks of one rank is I/O, done here on the training
thread when the step first needs the plan (its first all-reduce, at the latest its commit):

* on the first quorum a process joins: decide whether to resume from disk (every participant
  at step 0 and a checkpoint on disk: every group died, or the job restarts; replicaft/persistence/duties.py).
  The question stays open until it is answered: a step whose question the object store could
  not answer does not commit, and the next quorum asks again (issue 37);
* at step 0, with ``init_sync``, every group but one heals from it, so all start identical;
* a healer starts (or keeps) its fetch (heal/healer.py); a donor publishes the snapshot its
  healers need (heal/donor.py);
* rebuild the column process group when the quorum changed (process_group.py);
* the ``quorum`` event.
"""

from __future__ import annotations

from collections.abc import Callable

from lighthouse.rules.plan import StepPlan, plan_step
from replicaft.column.process_group import ColumnSpec, FaultTolerantProcessGroup
from replicaft.config.options import ManagerOptions
from replicaft.errors import GroupError
from replicaft.group.client import QuorumAnswer
from replicaft.heal.donor import DonorSide
from replicaft.heal.healer import Healer
from replicaft.persistence.duties import Persistence
from replicaft.process.faults import reached
from replicaft.step.notices import StepNotices

Emit = Callable[..., None]


class PlanApplier:
    """Applies each step's plan for one rank. Training thread only."""

    def __init__(
        self,
        options: ManagerOptions,
        *,
        init_sync: bool,
        column: FaultTolerantProcessGroup,
        healer: Healer,
        donor: DonorSide,
        persistence: Persistence,
        notices: StepNotices,
        emit: Emit,
        faults: frozenset[tuple[str, int]],
    ) -> None:
        self._options = options
        self._init_sync = init_sync
        self._column = column
        self._healer = healer
        self._donor = donor
        self._persistence = persistence
        self._notices = notices
        self._emit = emit
        self._faults = faults
        self._resume_open = True
        """Whether to resume from disk is still to be decided (a first quorum not yet answered)."""
        self.resume_pending = False
        """This process's first quorum found nobody ahead and a checkpoint on disk: the step
        loads it (at its end) and does not commit."""

    def apply(self, answer: QuorumAnswer, step: int, report_error: Callable[[Exception], None]) -> StepPlan:
        """``report_error``: the step's, for a resume question the object store could not answer."""
        plan = plan_step(answer.quorum, self._options.replica_id)
        if self._resume_open:
            self._decide_resume(plan, report_error)
        if self._init_sync and plan.max_step == 0 and len(plan.donors) > 1 and not self.resume_pending:
            plan = plan.with_one_donor()
        self._notices.bind(plan)
        sizes = sorted({m.world_size for m in plan.participants})
        if sizes != [self._options.group_world_size]:
            raise GroupError(
                f"groups of the quorum have {sizes} ranks; every group must have the same W "
                f"(this one has {self._options.group_world_size})"
            )
        # The heal's fetch first: it runs on its own thread while the column group's rendezvous
        # (a new quorum's) blocks this one.
        if plan.healing:
            if self._healer.begin(plan, withdrawn=lambda base: self._donor.withdrew(plan, base)):
                reached(self._faults, "heal", step)
        else:
            self._healer.not_healing(plan)
            self._donor.serve(plan, step)
        column = self._column
        reconfigured = column.spec is None or column.spec.quorum_id != plan.quorum_id or column.broken is not None
        if reconfigured:
            column.configure(ColumnSpec.for_plan(plan, self._options.group_rank), self._notices.abort)
        self._emit(
            "quorum",
            quorum_id=plan.quorum_id,
            latency_s=answer.latency_s,
            num_replicas=plan.num_replicas,
            replica_rank=plan.replica_rank,
            max_step=plan.max_step,
            healing=plan.healing,
            participants=[m.replica_id for m in plan.participants],
            reconfigured=reconfigured,
        )
        return plan

    def _decide_resume(self, plan: StepPlan, report_error: Callable[[Exception], None]) -> None:
        """Resume from disk only if every participant is at step 0 and a checkpoint exists; a
        peer ahead is healed from instead. Raises CheckpointStoreUnavailable (duties.py)."""
        if plan.max_step > 0 or not self._persistence.enabled:
            self._resume_open = False
            return
        found = self._persistence.ask_resume()
        if found is None:
            report_error(GroupError("waiting for the object store to say whether a checkpoint exists"))
            return
        self._resume_open = False
        self.resume_pending = found
