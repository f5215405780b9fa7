"""What a heal moves and a replay redoes (replicaft/state/registry.py): pure, no processes."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from replicaft.errors import StateError
from replicaft.state.registry import StateRegistry, StepHooks
from replicaft.transfer.manifest import state_digest
from replicaft.transfer.snapshot import Snapshot


class Recorder(StepHooks):
    def __init__(self, name: str, log: list[str]) -> None:
        self.name, self.log = name, log

    def capture_step(self) -> Any:
        return f"{self.name}-record"

    def replay_prepare(self, record: Any) -> None:
        self.log.append(f"prepare {record}")

    def replay_apply(self, record: Any) -> None:
        self.log.append(f"apply {record}")

    def end_replay(self) -> None:
        self.log.append(f"end {self.name}")


def test_replay_prepares_every_hook_then_steps_the_optimizers_then_applies() -> None:
    log: list[str] = []
    registry = StateRegistry()
    registry.register_hooks(Recorder("ddp", log))
    weight = torch.nn.Parameter(torch.ones(2))
    optimizer = torch.optim.SGD([weight], lr=0.5)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    registry.register_optimizer(optimizer, scheduler)
    registry.register_hooks(Recorder("sampler", log))
    weight.grad = torch.ones(2)
    records = [registry.capture(), registry.capture()]
    assert registry.replay(records) == 2
    assert log == [
        "prepare ddp-record",
        "prepare sampler-record",
        "apply ddp-record",
        "apply sampler-record",
        "prepare ddp-record",
        "prepare sampler-record",
        "apply ddp-record",
        "apply sampler-record",
        "end ddp",
        "end sampler",
    ]
    assert torch.equal(weight.detach(), torch.full((2,), 1 - 0.5 - 0.25))  # two steps, the LR halved between
    assert sorted(registry.state_dict()) == ["lr_scheduler", "optimizer"]


def test_replaying_nothing_ends_no_replay() -> None:
    log: list[str] = []
    registry = StateRegistry()
    registry.register_hooks(Recorder("ddp", log))
    assert registry.replay([]) == 0 and log == []


def test_state_registered_twice_or_loaded_incomplete_is_refused_by_name() -> None:
    registry = StateRegistry()
    registry.register_state("model", dict, lambda s: None)
    with pytest.raises(StateError, match="'model' is registered twice"):
        registry.register_state("model", dict, lambda s: None)
    with pytest.raises(StateError, match=r"lacks \['model'\]"):
        registry.load_state_dict({})


def test_state_outside_the_digest_travels_but_is_not_digested() -> None:
    registry = StateRegistry()
    registry.register_state("model", lambda: {"w": torch.ones(2)}, lambda s: None)
    registry.register_state("checkpoint", lambda: {"lineage": "abc"}, lambda s: None, in_digest=False)
    assert sorted(registry.state_dict()) == ["checkpoint", "model"]
    assert registry.flat().names == ["state.model.w"] and "lineage" in str(registry.flat().skeleton)
    assert "lineage" not in str(registry.flat(in_digest_only=True).skeleton)


def test_each_groups_own_state_is_checkpointed_but_not_served_so_two_donors_agree() -> None:
    """Two donors that agree on the training state but each hold their own loss record: the
    state they serve must vote as one (it failed when the record was served: no majority, and
    every later healer retried for ever)."""

    def donor(losses: list[float]) -> StateRegistry:
        registry = StateRegistry()
        registry.register_state("model", lambda: {"w": torch.ones(4)}, lambda s: None)
        registry.register_state("trajectory", lambda: {"losses": losses}, lambda s: None, healed=False)
        return registry

    a, b = donor([0.5, 0.4]), donor([0.6, 0.3])

    def served(registry: StateRegistry) -> bytes:
        return state_digest(
            Snapshot.capture(registry.flat(healed_only=True), step=3, quorum_id=1, replica_id="g").manifest
        )

    assert served(a) == served(b)
    assert "losses" in str(a.flat().skeleton), "a checkpoint carries it"
    assert "losses" not in str(a.flat(in_digest_only=True).skeleton), "the committed digest leaves it out"
    loaded: list[dict[str, Any]] = []
    healer = StateRegistry()
    healer.register_state("model", lambda: {"w": torch.zeros(4)}, loaded.append)
    healer.register_state(
        "trajectory", lambda: {"losses": []}, lambda s: pytest.fail("a heal sets the healer's own"), healed=False
    )
    healer.load_state_dict({"model": {"w": torch.ones(4)}})  # what a heal hands over
    assert len(loaded) == 1
