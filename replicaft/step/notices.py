"""The lighthouse's notices, as they concern the step in progress.

Notices arrive on another thread (the coordinator's loop on group rank 0, the watch thread on
the others) while the training thread runs its step. What a ``member_lost`` notice means
depends on the step's plan: it aborts the step's collectives only if the lost member is a
participant of this step's quorum (``StepPlan.lost_participant``). A notice can arrive before
the plan is known, so it is kept until the plan is bound, and judged then: a loss that
predates the new quorum is not in it and must not abort its step.

Everything here is guarded by one lock. Without it a notice could read "no plan yet" just
before the training thread binds the plan and scans the notices kept so far, and append
itself after that scan: the step would never be aborted and would wait out its collective
timeout for a peer that is gone (issue 20).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from lighthouse.rules.plan import StepPlan
from lighthouse.wire.protocol import Notice

ABANDONING = frozenset({"member_lost", "member_left", "standing_ended"})
"""Notices that end a participant's part in its quorum: a step of that quorum cannot complete.
A member that left cleanly finished its last step, but a standing quorum (lighthouse/rules/standing.py)
would run the next one with it."""


class StepNotices:
    """Notices for ``replica_id``'s step in progress; ``abort`` is set when they end it."""

    def __init__(self, replica_id: str, on_fenced: Callable[[str], None]) -> None:
        self.replica_id = replica_id
        self.abort = threading.Event()
        """Set when the step's collectives must be abandoned; in-flight waits poll it."""
        self._on_fenced = on_fenced
        self._lock = threading.Lock()
        self._plan: StepPlan | None = None
        self._early: list[Notice] = []
        self._left: dict[str, int] = {}
        """Members that left cleanly since their last quorum with this group, and the steps
        they had committed then."""
        self._lost: set[str] = set()
        """Members lost (failed) since their last quorum with this group."""

    def new_step(self) -> None:
        """Training thread, as a step starts: forget the last step's plan and notices."""
        with self._lock:
            self._plan = None
            self._early = []
            self.abort.clear()

    def bind(self, plan: StepPlan) -> None:
        """Training thread, once the step's plan is known: judge the notices kept so far."""
        with self._lock:
            self._plan = plan
            early, self._early = self._early, []
            for p in plan.participants:
                self._left.pop(p.replica_id, None)
                self._lost.discard(p.replica_id)
        if any(plan.lost_participant(n) for n in early):
            self.abort.set()

    def left(self) -> dict[str, int]:
        """Any thread: the members that left cleanly since they were last in a quorum with this
        group, each with the steps it had committed (a healer whose donors all left finishes
        its heal there: heal/departure.py)."""
        with self._lock:
            return dict(self._left)

    def gone(self) -> frozenset[str]:
        """Any thread: the members lost or left since they were last in a quorum with this
        group (a donor stopping waits for no healer among them: DonorSide.drain)."""
        with self._lock:
            return frozenset(self._lost | self._left.keys())

    def deliver(self, notice: Notice) -> None:
        """Any thread: a notice from the lighthouse."""
        if notice.kind in ABANDONING:
            with self._lock:
                if notice.kind == "member_left":
                    self._left[notice.replica_id] = notice.step
                elif notice.kind == "member_lost":
                    self._lost.add(notice.replica_id)
                plan = self._plan
                if plan is None:
                    self._early.append(notice)
                    return
            if plan.lost_participant(notice):
                self.abort.set()
        elif notice.kind == "registered":
            # This group's session broke and a new one registered: the lighthouse reported the
            # old one lost to the others, who abandon the step it was in, so this side does
            # too (a partition healed after its collective's peers had gone on without it).
            with self._lock:
                bound = self._plan is not None
            if bound:
                self.abort.set()
        elif notice.kind == "fenced" and notice.replica_id == self.replica_id:
            self.abort.set()
            self._on_fenced(notice.reason)
