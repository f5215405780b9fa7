"""What one step learned and where its time went (replicaft/step/driver.py drives it)."""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Callable
from typing import Any

from lighthouse.rules.plan import StepPlan
from replicaft.errors import StateError
from replicaft.group.client import QuorumAnswer


class StepRecord:
    """The step in progress: made by ``start_quorum``, used by the training thread only.

    It keeps what the step learned (its quorum, its plan), the first error that makes it fail
    (a later one changes nothing), and where its time went: ``phases`` (``Manager.step_phases``)
    names the waits the runtime adds, and the time blocked on the quorum and on collectives is
    not the step's own: the rest is its forward and backward, which bounds the waits of a heal
    (heal/__init__.py).
    """

    def __init__(self, number: int, report: Callable[[Exception], None]) -> None:
        self.number = number
        self.started = time.monotonic()
        self.quorum: concurrent.futures.Future[QuorumAnswer] | None = None
        self.quorum_timeout_s = 0.0
        """The deadline the quorum was asked with (``start_quorum``'s, or the manager's)."""
        self.plan: StepPlan | None = None
        self.error: Exception | None = None
        self.blocked_s = 0.0
        self.phases: dict[str, float] = {}
        self.fields: dict[str, Any] = {}
        """Extra fields of the step's "commit" event (``Manager.annotate_commit``)."""
        self._report = report

    def fail(self, error: Exception) -> None:
        if self.error is None:
            # Kept without its traceback and chained exceptions: their frames hold this step and
            # a collective's handle, a reference cycle that only the cyclic collector breaks, on
            # whatever thread it runs; freeing a failed Gloo work or group there aborted the
            # process ("terminate called recursively", seen). Freed by reference counting, they
            # go when the step does, on this thread. The message says what failed.
            error.__traceback__ = error.__cause__ = error.__context__ = None
            self.error = error
            self._report(error)

    def own_s(self) -> float:
        return max(0.0, time.monotonic() - self.started - self.blocked_s)

    def timed(self, phase: str, *, blocked: bool = True) -> _Timed:
        return _Timed(self, phase, blocked)


class _Timed:
    """``with step.timed(phase):`` adds the block's time to the phase and, for a wait on others
    (``blocked``), to the step's blocked time."""

    def __init__(self, step: StepRecord, phase: str, blocked: bool) -> None:
        self._step = step
        self._phase = phase
        self._blocked = blocked

    def __enter__(self) -> None:
        self._from = time.monotonic()

    def __exit__(self, *exc: object) -> None:
        took = time.monotonic() - self._from
        self._step.phases[self._phase] = self._step.phases.get(self._phase, 0.0) + took
        if self._blocked:
            self._step.blocked_s += took


def check_restore_step(step: object, current: int, *, started: bool) -> None:
    """Raise StateError unless ``step`` may be restored now (``StepDriver.restore_step``)."""
    if started:
        raise StateError(
            f"restore_step({step}) after the job started (at step {current}); restore the step "
            "before the first start_quorum(), as a resume does"
        )
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise StateError(f"restore_step({step!r}): the step is a count of committed steps, an int >= 0")
