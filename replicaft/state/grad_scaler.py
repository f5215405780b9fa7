"""AMP's ``GradScaler`` as training state: carried by heals, saved by checkpoints, kept to committed steps.

A scaler's state (the loss scale and how many finite steps it has seen since it last grew)
decides the next steps' scale, so a group that heals or resumes without it scales differently
from its peers, and with fp16 that changes which steps overflow. ``GradScalerState(manager,
scaler, optimizer)`` registers it, as ``replicaft.Optimizer`` registers the optimizer (the
manager's ``register_state`` and ``register_hooks``, the public way to add state); the values are
plain floats and ints (``GradScaler.state_dict()``), checked when loaded, since a heal's come
from a peer.

Committed steps only. The loop is ``scaler.scale(loss).backward(); scaler.step(optimizer);
scaler.update()``, and ``scaler.update()`` runs after ``should_commit`` whatever it decided,
so a step that did not commit would still count in the scaler, and a group whose step a
peer's failure aborted would leave the fault-free run's scale schedule. So the state goes back
to where the step started when the step aborted (at the next step's start, the first moment
after that ``update``). A step the scaler skips because a gradient overflowed never reaches
``should_commit``: the backoff it records is kept, as in plain PyTorch, and every group sees
the same averaged gradients, so every group backs off alike.

In the digest (the default of ``register_state``): every group applies the same updates to the
same averaged gradients, so groups agree on it as on the weights.

A healer unscaled the gradients of the step in which it applies the heal with its own scale,
its donors with theirs: once the heal has loaded the donors' scaler, the gradients are rescaled
to it before the optimizer steps (exact for power-of-two scales, the default). A heal that
replays the steps it missed (heal/catchup.py) rescales each recorded step's gradients the same
way and replays the scaler's ``update`` of each: those steps committed on the donors, which
means their scaler found no overflow.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from replicaft.errors import StateError
from replicaft.manager import Manager
from replicaft.state.registry import StepHooks

STATE_NAME = "grad_scaler"

_FIELDS: dict[str, type] = {
    "scale": float,
    "growth_factor": float,
    "backoff_factor": float,
    "growth_interval": int,
    "_growth_tracker": int,
}


class GradScalerState(StepHooks):
    """Register ``scaler`` (a ``torch.amp.GradScaler``) used with ``optimizer`` under ``name``.

    Build it once, after the DDP wrapper and beside ``replicaft.Optimizer``, before the first
    step (its replay hook must run after the wrapper's, which points the gradients at the
    recorded ones). A disabled scaler (``enabled=False``, or CUDA's on a machine without CUDA)
    has no state; it is registered as such, so every group's registry has the same entries.
    """

    def __init__(
        self,
        manager: Manager,
        scaler: torch.amp.GradScaler,
        optimizer: torch.optim.Optimizer | Any,
        name: str = STATE_NAME,
    ) -> None:
        self.scaler = scaler
        self.name = name
        self._param_groups = optimizer.param_groups
        self._step_start: dict[str, Any] = {}
        """The scaler when the step in progress started: its scale unscaled this step's gradients."""
        self._aborted = False
        self._unscaled_with: float | None = None
        """Set when a heal loaded the state during a step: the scale the step unscaled with."""
        manager.register_state(name, self.state_dict, self.load_state_dict)
        manager.register_hooks(self)

    def state_dict(self) -> dict[str, Any]:
        if not self.scaler.is_enabled():
            return {"enabled": False}
        return {"enabled": True, **{k: _FIELDS[k](v) for k, v in self.scaler.state_dict().items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Check every field, then load; a step that aborts after this load goes back to it."""
        values = check_state(state, enabled=self.scaler.is_enabled(), where=f"state.{self.name}")
        if not values:
            return
        self._unscaled_with = self._step_start.get("scale")
        self.scaler.load_state_dict(values)
        self._step_start, self._aborted = values, False

    def on_step_start(self) -> None:
        if self._aborted and self._step_start:
            self.scaler.load_state_dict(self._step_start)
        self._aborted, self._unscaled_with = False, None
        self._step_start = self.state_dict() if self.scaler.is_enabled() else {}
        self._step_start.pop("enabled", None)

    def on_commit(self) -> None:
        """A heal applied in this step's commit: this group unscaled the step's (averaged)
        gradients with its own scale, its donors with theirs, which it now holds; rescale, so
        the optimizer steps on the donors' gradients (exact for power-of-two scales, the default)."""
        if self._unscaled_with is not None:
            self._rescale(self._unscaled_with)
            self._unscaled_with = None

    def on_abort(self) -> None:
        self._aborted = True

    def capture_step(self) -> Any:
        return self._step_start.get("scale")

    def replay_prepare(self, record: Any) -> None:
        """A recorded step's gradients were unscaled with this group's scale then; the donors'
        was the one this replay has reached."""
        if isinstance(record, float):
            self._rescale(record)

    def replay_apply(self, record: Any) -> None:
        if self.scaler.is_enabled():
            self.scaler.load_state_dict(finite_update(self.scaler.state_dict()))

    def _rescale(self, unscaled_with: float) -> None:
        ratio = unscaled_with / float(self.scaler.state_dict()["scale"])
        if ratio == 1.0:
            return
        with torch.no_grad():
            for group in self._param_groups:
                for p in group["params"]:
                    if p.grad is not None:
                        p.grad.mul_(ratio)


def check_state(state: Any, *, enabled: bool, where: str) -> dict[str, Any]:
    """The scaler values in ``state`` (empty for a disabled scaler), or StateError naming the field."""
    if not isinstance(state, dict) or not isinstance(state.get("enabled"), bool):
        raise StateError(f"{where} must be a map with a bool 'enabled'; got {state!r:.200}")
    if state["enabled"] != enabled:
        raise StateError(
            f"{where} is from a scaler with enabled={state['enabled']}, this one has enabled={enabled}; "
            "build the GradScaler the same way in every group"
        )
    values = {k: v for k, v in state.items() if k != "enabled"}
    if not enabled:
        if values:
            raise StateError(f"{where}: a disabled scaler has no state; got {sorted(values)}")
        return {}
    if set(values) != set(_FIELDS):
        raise StateError(f"{where} must hold exactly {sorted(_FIELDS)}; got {sorted(values)}")
    for key, kind in _FIELDS.items():
        value = values[key]
        if kind is float:
            if not isinstance(value, float) or not math.isfinite(value) or value <= 0:
                raise StateError(f"{where}.{key} is {value!r}; expected a positive finite float")
        elif not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 2**31:
            raise StateError(f"{where}.{key} is {value!r}; expected an integer in [0, 2**31)")
    if values["growth_interval"] < 1:
        raise StateError(f"{where}.growth_interval is {values['growth_interval']}; expected at least 1")
    return values


def finite_update(state: dict[str, Any]) -> dict[str, Any]:
    """``state`` after ``GradScaler.update()`` of a step without overflow, by the kernel
    ``update`` itself runs (so the float32 rounding of the grown scale is the same)."""
    scale = torch.tensor([state["scale"]], dtype=torch.float32)
    tracker = torch.tensor([state["_growth_tracker"]], dtype=torch.int32)
    torch._amp_update_scale_(
        scale, tracker, torch.zeros(1), state["growth_factor"], state["backoff_factor"], state["growth_interval"]
    )
    return {**state, "scale": scale.item(), "_growth_tracker": int(tracker.item())}
