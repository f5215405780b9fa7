"""Resume verification: does a run resumed from disk train like the run that wrote the checkpoint?

A resume can load the right bytes into the wrong run: another dataset, another loss
normalisation, a changed config, a model built differently. The checkpoint verifies (its
checksums hold), training goes on, and the loss curve bends where nobody looks. So a
checkpoint carries the **loss trajectory** of the steps before it, and after a resume from disk
the first ``resume_verify_steps`` losses of the new run are judged against it.

**The trajectory.** The loss the script reports (``Manager.report_metrics(loss=...)``, which
``examples/train_ddp.py`` calls every step) is recorded when the step commits, as
``(step, loss)`` with the step count *after* the commit, in a ring of the last
:data:`TRAJECTORY_STEPS`. A healing step's loss is not recorded: it was computed on the state
before the heal. The ring is registered state of the group's own (``Manager``,
``healed=False``), so the checkpoint of step S holds the losses of steps <= S, taken at the
same boundary as the weights. Groups report different losses for the same committed state
(each its own batch), so it stays out of the committed digest, and donors do not serve it: a
heal from two donors votes on everything served, and two groups' rings never agree (that
vote failed for every later healer). A healed group starts its own ring; if it becomes the
writer before the ring holds ``2 * resume_verify_steps`` losses, a resume from its checkpoint
is judged ``not_enough_data``.

**What is compared, and why.** After a resume from step S the next steps are S+1, S+2, ...;
the run that wrote the checkpoint may have done them too before it died, but their losses are
in no checkpoint (newer ones would have been loaded), and the event log of the dead run is not
something a training process can count on. So the new losses are compared with the *trend*
before S: the last ``2 * num_steps`` losses of the trajectory (its reference), their mean and
their spread (max - min). The mean of the first ``num_steps`` new losses may differ from the
reference mean by ``tolerance * |mean| + spread``: the spread absorbs the descent of a healthy
curve (losses falling steadily across the window differ from their mean by at most the
window's spread while the new steps are no more than the window), and the relative tolerance
absorbs batch noise. It is lenient by design: it catches a changed loss scale, data set or
model (``examples/train_ddp.py --loss-scale 10`` after a resume is off by seven times what it
allows), not a subtle drift, and a checkpoint taken in the steep first descent allows a lot
(its spread is large); a false alarm on every healthy resume would teach people to ignore it.
A jump either way is a divergence: a loss suddenly much *lower* after a
resume is as suspicious as a higher one (another dataset, a changed reduction). A loss that is
not finite (NaN, inf) in the judged steps is a divergence at once, whatever the reference (no
mean or spread can hold it); it is never recorded in the trajectory, which holds the finite
losses that later verdicts compare against, and the manager reports it as a
``non_finite_metric`` event whether or not a resume is being judged. Rejected: a
per-step comparison against the old run's losses of S+1.. (not available, see above), and a
fitted trend line (a few noisy points extrapolate badly; a mean and a spread are robust and
easy to read in the event).

:func:`decide_resume` is the pure rule; :class:`ResumeCheck` is the shell the manager drives
(training thread only). Its verdict is emitted as a ``resume_verdict`` event, logged, and
reported as the metric ``resume_loss_deviation`` of the next checkpoint (labels.py); with
``resume_verify_action="stop"`` a divergence raises :class:`ResumeDiverged` out of the step's
``should_commit``, before that step's boundary, so no checkpoint of the diverged run is saved.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from replicaft.checkpoint.labels import CheckpointLabels
from replicaft.config.option_ranges import MAX_RESUME_VERIFY_STEPS
from replicaft.errors import ReplicaftError
from replicaft.state.registry import StepHooks

logger = logging.getLogger(__name__)

TRAJECTORY_STEPS = 32
"""Losses a checkpoint carries: a few hundred bytes of ``state.msgpack``, and more than the
reference window of any sensible ``resume_verify_steps`` (2 x 16)."""
assert 2 * MAX_RESUME_VERIFY_STEPS <= TRAJECTORY_STEPS, "the reference window must fit in the trajectory"
MIN_REFERENCE = 2
"""Fewer losses before the checkpoint make no spread; the verdict is then ``not_enough_data``."""
STATE_NAME = "loss_trajectory"
"""Name under which the manager registers the trajectory (registry.py)."""
DEVIATION_METRIC = "resume_loss_deviation"

Outcome = Literal["ok", "diverged", "not_enough_data"]
Action = Literal["warn", "stop"]


class ResumeDiverged(ReplicaftError):
    """After a resume from disk, the first steps' losses left the checkpoint's loss trajectory
    and ``resume_verify_action="stop"``: this group stops rather than train on."""


@dataclass(frozen=True, slots=True)
class ResumeVerdict:
    verdict: Outcome
    checkpoint_step: int
    reference_steps: tuple[int, ...]
    """The trajectory's steps compared against (the last ``2 * num_steps`` up to the checkpoint)."""
    reference_mean: float | None
    reference_spread: float | None
    new_losses: tuple[float, ...]
    new_mean: float | None
    deviation: float | None
    """``|new_mean - reference_mean|``."""
    allowed: float | None
    """``tolerance * |reference_mean| + reference_spread``."""
    tolerance: float
    reason: str

    def fields(self) -> dict[str, Any]:
        """The event's fields (rounded where a float's last digits only add noise)."""

        def r(x: float | None) -> float | str | None:
            """Rounded; a NaN or inf as its name (``"nan"``, ``"inf"``), which JSON has no number for."""
            return None if x is None else round(x, 6) if math.isfinite(x) else repr(x)

        return {
            "verdict": self.verdict,
            "checkpoint_step": self.checkpoint_step,
            "reference_steps": list(self.reference_steps),
            "reference_mean": r(self.reference_mean),
            "reference_spread": r(self.reference_spread),
            "new_losses": [r(x) for x in self.new_losses],
            "new_mean": r(self.new_mean),
            "deviation": r(self.deviation),
            "allowed": r(self.allowed),
            "tolerance": self.tolerance,
            "reason": self.reason,
        }


def decide_resume(
    trajectory: Sequence[tuple[int, float]],
    checkpoint_step: int,
    new_losses: Sequence[float],
    *,
    num_steps: int,
    tolerance: float,
) -> ResumeVerdict:
    """Judge the first ``num_steps`` losses after a resume from ``checkpoint_step`` against the
    ``trajectory`` the checkpoint carried ((step, loss) pairs, any order). Pure."""
    reference = sorted(p for p in trajectory if p[0] <= checkpoint_step)[-2 * num_steps :]
    steps = tuple(s for s, _ in reference)
    new = tuple(new_losses[:num_steps])
    blown = next((i for i, x in enumerate(new) if not math.isfinite(x)), None)
    if blown is not None:
        why = (
            f"the loss of step {checkpoint_step + blown + 1}, {blown + 1} after the resume from step "
            f"{checkpoint_step}, is {new[blown]!r}: training diverged (a loss that is not finite fits no trajectory)"
        )
        return ResumeVerdict("diverged", checkpoint_step, steps, None, None, new, None, None, None, tolerance, why)
    if len(reference) < MIN_REFERENCE or len(new) < num_steps:
        why = (
            f"the checkpoint of step {checkpoint_step} carries {len(reference)} loss(es) of the steps before it; "
            f"{MIN_REFERENCE} are needed (a checkpoint written before losses were reported, or too early)"
            if len(reference) < MIN_REFERENCE
            else f"{len(new)} of {num_steps} losses after the resume were reported"
        )
        return ResumeVerdict(
            "not_enough_data", checkpoint_step, steps, None, None, new, None, None, None, tolerance, why
        )
    losses = [loss for _, loss in reference]
    ref_mean = math.fsum(losses) / len(losses)
    spread = max(losses) - min(losses)
    new_mean = math.fsum(new) / len(new)
    deviation = abs(new_mean - ref_mean)
    allowed = tolerance * abs(ref_mean) + spread
    outcome: Outcome = "ok" if deviation <= allowed else "diverged"
    reason = (
        f"mean loss of steps {checkpoint_step + 1}-{checkpoint_step + len(new)} after the resume is {new_mean:.4g}; "
        f"before it (steps {steps[0]}-{steps[-1]}) {ref_mean:.4g}, spread {spread:.4g}: off by {deviation:.4g}, "
        f"{'within' if outcome == 'ok' else 'beyond'} the {allowed:.4g} allowed "
        f"(resume_verify_tolerance={tolerance:g} x |mean| + spread)"
    )
    return ResumeVerdict(
        outcome, checkpoint_step, steps, ref_mean, spread, new, new_mean, deviation, allowed, tolerance, reason
    )


class ResumeCheck(StepHooks):
    """Records the loss trajectory and, after a resume from disk, judges the steps that follow.

    Training thread only. The manager registers it as step hooks and as state (``STATE_NAME``),
    forwards reported losses to :meth:`report_loss`, and replicaft/persistence/duties.py calls :meth:`resumed`.
    """

    def __init__(
        self,
        *,
        num_steps: int,
        tolerance: float,
        action: Action,
        current_step: Callable[[], int],
        healing: Callable[[], bool],
        labels: CheckpointLabels,
        emit: Callable[..., None],
        context: str,
    ) -> None:
        self._num_steps = num_steps
        self._tolerance = tolerance
        self._action = action
        self._current_step = current_step
        self._healing = healing
        self._labels = labels
        self._emit = emit
        self._context = context
        self._trajectory: deque[tuple[int, float]] = deque(maxlen=TRAJECTORY_STEPS)
        self._pending: float | None = None
        """The loss reported during the step in progress, recorded if it commits."""
        self._resumed_at: int | None = None
        """The checkpoint step of a resume whose verdict is still due."""
        self._new: list[float] = []

    def report_loss(self, loss: float) -> None:
        self._pending = loss

    def resumed(self, checkpoint_step: int) -> None:
        """A resume from disk loaded ``checkpoint_step``; its trajectory is loaded next (state)."""
        if self._num_steps:
            self._resumed_at, self._new = checkpoint_step, []

    # -- StepHooks -----------------------------------------------------------------------------

    def on_step_start(self) -> None:
        self._pending = None

    def on_abort(self) -> None:
        self._pending = None

    def on_commit(self) -> None:
        """The step commits (before the optimizer steps): record its loss, judge a resume."""
        loss, self._pending = self._pending, None
        if loss is None or self._healing():
            return
        if math.isfinite(loss):
            self._trajectory.append((self._current_step() + 1, loss))
        if self._resumed_at is None:
            return
        self._new.append(loss)
        if len(self._new) >= self._num_steps or not math.isfinite(loss):
            resumed_at, self._resumed_at = self._resumed_at, None
            self._judge(
                decide_resume(
                    self._trajectory, resumed_at, self._new, num_steps=self._num_steps, tolerance=self._tolerance
                )
            )

    def _judge(self, verdict: ResumeVerdict) -> None:
        self._emit("resume_verdict", action=self._action, **verdict.fields())
        if verdict.deviation is not None:
            self._labels.report_metrics(**{DEVIATION_METRIC: verdict.deviation})
        if verdict.verdict != "diverged":
            logger.info("[%s] resume verification: %s (%s)", self._context, verdict.verdict, verdict.reason)
            return
        logger.warning(
            "[%s] resume verification: the loss diverged after the resume: %s", self._context, verdict.reason
        )
        if self._action == "stop":
            raise ResumeDiverged(
                f"[{self._context}] after the resume from checkpoint step {verdict.checkpoint_step} the loss diverged: "
                f"{verdict.reason}. Check that the run resumed with the data, model and loss of the run that wrote "
                "it, or raise resume_verify_tolerance, or set resume_verify_action=warn to train on"
            )

    # -- registered state ----------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        return {"steps": [s for s, _ in self._trajectory], "losses": [loss for _, loss in self._trajectory]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Adopt a checkpoint's or a donor's trajectory; a malformed one is dropped with a warning
        (it only informs a verdict, never decides what is loaded)."""
        steps, losses = (state.get("steps"), state.get("losses")) if isinstance(state, dict) else (None, None)
        if (
            not isinstance(steps, list)
            or not isinstance(losses, list)
            or len(steps) != len(losses)
            or not all(isinstance(s, int) and not isinstance(s, bool) for s in steps)
            or not all(isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x) for x in losses)
        ):
            logger.warning("[%s] ignoring a malformed loss trajectory in the loaded state", self._context)
            self._trajectory.clear()
            return
        self._trajectory = deque(zip(steps, (float(x) for x in losses), strict=True), maxlen=TRAJECTORY_STEPS)
