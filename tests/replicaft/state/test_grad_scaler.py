"""AMP's GradScaler as training state (replicaft/state/grad_scaler.py): round trip, what a peer may not
send, committed steps only, and a heal's rescale and replay. In-process, on a real registry."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from replicaft.errors import StateError
from replicaft.state.flat import flatten, unflatten
from replicaft.state.grad_scaler import GradScalerState, finite_update
from replicaft.state.registry import StateRegistry, StepHooks


def build(growth_interval: int = 2) -> tuple[StateRegistry, GradScalerState, torch.nn.Parameter]:
    registry = StateRegistry()
    weight = torch.nn.Parameter(torch.ones(3))
    optimizer = torch.optim.SGD([weight], lr=0.1)
    scaler = torch.amp.GradScaler("cpu", growth_interval=growth_interval)
    state = GradScalerState(registry, scaler, optimizer)  # type: ignore[arg-type]  # the registry the manager forwards to
    registry.register_optimizer(optimizer)
    return registry, state, weight


def train_step(registry: StateRegistry, state: GradScalerState, weight: torch.nn.Parameter, *, commit: bool) -> None:
    """One step as train_ddp runs it: scale, backward, step (commit or abort), update."""
    registry.step_started()
    weight.grad = None
    state.scaler.scale((weight * 2.0).sum()).backward()
    state.scaler.unscale_(registry._steppers[0].optimizer)
    registry.committed() if commit else registry.aborted()
    state.scaler.step(registry._steppers[0].optimizer)
    state.scaler.update()


def test_state_round_trips_and_the_loaded_scaler_continues_alike() -> None:
    registry, state, weight = build()
    for _ in range(3):
        train_step(registry, state, weight, commit=True)
    flat = flatten(registry.state_dict())
    saved = unflatten(flat.skeleton, list(flat.tensors))["grad_scaler"]
    assert saved == {
        "enabled": True,
        "scale": 131072.0,
        "growth_factor": 2.0,
        "backoff_factor": 0.5,
        "growth_interval": 2,
        "_growth_tracker": 1,
    }
    other_registry, other, _ = build()
    other.load_state_dict(saved)
    assert other.state_dict() == saved


def test_an_aborted_step_does_not_count_in_the_scaler() -> None:
    registry, state, weight = build()
    train_step(registry, state, weight, commit=True)
    before = state.state_dict()
    train_step(registry, state, weight, commit=False)
    registry.step_started()  # the next step starts where the aborted one did
    assert state.state_dict() == before


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("scale", float("nan"), "state.grad_scaler.scale is nan"),
        ("scale", -1.0, "expected a positive finite float"),
        ("scale", "65536", "state.grad_scaler.scale is '65536'"),
        ("_growth_tracker", True, "state.grad_scaler._growth_tracker is True"),
        ("_growth_tracker", 2**40, "expected an integer in [0, 2**31)"),
        ("growth_interval", 0, "growth_interval is 0; expected at least 1"),
        ("enabled", False, "enabled=False, this one has enabled=True"),
        ("extra", 1, "must hold exactly"),
    ],
)
def test_a_malformed_state_is_refused_by_name(field: str, value: Any, message: str) -> None:
    _, state, _ = build()
    sent = state.state_dict()
    sent[field] = value
    with pytest.raises(StateError) as e:
        state.load_state_dict(sent)
    assert message in str(e.value)
    assert state.state_dict()["scale"] == 65536.0


def test_finite_update_is_what_the_scaler_does_after_a_finite_step() -> None:
    registry, state, weight = build(growth_interval=2)
    expected = state.state_dict()
    for _ in range(5):
        expected = {**expected, **finite_update({k: v for k, v in expected.items() if k != "enabled"})}
        train_step(registry, state, weight, commit=True)
        assert state.state_dict() == expected


def test_a_heal_rescales_the_steps_gradients_to_the_donors_scale_and_replays_their_updates() -> None:
    # The healer unscaled this step's gradients (and a recorded one's) with its own scale,
    # 65536; the donors' was 4x that: after the heal the optimizer must see the donors'.
    weight = torch.nn.Parameter(torch.ones(3))
    optimizer = torch.optim.SGD([weight], lr=0.1)
    replayed_grads: list[torch.Tensor] = []

    class PointGrads(StepHooks):
        """What the DDP wrapper does in a replay (built first, so its hooks run first)."""

        def replay_prepare(self, record: Any) -> None:
            weight.grad = torch.full((3,), 8.0)

        def replay_apply(self, record: Any) -> None:
            assert weight.grad is not None
            replayed_grads.append(weight.grad.clone())

    registry = StateRegistry()
    registry.register_hooks(PointGrads())
    state = GradScalerState(registry, torch.amp.GradScaler("cpu", growth_interval=2), optimizer)  # type: ignore[arg-type]
    registry.register_optimizer(optimizer)
    registry.step_started()
    state.load_state_dict({**state.state_dict(), "scale": 262144.0, "_growth_tracker": 1})
    registry.replay([[None, 65536.0]])
    assert replayed_grads[0].tolist() == [2.0, 2.0, 2.0]  # 8 unscaled by 65536, as the donors' 262144 would
    assert state.state_dict()["scale"] == 524288.0 and state.state_dict()["_growth_tracker"] == 0
    weight.grad = torch.full((3,), 8.0)
    registry.committed()
    assert weight.grad.tolist() == [1.0, 1.0, 1.0]  # 65536 / 524288: the donors' scale by now
