"""Where ``Manager.report_metrics`` goes: the next checkpoint's labels, the resume check's loss,
and, for a value that is NaN or infinite, a training event rather than an error.

A loss that blew up is something training does (a learning rate too high, a bad batch, an
overflow), not a mistake in the call: ``examples/train_ddp.py`` reports every step, and a
raise there killed the group (issue 37). So each non-finite value is a ``non_finite_metric``
event (every time: programs count them), logged when a metric turns non-finite (once per run
of such values, not every step), kept off the checkpoint (labels.py: keep-best never ranks by
it), and handed to the resume check, which judges it a divergence after a resume.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from replicaft.checkpoint.labels import CheckpointLabels
from replicaft.persistence.resume_check import ResumeCheck

logger = logging.getLogger(__name__)


class MetricReports:
    """One rank's reported metrics. Training thread only."""

    def __init__(
        self,
        labels: CheckpointLabels,
        resume_check: ResumeCheck | None,
        emit: Callable[..., None],
        context: str,
    ) -> None:
        self._labels = labels
        self._resume_check = resume_check
        self._emit = emit
        self._context = context
        """``replica_id/group_rank``, for a log line (the event carries the step)."""
        self._non_finite: set[str] = set()
        """Metrics whose last reported value was NaN or infinite."""

    def report(self, **metrics: float) -> None:
        """Raises ValueError for a name or a value that is no number (see labels.py)."""
        non_finite = self._labels.report_metrics(**metrics)
        for name in non_finite:
            value = repr(float(metrics[name]))
            self._emit("non_finite_metric", metric=name, value=value)
            if name not in self._non_finite:
                logger.warning(
                    "[%s] metric %s=%s is not finite; training goes on, the value is recorded "
                    "(non_finite_metric events) and not saved with the checkpoint",
                    self._context,
                    name,
                    value,
                )
        self._non_finite = (self._non_finite - metrics.keys()) | set(non_finite)
        if self._resume_check is not None and "loss" in metrics:
            self._resume_check.report_loss(float(metrics["loss"]))
