"""Lightning's loop counters, derived from the committed steps instead of counted by the loop.

Lightning counts an optimizer step, a batch and a logging step every time its loop runs one,
whether or not the step changed the model. Under replicaft a step may not commit (a peer died
mid-step), and a healed group jumps to its donors' step. So after each step's decision the
strategy sets every counter from one number, the committed steps ``n``
(``Manager.current_step()``), which every group agrees on and heals and checkpoints carry:
``global_step`` is ``n``, the epoch and the batch within it follow from ``n`` and the epoch
length, and the logging step is ``n`` too. A step that does not commit leaves them where they
were, so its retry runs under the same ``global_step`` and ``batch_idx``.

With ``accumulate_grad_batches=k`` a step is k of Lightning's batches: the counters of
optimizer steps are as above, the batch counters k times theirs, so a step that does not
commit rewinds all k of its batches and its retry starts again at the first.

``counters_after`` is the rule (pure); ``set_counters`` writes it into the loops *before*
Lightning's own increments that follow the optimizer step in the same batch, so they land on
the derived values.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class LoopCounters:
    """Where Lightning's loops stand once the current batch's bookkeeping is done."""

    global_step: int
    epoch: int
    """The epoch the current batch belongs to (``trainer.current_epoch`` during it)."""
    batches_in_epoch: int
    """Batches of ``epoch`` done, this one included if it committed (``steps_per_epoch``
    ends the epoch)."""


def counters_after(committed_steps: int, committed: bool, steps_per_epoch: int) -> LoopCounters:
    """The counters after a step with ``committed_steps`` committed steps in the job so far
    (this one included if ``committed``). The step that completes an epoch belongs to it, so
    Lightning ends the epoch on that batch; a step that did not commit belongs to the epoch
    the next committed step will."""
    if steps_per_epoch < 1:
        raise ValueError(f"steps_per_epoch={steps_per_epoch}; an epoch needs at least one step")
    n = committed_steps
    epoch = (n - 1) // steps_per_epoch if committed and n > 0 else n // steps_per_epoch
    return LoopCounters(global_step=n, epoch=epoch, batches_in_epoch=n - epoch * steps_per_epoch)


def set_counters(fit_loop: Any, counters: LoopCounters, steps_per_epoch: int, micro_batches: int = 1) -> None:
    """Write ``counters`` into Lightning's fit loop from inside the optimizer step; each step
    is ``micro_batches`` batches.

    Lightning follows the optimizer step of a batch with one increment of the optimizer step's
    ``completed``, of the batch's ``processed`` and ``completed``, and of the logging step
    (``_batches_that_stepped``); the values set here are one below the targets for exactly
    those.
    """
    epoch_loop = fit_loop.epoch_loop
    step = epoch_loop.automatic_optimization.optim_progress.optimizer.step
    for tracker in (step.total, step.current):
        tracker.ready = counters.global_step
        tracker.completed = counters.global_step - 1
    batch = epoch_loop.batch_progress
    done_before = counters.epoch * steps_per_epoch * micro_batches
    in_epoch = counters.batches_in_epoch * micro_batches
    for tracker, offset in ((batch.current, 0), (batch.total, done_before)):
        tracker.ready = tracker.started = offset + in_epoch
        tracker.processed = tracker.completed = offset + in_epoch - 1
    epoch_loop._batches_that_stepped = counters.global_step - 1
    epochs = fit_loop.epoch_progress
    if epochs.current.completed != counters.epoch:
        for tracker in (epochs.total, epochs.current):
            tracker.ready = tracker.started = counters.epoch + 1
            tracker.processed = tracker.completed = counters.epoch
