"""The donor's snapshot for healers, copied behind the step (replicaft/serving.py).

A real state server on loopback and the real heal client: what a healer fetches after
``settle`` is the state at the step boundary, checksums verified, even though the state was
written right after; a copy the step wrote into is never served.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
import torch

from replicaft.serving import SnapshotPublisher
from replicaft.state import digest, flatten, unflatten
from replicaft.transfer.client import Donor, fetch_state
from replicaft.transfer.server import StateServer

BIG = 1 << 20


def state() -> dict:
    torch.manual_seed(0)
    return {"model": {"weight": torch.randn(BIG // 4 * 3), "running_mean": torch.randn(16)},
            "optimizer": {"exp_avg": torch.randn(BIG // 4 * 2), "step": 7}}


@pytest.fixture
def server() -> Iterator[StateServer]:
    s = StateServer("127.0.0.1")
    s.address = s.start()
    yield s
    s.stop()


def test_a_healer_gets_the_boundary_state_published_behind_the_step(server: StateServer) -> None:
    published = threading.Event()
    publisher = SnapshotPublisher(server, "g0", on_published=lambda step: published.set())
    s = state()
    boundary = digest(flatten(s))
    publisher.prepare(flatten(s), step=12, quorum_id=3)
    assert publisher.serves(12) and not publisher.serves(13)
    publisher.settle(timeout_s=60)
    s["optimizer"]["exp_avg"].mul_(0.5)  # the optimizer step, right after settle
    s["model"]["weight"].add_(1.0)
    assert published.wait(60)
    result = fetch_state([Donor("g0", server.address)], 12, token=None, timeout_s=60)
    assert digest(flatten(unflatten(result.manifest.skeleton, result.tensors))) == boundary
    publisher.retain(set())
    assert not publisher.serves(12)
    publisher.close()


def test_a_copy_written_into_by_the_step_is_not_served_and_that_tensor_is_copied_at_once_next_time(server: StateServer) -> None:
    publisher = SnapshotPublisher(server, "g0")
    s = state()
    publisher.prepare(flatten(s), step=12, quorum_id=3)
    s["model"]["weight"].add_(1.0)  # e.g. a large buffer written by forward
    publisher.settle(timeout_s=60)
    assert 12 not in server.published_steps and not publisher.serves(12)
    publisher.prepare(flatten(s), step=13, quorum_id=3)
    expected = digest(flatten(s))
    s["model"]["weight"].add_(1.0)  # the same write again: the weight was copied at once this time
    publisher.settle(timeout_s=60)
    result = fetch_state([Donor("g0", server.address)], 13, token=None, timeout_s=60)
    assert digest(flatten(unflatten(result.manifest.skeleton, result.tensors))) == expected
    publisher.close()
