"""The parts of a Lightning run's training state that replicaft's wrappers do not already own.

The model, the optimizer and the data cursor are registered by the DDP wrapper, the manager
and the sampler; what is left is Lightning's own: the callbacks' state (EarlyStopping's
patience count, ModelCheckpoint's best score, ...) and the datamodule's, registered here so a
healer takes them from its donor and a checkpoint saves them. They are left out of the digest
that says two groups hold the same state: groups may hold them differently without being out
of step (a Timer's elapsed seconds, the best score of a loss each group computes on its own
share). And the LR schedulers, which Lightning steps after every batch: they must step only
when the optimizer did.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytorch_lightning as pl

from replicaft.manager import Manager

LIGHTNING_STATE = "lightning"


class LightningExtras:
    """Registers the callbacks' and the datamodule's state with the manager."""

    def __init__(self, manager: Manager, trainer: pl.Trainer) -> None:
        self._trainer = trainer
        manager.register_state(LIGHTNING_STATE, self.state_dict, self.load_state_dict, in_digest=False)

    def state_dict(self) -> dict[str, Any]:
        callbacks = {}
        for callback in self._trainer.callbacks:
            state = callback.state_dict()
            if state:
                callbacks[callback.state_key] = state
        datamodule = self._trainer.datamodule
        return {"callbacks": callbacks, "datamodule": datamodule.state_dict() if datamodule is not None else {}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for callback in self._trainer.callbacks:
            if callback.state_key in state["callbacks"]:
                callback.load_state_dict(state["callbacks"][callback.state_key])
        if self._trainer.datamodule is not None and state["datamodule"]:
            self._trainer.datamodule.load_state_dict(state["datamodule"])


class CommittedStepScheduler:
    """An LR scheduler as Lightning sees it: ``step()`` passes on only if the last step
    committed, so the learning rate follows committed steps, not attempts. Everything else
    (``optimizer``, ``get_last_lr``, ``state_dict``, ...) is the scheduler's own."""

    def __init__(self, scheduler: Any, committed: Callable[[], bool]) -> None:
        self.scheduler = scheduler
        self._committed = committed

    def step(self, *args: Any, **kwargs: Any) -> None:
        if self._committed():
            self.scheduler.step(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.scheduler, name)
