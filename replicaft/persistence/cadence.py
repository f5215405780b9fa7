"""``checkpoint_interval="auto"``: the writer's interval, recomputed as the job measures its saves and failures.

The rule is pure and lives in replicaft/checkpoint/cadence.py (read it for the why: Young/Daly,
and why the failures that count are the total ones). This is its shell, owned by the
rank's :class:`~replicaft.persistence.duties.Persistence`: it gathers the inputs, asks the rule and
says what it decided.

* **Inputs.** Training time and the groups taking part, at every committed step's boundary;
  member losses from the lighthouse's ``member_lost`` notices (any thread; one per lost member
  and quorum, so the notice a failover sends again is not counted twice); each periodic
  save's blocked time and write time; a resume from disk (a total failure).
* **State.** The failure history is registered with the manager as state (``STATE_NAME``,
  outside the digest), so it travels with a heal and is saved in each checkpoint: a group
  that restarts, or a job that resumes from disk, keeps counting where the job was, and
  total failures, which kill every process that saw them, are counted at all.
* **Output.** ``interval_s()`` for the writer, and a ``checkpoint_cadence`` event with every
  input whenever the interval first is chosen or moves by more than ``CHANGE_TO_REPORT``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, fields, replace
from typing import Any

from lighthouse.wire.protocol import Notice
from replicaft.checkpoint.cadence import (
    CadenceDecision,
    CadenceLimits,
    FailureHistory,
    decide_interval,
    observe,
)

logger = logging.getLogger(__name__)

STATE_NAME = "checkpoint_cadence"
"""Name under which the manager registers the failure history."""
NUM_SAVES_MEASURED = 3
"""The cost is the mean of the last few saves: one slow save (a busy disk) should not halve
the checkpoint rate, and a model that grew should show within a few saves."""
CHANGE_TO_REPORT = 0.1
"""Report (and log) a new interval when it moves by more than this fraction."""


class AutoCadence:
    """The training thread calls everything but :meth:`notice` (any thread)."""

    def __init__(
        self, limits: CadenceLimits, emit: Callable[..., None], clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.limits = limits
        self._emit = emit
        self._clock = clock
        self._history = FailureHistory()
        self._lock = threading.Lock()
        self._losses_seen: set[tuple[str, int, int]] = set()
        self._new_losses = 0
        self._last_observed: float | None = None
        self._saves: deque[tuple[float, float]] = deque(maxlen=NUM_SAVES_MEASURED)
        self._reported: CadenceDecision | None = None

    # -- inputs ----------------------------------------------------------------------------------

    def notice(self, notice: Notice) -> None:
        """Any thread: a lighthouse notice; a member loss is counted once per member and quorum."""
        if notice.kind != "member_lost":
            return
        key = (notice.replica_id, notice.incarnation, notice.quorum_id)
        with self._lock:
            if key not in self._losses_seen:
                self._losses_seen.add(key)
                self._new_losses += 1

    def observe(self, num_groups: int) -> None:
        """At a committed step's boundary, with the groups of its quorum."""
        now = self._clock()
        seconds = 0.0 if self._last_observed is None else now - self._last_observed
        self._last_observed = now
        with self._lock:
            losses, self._new_losses = self._new_losses, 0
        history = observe(self._history, seconds=seconds, num_groups=num_groups)
        self._history = replace(history, member_losses=history.member_losses + losses)

    def save_measured(self, blocked_s: float, write_s: float) -> None:
        """A periodic save finished: the training thread waited ``blocked_s`` for it, and the
        writer took ``write_s`` to publish it."""
        self._saves.append((blocked_s, write_s))

    def resumed(self) -> None:
        """This group resumed from disk: every group was gone (after the loaded history)."""
        self._history = replace(self._history, total_failures=self._history.total_failures + 1)
        self._last_observed = None

    # -- the decision ----------------------------------------------------------------------------

    def interval_s(self) -> float:
        """The interval to save at now, reported when it changed."""
        blocked = write = None
        if self._saves:
            blocked = sum(b for b, _ in self._saves) / len(self._saves)
            write = sum(w for _, w in self._saves) / len(self._saves)
        decision = decide_interval(blocked_s=blocked, write_s=write, history=self._history, limits=self.limits)
        previous = self._reported
        if (
            previous is None
            or previous.mtbf.source != decision.mtbf.source
            or previous.cost_s is None
            and decision.cost_s is not None
            or abs(decision.interval_s - previous.interval_s) > CHANGE_TO_REPORT * previous.interval_s
        ):
            self._reported = decision
            self._report(decision, blocked, write)
        return decision.interval_s

    def _report(self, d: CadenceDecision, blocked_s: float | None, write_s: float | None) -> None:
        logger.info("checkpoint interval %.3gs: %s", d.interval_s, d.reason)
        h = self._history
        self._emit(
            "checkpoint_cadence",
            interval_s=d.interval_s,
            rule_s=d.rule_s,
            cost_s=d.cost_s,
            blocked_s=blocked_s,
            write_s=write_s,
            num_saves_measured=len(self._saves),
            mtbf_s=d.mtbf.seconds,
            mtbf_source=d.mtbf.source,
            min_s=self.limits.min_s,
            max_s=self.limits.max_s,
            prior_mtbf_s=self.limits.prior_mtbf_s,
            min_total_failures=self.limits.min_total_failures,
            history=asdict(h),
            reason=d.reason,
        )

    # -- state -----------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        return asdict(self._history)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Adopt a donor's or a checkpoint's history; a malformed one is ignored, with a warning
        (it steers only the interval, and the interval stays within its limits)."""
        values = {}
        for f in fields(FailureHistory):
            value = state.get(f.name) if isinstance(state, dict) else None
            if not isinstance(value, int | float) or isinstance(value, bool) or not value >= 0:
                logger.warning(
                    "ignoring the loaded checkpoint cadence history %r (%s=%r is not a count >= 0)",
                    state,
                    f.name,
                    value,
                )
                return
            values[f.name] = type(getattr(FailureHistory(), f.name))(value)
        self._history = FailureHistory(**values)

    @property
    def history(self) -> FailureHistory:
        return self._history
