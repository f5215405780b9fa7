"""The donor side of a heal (replicaft/heal/donor.py) over a real state server and real fetches."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from lighthouse.rules.plan import StepPlan, plan_step
from lighthouse.wire.progress import Progress
from lighthouse.wire.protocol import Member, Quorum
from replicaft.heal.donor import DonorSide
from replicaft.state.registry import StateRegistry
from replicaft.transfer.client import fetch_state
from replicaft.transfer.donors import Donor
from replicaft.transfer.server import StateServer
from replicaft.transfer.spare import SpareBuffer

STEP = 541
DEADLINE_S = 10.0


@pytest.fixture
def donor() -> Iterator[tuple[DonorSide, str, torch.Tensor, list[dict[str, Any]]]]:
    """A donor's side over a registry holding one 2 MB tensor, its server's address, the tensor,
    and the fields of the events it emits."""
    weight = torch.randn(500_000, generator=torch.Generator().manual_seed(0))
    registry = StateRegistry()
    registry.register_state("model", lambda: {"w": weight}, lambda state: weight.copy_(state["w"]))
    server = StateServer("127.0.0.1")
    address = server.start()
    events: list[dict[str, Any]] = []
    side = DonorSide("d", 0, registry, server, SpareBuffer(), lambda event, **f: events.append(f), frozenset())
    try:
        yield side, address, weight, events
    finally:
        server.stop()


def plan(quorum_id: int, healers: dict[str, dict[str, Any]]) -> StepPlan:
    """The donor's plan of a quorum of it (at ``STEP``) and ``healers`` (behind, with their rank data)."""
    members = [Member("d", "host-d", STEP, 1)] + [
        Member(rid, f"host-{rid}", 0, 1, {"ranks": [data]}) for rid, data in healers.items()
    ]
    return plan_step(Quorum.of(quorum_id, 1, 0.0, members), "d")


def fetch_as(reader: str, address: str) -> torch.Tensor:
    result = fetch_state([Donor("d", address)], STEP, token=None, timeout_s=DEADLINE_S, reader=reader)
    (tensor,) = result.tensors  # the registry's one tensor, "model.w"
    return tensor


def test_a_new_healer_at_a_step_whose_snapshot_was_sealed_for_another_is_sent_it_whole(donor: Any) -> None:
    """The donor's step did not commit after a heal ended (its last healer vanished), and a
    restarted group asks for the same step: the sealed snapshot kept no byte, and this healer
    was refused every one (the Ray test of torchft's example: its first heal failed)."""
    side, address, weight, _ = donor
    side.serve(plan(5, {"g2": {}}), STEP)
    fetch_as("g2", address)
    assert side.seal(0.0) is None  # g2 was sent everything: nothing kept
    side.serve(plan(6, {"g1": {}}), STEP)  # the same step: the donor did not commit
    assert torch.equal(fetch_as("g1", address), weight)
    assert side.seal(0.0) is None


def test_a_healer_retrying_its_fetch_at_the_same_step_is_sent_it_again(donor: Any) -> None:
    side, address, weight, _ = donor
    side.serve(plan(5, {"g1": {}}), STEP)
    fetch_as("g1", address)
    assert side.seal(0.0) is None
    side.serve(plan(6, {"g1": {}}), STEP)  # its heal failed after the fetch (it tells no base)
    assert torch.equal(fetch_as("g1", address), weight)


def test_a_healer_continuing_its_fetch_keeps_the_published_snapshot(donor: Any) -> None:
    """A heal in progress tells its base: the snapshot it reads is not replaced under it."""
    side, address, weight, events = donor
    side.serve(plan(5, {"g1": {}}), STEP)
    assert side.seal(0.0) is None and events[-1]["kept_bytes"] == weight.numel() * 4  # nothing sent yet
    side.serve(plan(6, {"g1": {"heal_base": STEP}}), STEP + 1)
    assert side.seal(0.0) is None and len(events) == 1  # nothing served afresh
    assert torch.equal(fetch_as("g1", address), weight)


def test_a_donor_stopping_waits_for_its_healer_fetching_from_its_kept_copy(donor: Any) -> None:
    """The donor's loop ended (its last step sealed the snapshot, keeping what g1 had not been
    sent): it serves g1 to the last byte before it stops, and no longer once g1 has it."""
    side, address, weight, events = donor
    side.serve(plan(5, {"g1": {}}), STEP)
    assert side.seal(0.0) is None
    fetched: list[torch.Tensor] = []
    reader = threading.Thread(target=lambda: fetched.append(fetch_as("g1", address)))
    reader.start()
    side.drain(DEADLINE_S, frozenset, Progress())
    reader.join(DEADLINE_S)
    assert fetched and torch.equal(fetched[0], weight)
    assert not any(e.get("abandoned") for e in events)


def test_a_donor_stopping_waits_for_no_healer_that_is_gone_and_bounds_its_wait(donor: Any) -> None:
    side, _, _, events = donor
    side.serve(plan(5, {"g1": {}, "g2": {}}), STEP)
    assert side.seal(0.0) is None
    started = time.monotonic()
    side.drain(DEADLINE_S, lambda: frozenset({"g1", "g2"}), Progress())  # both lost: nothing to wait for
    assert time.monotonic() - started < DEADLINE_S / 2
    side.drain(0.3, lambda: frozenset({"g1"}), Progress())  # g2 alive but never fetching: abandoned at the bound
    assert events[-1]["abandoned"] == ["g2"] and events[-1]["waited_s"] >= 0.3
