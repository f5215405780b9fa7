"""How a step's participants agree on its end: the column's "ok" flag, then the group's vote.

Both run on the training thread at the end of ``StepDriver.should_commit``, after this rank's
verdict (commit.py) and before the outcome. The flag sums every column rank's verdict over the
column's own sockets (replicaft/column/flag.py), so one rank's failure reaches all of its column;
the vote then gathers the group's ranks at its coordinator, which asks the lighthouse's fence.
Neither raises into the step: a flag that cannot be reduced, or a vote that cannot be reached,
is a step that does not commit.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from lighthouse.rules.plan import StepPlan
from lighthouse.wire.progress import Progress
from replicaft.column.process_group import CollectiveError, FaultTolerantProcessGroup
from replicaft.config.options import ManagerOptions
from replicaft.errors import GroupError
from replicaft.group.protocol import VoteResponse
from replicaft.persistence.duties import Persistence
from replicaft.process.services import RankServices
from replicaft.step.commit import FlagReading, read_flag
from replicaft.step.notices import StepNotices
from replicaft.step.record import StepRecord


class StepAgreement:
    """The flag and the vote of one rank's steps, each under its own deadline."""

    def __init__(
        self,
        options: ManagerOptions,
        services: RankServices,
        column: FaultTolerantProcessGroup,
        notices: StepNotices,
        progress: Progress,
        persistence: Persistence,
    ) -> None:
        self.options = options
        self._services = services
        self._column = column
        self._notices = notices
        self._progress = progress
        self._persistence = persistence

    def reduce_flag(
        self,
        plan: StepPlan | None,
        value: float,
        record: StepRecord,
        step: int,
        report_error: Callable[[Exception], None],
    ) -> FlagReading | None:
        """The column's "ok" flag (commit.py); None when it cannot be reduced."""
        if plan is None or self._column.broken is not None:
            return None
        try:
            with record.timed("flag"):
                total = self._column.reduce_flag(
                    value,
                    plan.max_step,
                    time.monotonic() + self.options.collective_timeout_s,
                    self._notices.abort,
                    lambda: self._progress.record(step),
                )
        except CollectiveError as e:
            report_error(e)
            return None
        reading = read_flag(total)
        if reading.failures:
            report_error(GroupError(f"{reading.failures} participant rank(s) of this column reported a failed step"))
        return reading

    def vote(self, plan: StepPlan | None, step: int, ok: bool, reason: str, timeout_s: float | None) -> VoteResponse:
        """The group's decision on this step; a rank that cannot reach it leaves on its own if
        it was asked to (SIGTERM)."""
        leaving = self._persistence.preempted.is_set()
        assert self._services.channel is not None
        try:
            return self._services.channel.vote(
                step,
                plan.quorum_id if plan is not None else 0,
                ok,
                reason,
                self.options.collective_timeout_s if timeout_s is None else timeout_s,
                leaving=leaving,
            )
        except GroupError as e:
            return VoteResponse(False, f"vote failed: {e}", leaving)
