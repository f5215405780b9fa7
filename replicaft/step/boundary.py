"""The step boundary: what a rank does between a committed step and the next, and at its edges.

After a committed step, once the optimizer has stepped (so at the next ``start_quorum``, or at
shutdown), the committed state is in place and nothing writes it until the next step's
optimizer step. That is when:

* the state's digest is emitted (the chaos harness compares it across groups, step by step);
* once per process, the state's size is reported (the launcher sizes a standby's reserve by it);
* the writer group (replica rank 0 of the quorum that committed) starts a due checkpoint.

And at the two edges of a run: a group whose first quorum is all at step 0 resumes from disk
(replicaft/persistence/duties.py says when), and a group asked to stop (SIGTERM) saves, if it is the writer,
and leaves.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import NoReturn

from lighthouse.rules.plan import StepPlan
from replicaft.checkpoint.telemetry import load_fields
from replicaft.errors import GroupError
from replicaft.persistence.duties import PREEMPTED_EXIT_CODE, Persistence
from replicaft.process import reserve
from replicaft.state.flat import step_digest
from replicaft.state.registry import StateRegistry
from replicaft.telemetry.events import EventLog

logger = logging.getLogger(__name__)

Emit = Callable[..., None]


class StepBoundary:
    """One rank's boundary duties. Training thread only."""

    def __init__(
        self, digest_every_steps: int, registry: StateRegistry, persistence: Persistence, events: EventLog, emit: Emit
    ) -> None:
        self._digest_every_steps = digest_every_steps
        self._registry = registry
        self._persistence = persistence
        self._events = events
        self._emit = emit
        self._due: int | None = None
        self._state_size_reported = False

    def committed(self, step: int) -> None:
        """Step ``step`` committed; its boundary is closed once the optimizer has stepped."""
        self._due = step

    def close(self, plan: StepPlan | None) -> None:
        """Close a committed step's boundary, if one is due: digest, state size, checkpoint."""
        step, self._due = self._due, None
        if step is None:
            return
        if self._events.path is not None:
            if self._digest_every_steps and step % self._digest_every_steps == 0:
                self._emit("committed", digest=step_digest(self._registry.flat(in_digest_only=True)))
            if not self._state_size_reported:
                self._state_size_reported = True
                self._report_state_size()
        self._persistence.after_commit(
            step,
            is_writer=plan is not None and plan.replica_rank == 0,
            state=self._registry.state_dict,
            quorum_id=plan.quorum_id if plan is not None else -1,
            num_groups=plan.num_replicas if plan is not None else 1,
        )

    def _report_state_size(self) -> None:
        """Once per process, after its first commit (the optimizer's state exists by then)."""
        sizes = [(t.numel() * t.element_size(), t.device.type) for t in self._registry.flat().tensors]
        held = reserve.installed()
        self._emit(
            "state_size",
            num_bytes=sum(n for n, _ in sizes),
            cpu_bytes=sum(n for n, d in sizes if d == "cpu"),
            reserve_bytes=held.num_bytes if held else 0,
            reserve_used_bytes=held.used_bytes if held else 0,
        )

    def resume_from_disk(self, plan: StepPlan, report_error: Callable[[Exception], None]) -> None:
        """Load the newest valid checkpoint; the step that loaded it does not commit."""
        self._persistence.settle()
        started = time.monotonic()
        loaded = self._persistence.load_latest(self._registry.state_dict(), occasion=plan.store_prefix)
        if loaded is None:
            logger.warning("no valid checkpoint to resume from; starting at step 0")
            return
        self._registry.load_state_dict(loaded.state)
        load_s = time.monotonic() - started
        if self._persistence.cadence is not None:
            self._persistence.cadence.resumed()  # after the loaded history: a total failure
        self._emit(
            "resume",
            checkpoint_step=loaded.step,
            path=str(loaded.path),
            digest=step_digest(self._registry.flat(in_digest_only=True)),
            **load_fields(loaded.state, loaded.path, self._persistence.options.checkpoint_tier2_dir, load_s),
        )
        report_error(GroupError(f"resumed from checkpoint step {loaded.step} ({loaded.path}); this step only loaded"))

    def leave_preempted(self, step: int, plan: StepPlan | None) -> NoReturn:
        """SIGTERM reached a rank of this group, and the group's vote on the last step said so
        to every rank: all ranks are at the same step boundary. The writer group saves what it
        has (every rank its shards); every group then exits."""
        if plan is not None and plan.replica_rank == 0:
            self._persistence.emergency_save(step, self._registry.state_dict, plan.quorum_id)
        self._emit("stop", reason=f"preempted ({self._persistence.preemption_reason})")
        raise SystemExit(PREEMPTED_EXIT_CODE)
