"""What persistent checkpoints add to a rank's state registry, and where reported metrics go.

The checkpoint duties' own state (the lineage, what was saved) travels with heals and is saved
with each checkpoint; with checkpoints on, the loss trajectory a resume from disk is verified
against (resume_check.py) is saved but never healed (each group keeps its own), and the
automatic cadence's failure history (cadence.py) is carried where it exists. The manager calls
this once, at construction, after its own state.
"""

from __future__ import annotations

from collections.abc import Callable

from replicaft.config.options import ManagerOptions
from replicaft.persistence.cadence import STATE_NAME as CADENCE_STATE
from replicaft.persistence.duties import STATE_NAME as CHECKPOINT_STATE
from replicaft.persistence.duties import Persistence
from replicaft.persistence.metric_reports import MetricReports
from replicaft.persistence.resume_check import STATE_NAME as TRAJECTORY_STATE
from replicaft.persistence.resume_check import ResumeCheck
from replicaft.state.registry import StateRegistry


def register_checkpoint_state(
    o: ManagerOptions,
    registry: StateRegistry,
    persistence: Persistence,
    *,
    current_step: Callable[[], int],
    healing: Callable[[], bool],
    emit: Callable[..., None],
) -> MetricReports:
    """Register the checkpoint states of ``persistence`` in ``registry``; returns where
    ``Manager.report_metrics`` sends the metrics (the labels, and the resume check if any)."""
    context = f"{o.replica_id}/{o.group_rank}"
    registry.register_state(CHECKPOINT_STATE, persistence.state_dict, persistence.load_state_dict, in_digest=False)
    check: ResumeCheck | None = None
    if persistence.enabled:
        check = ResumeCheck(
            num_steps=o.resume_verify_steps,
            tolerance=o.resume_verify_tolerance,
            action=o.resume_verify_action,
            current_step=current_step,
            healing=healing,
            labels=persistence.labels,
            emit=emit,
            context=context,
        )
        registry.register_state(TRAJECTORY_STATE, check.state_dict, check.load_state_dict, healed=False)
        registry.register_hooks(check)
        persistence.on_resumed = check.resumed
    if persistence.cadence is not None:
        registry.register_state(
            CADENCE_STATE,
            persistence.cadence.state_dict,
            persistence.cadence.load_state_dict,
            in_digest=False,
            optional=True,
        )
    return MetricReports(persistence.labels, check, emit, context)
