"""The step, as the training thread drives it, from ``zero_grad`` to the commit.

::

    optimizer.zero_grad() -> start_quorum()   close the last step's boundary (digest,
                                              checkpoint; leave if preempted), then ask the
                                              group for this step's quorum: it forms during forward
                                              (or the last one stands: lighthouse/rules/standing.py)
    loss.backward()       -> allreduce()      wait_quorum() applies the plan (the column group,
                                              a heal, the snapshot served to healers), then each
                                              bucket is summed across the contributing groups
    optimizer.step()      -> should_commit()  seal what was served; a healer's fetch; this rank's
                                              verdict; the column's "ok" flag; the group's vote
                                              (with the lighthouse's fence); then commit (a heal
                                              applied, missed steps replayed) or abort

The ``Manager`` (manager.py) forwards these four calls here unchanged; the methods below follow
them in that order. Decisions are pure functions (commit.py for the verdict, the flag and the
outcome; lighthouse/rules/plan.py for the plan); applying a plan (plan_applier.py), the healer and
donor sides of a heal (heal/), the flag and the vote that end a step (agreement.py) and the duties
at a step boundary (boundary.py) are modules of their own that return outcomes and never call
back here.

Threads: only the training thread runs this code and applies a plan. The quorum forms on the
group coordinator's loop (rank 0) or in gRPC (ranks > 0) and comes back as a future; a heal's
fetch runs on the healer's thread and comes back as a future; lighthouse notices reach the
step through :class:`StepNotices`, which is thread-safe. Nothing else crosses threads.

A peer's failure never raises into the user's loop: it is recorded (``report_error``), later
collectives of the step become no-ops, and the step does not commit. What raises:
misconfiguration, ``max_quorum_failures`` consecutive quorum failures, and ``GroupBroken`` at
the end of a step whose group cannot go on.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import torch

from lighthouse.errors import QuorumTimeout, TlsRefused, Unauthenticated, VersionMismatch
from lighthouse.rules.plan import StepPlan
from lighthouse.wire.progress import Progress
from replicaft.column.process_group import (
    CollectiveError,
    CollectiveHandle,
    FaultTolerantProcessGroup,
    ManagedWork,
    Reduce,
)
from replicaft.config.options import ManagerOptions
from replicaft.errors import CheckpointStoreUnavailable, GroupBroken, GroupError
from replicaft.heal.donor import DonorSide
from replicaft.heal.healer import Healer
from replicaft.persistence.duties import Persistence
from replicaft.process.faults import reached
from replicaft.process.services import RankServices
from replicaft.state.registry import StateRegistry
from replicaft.state.shards import check_not_sharded
from replicaft.step.agreement import StepAgreement
from replicaft.step.boundary import StepBoundary
from replicaft.step.commit import RankInputs, rank_verdict, rank_vote, step_outcome
from replicaft.step.notices import StepNotices
from replicaft.step.plan_applier import PlanApplier
from replicaft.step.quorum_wait import wait_for_answer
from replicaft.step.record import StepRecord, check_restore_step

logger = logging.getLogger(__name__)

QUORUM_WAIT_GRACE_S = 5.0

Emit = Callable[..., None]


class StepDriver:
    """One rank's steps. Built by the Manager; every method runs on the training thread."""

    def __init__(
        self,
        options: ManagerOptions,
        *,
        registry: StateRegistry,
        services: RankServices,
        column: FaultTolerantProcessGroup,
        applier: PlanApplier,
        healer: Healer,
        donor: DonorSide,
        persistence: Persistence,
        boundary: StepBoundary,
        notices: StepNotices,
        progress: Progress,
        emit: Emit,
        faults: frozenset[tuple[str, int]],
    ) -> None:
        self.options = options
        self._registry = registry
        self._services = services
        self._column = column
        self._applier = applier
        self._healer = healer
        self._donor = donor
        self._persistence = persistence
        self._boundary = boundary
        self._notices = notices
        self._progress = progress
        self._emit_event = emit
        self._faults = faults
        self._agreement = StepAgreement(options, services, column, notices, progress, persistence)
        self.step = 0
        """Committed steps so far: registered state, so it travels with a heal and a checkpoint."""
        self.current = StepRecord(0, self._reported)
        self.abandon_generation = 0
        """Bumped whenever a collective is abandoned: its buffers must not be reused."""
        self._commit_failures = self._quorum_failures = 0
        self._broken: GroupBroken | None = None
        self._leaving = False
        """The group's last vote said a rank was asked to stop: leave at the next boundary."""
        self._last_own_s: float | None = None
        """The last step's own time, published with the quorum request (heal/__init__.py)."""
        self.last_phases: dict[str, float] = {}
        """Where the last finished step's time went (``Manager.step_phases``)."""

    def restore_step(self, step: int) -> None:
        """Set the committed steps before the first step: every group's first quorum request
        carries it, and a change once the job has started would fork the history."""
        check_restore_step(step, self.step, started=self.current.quorum is not None or self.step != 0)
        self.step = step

    def close(self) -> None:
        """Before the rank stops: close the last committed step's boundary, then serve the
        healers still fetching from this rank (DonorSide.drain, heal/departure.py)."""
        self._boundary.close(self.current.plan)
        self._donor.drain(self.options.heal_timeout_s, self._notices.gone, self._progress)

    # -- 1. start ------------------------------------------------------------------------------

    def start_quorum(self, timeout_s: float | None = None) -> None:
        """Begin a step: close the last one's boundary, then ask for this step's quorum (within
        ``timeout_s``, or the manager's ``quorum_timeout_s``)."""
        closing = time.monotonic()
        self._boundary.close(self.current.plan)
        boundary_s = time.monotonic() - closing
        if self._leaving:
            self._boundary.leave_preempted(self.step, self.current.plan)
        last = self.current
        if last.quorum is not None and not last.quorum.done():
            raise GroupError("start_quorum() called twice in one step; call should_commit() in between")
        self._seal(last)  # a step that never reached should_commit (its loop raised)
        self.current = s = StepRecord(self.step, self._reported)
        s.phases["boundary"] = boundary_s
        self._notices.new_step()
        self._registry.step_started()
        self._progress.record(self.step)
        assert self._services.channel is not None, "start() the manager first"
        rank_data: dict[str, Any] = {
            **self._services.rank_addresses,
            **self._healer.rank_data(),
            **self._donor.rank_data(),
        }
        if self._last_own_s is not None:
            rank_data["own_step_s"] = self._last_own_s
        s.quorum_timeout_s = self.options.quorum_timeout_s if timeout_s is None else timeout_s
        s.quorum = self._services.channel.ask_quorum(
            self.step, s.quorum_timeout_s, commit_failures=self._commit_failures, rank_data=rank_data
        )

    # -- 2. the plan ---------------------------------------------------------------------------

    def wait_quorum(self) -> StepPlan | None:
        """The plan of this step, applied (plan_applier.py); None if the quorum failed (the step
        will not commit)."""
        s = self.current
        if s.plan is not None or s.quorum is None:
            return s.plan
        try:
            o = self.options
            with s.timed("quorum"):
                answer = wait_for_answer(
                    s.quorum, s.quorum_timeout_s + o.connect_timeout_s + QUORUM_WAIT_GRACE_S, self._still_waiting
                )
            if isinstance(answer, str):
                self.report_error(GroupError(answer))
            else:
                with s.timed("plan", blocked=False):
                    s.plan = self._applier.apply(answer, self.step, self.report_error)
                self._progress.healing = self._healer.healing
                self._quorum_failures = 0
        except GroupBroken as e:
            self._broken = e  # raised at the end of the step, where the loop can take it
            self.report_error(e)
        except (Unauthenticated, TlsRefused, VersionMismatch, CheckpointStoreUnavailable) as e:
            # Retrying cannot help (a wrong token, CA or version; a store that never answered
            # whether a checkpoint exists): every later step would fail the same way.
            self.report_error(e)
            raise
        except (QuorumTimeout, GroupError) as e:
            self._quorum_failures += 1
            self.report_error(e)
            if self._quorum_failures >= self.options.max_quorum_failures:
                raise
        except Exception as e:
            self.report_error(e)
        finally:
            s.quorum = None
        return s.plan

    def _still_waiting(self) -> str | None:
        """While the quorum forms: record progress; why to stop waiting: SIGTERM (``start_quorum``
        leaves at the boundary), or a heal finished as its donors all left (heal/departure.py)."""
        self._progress.record(self.step)
        if self._persistence.preempted.is_set():
            return "preempted (SIGTERM) while waiting for the quorum"
        healed = self._healer.finish_if_donors_left(self._notices.left())
        if healed is None:
            return None
        self.step = healed
        self._boundary.committed(healed)
        return f"every donor of this group's heal left at step {healed}: healed to it, no group left to step with"

    # -- 3. all-reduce -------------------------------------------------------------------------

    def allreduce(self, tensor: torch.Tensor, *, reduce: Reduce = "sum", average: bool = True) -> ManagedWork:
        """Average ``tensor`` in place across the groups that contribute this step; with
        ``average=False`` only reduce it (SUM or MAX, replicaft/deterministic/rules.py: a healer's zeros count)."""
        check_not_sharded(tensor, "allreduce")
        s = self.current
        plan = self.wait_quorum()
        if plan is None:
            return ManagedWork(tensor, lambda: s.error is None)
        # A step that already failed (report_error, a fetch that failed) still runs the
        # collectives its peers run, with zeros: a rank that skipped one would meet their next
        # operation with its own (its next step's), and Gloo aborts the process on a mismatch.
        # A broken column refuses the operation at once (CollectiveError below).
        failed = s.error is not None
        if plan.healing or failed:
            tensor.zero_()
        try:
            handle = self._column.allreduce(tensor, reduce=reduce)
        except CollectiveError as e:
            self.report_error(e)
            return ManagedWork(tensor, lambda: False)
        reached(self._faults, "allreduce", self.step)
        return ManagedWork(
            tensor,
            lambda: (
                self._wait_collective(s, handle, "allreduce")
                and not failed
                and _divide(tensor, plan.num_contributors if average else 1)
            ),
        )

    def _wait_collective(self, s: StepRecord, handle: CollectiveHandle, phase: str) -> bool:
        try:
            with s.timed(phase):
                handle.wait(
                    time.monotonic() + self.options.collective_timeout_s,
                    self._notices.abort,
                    lambda: self._progress.record(self.step),
                )
            return True
        except CollectiveError as e:
            self.report_error(e, abandoned=True)
            return False

    def report_error(self, error: Exception, *, abandoned: bool = False) -> None:
        """Record that this step must not commit; the first error wins. Training thread."""
        self.abandon_generation += abandoned
        self.current.fail(error)

    def _reported(self, error: Exception) -> None:
        self._log(logging.WARNING, "step will not commit: %s", error)
        self._emit("collective_error", error=f"{type(error).__name__}: {error}")

    # -- 4. commit -----------------------------------------------------------------------------

    def should_commit(self, timeout_s: float | None = None) -> bool:
        """End the step: True if every rank of every participating group may apply it; the
        group's vote within ``timeout_s`` (or the manager's ``collective_timeout_s``).

        Every rank of the group calls it once per step. Blocks for a healer's fetch (bounded),
        the "ok" flag's exchange and the group's vote, each under its own deadline.
        """
        s = self.current
        plan = self.wait_quorum()
        if plan is not None:
            self._registry.before_vote()
        self._last_own_s = round(s.own_s(), 4)
        self._seal(s)
        if plan is not None and plan.healing:
            self._healer.wait(plan, s.own_s())
        if self._applier.resume_pending and plan is not None:
            self._applier.resume_pending = False
            self._boundary.resume_from_disk(plan, self.report_error)
        ready = self._healer.ready(plan) if plan is not None and plan.healing else True
        if isinstance(ready, Exception):
            self.report_error(ready)
        inputs = RankInputs.of(
            plan,
            caught_up=ready is True,
            holding=self._healer.holding,
            min_replicas=self.options.min_replicas,
            error=s.error,
        )
        verdict = rank_verdict(inputs)
        flag = self._agreement.reduce_flag(plan, verdict.flag, self.current, self.step, self.report_error)
        # A fetch deferred past the collectives starts here: every donor sealed its snapshot
        # before reducing the flag, so no send from its live state can hold its step now.
        self._healer.start_deferred()
        vote = rank_vote(inputs, verdict, flag, None if s.error is None else str(s.error))
        with s.timed("vote", blocked=False):
            decision = self._agreement.vote(plan, self.step, vote.ok, vote.reason, timeout_s)
        self._leaving = decision.leave
        outcome = step_outcome(inputs.healing, verdict, flag, decision.commit)
        # A checkpoint copy may still be running behind this step: it must end before anything
        # below writes the state (a heal's catch-up, the hooks, the optimizer).
        self._persistence.settle()
        reached(self._faults, "commit", self.step)
        if outcome.record and plan is not None:
            self._healer.record(plan, self._registry.capture())
        if outcome.apply_heal:
            self._healer.apply()
        self._finish(plan, decision.commit, decision.reason, failed=outcome.failed)
        if self._broken is not None:
            self._emit("stop", reason=str(self._broken))
            raise self._broken
        return decision.commit

    def _seal(self, s: StepRecord) -> None:
        why = self._donor.seal(s.own_s())
        if why is not None:
            self.report_error(GroupError(why))

    def _finish(self, plan: StepPlan | None, commit: bool, reason: str, *, failed: bool) -> None:
        s = self.current
        if commit:
            assert plan is not None
            self._registry.committed()
            self.step = plan.max_step + 1
            self._commit_failures = 0
            self._boundary.committed(self.step)
        else:
            self._registry.aborted()
            self._commit_failures += failed
        s.phases["total"] = time.monotonic() - s.started
        self.last_phases = s.phases
        self._emit(
            "commit",
            quorum_id=plan.quorum_id if plan else -1,
            committed=commit,
            reason=reason,
            num_contributors=plan.num_contributors if plan else 0,
            healing=bool(plan and plan.healing),
            step_time_s=s.phases["total"],
            **s.fields,
        )
        self._progress.healing = self._healer.healing
        self._progress.record(self.step)

    # -- progress, events, logs ----------------------------------------------------------------

    def _emit(self, event: str, **fields: Any) -> None:
        self._emit_event(event, **fields)

    def _log(self, level: int, msg: str, *args: Any) -> None:
        o, plan = self.options, self.current.plan
        logger.log(
            level,
            "[%s/%d step=%d quorum=%s] " + msg,
            o.replica_id,
            o.group_rank,
            self.step,
            plan.quorum_id if plan is not None else "-",
            *args,
        )


def _divide(tensor: torch.Tensor, divisor: int) -> bool:
    if divisor > 1:
        tensor.div_(divisor)
    return True
