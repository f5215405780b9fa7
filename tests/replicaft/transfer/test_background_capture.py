"""The checkpoint snapshot copied behind the training step (replicaft/transfer/capture.py).

A copy deferred to a thread may only be used if nothing wrote the deferred tensors while it
ran: these tests write them (as a forward pass updating a buffer would) and expect a refusal
naming them, never a torn snapshot.
"""

from __future__ import annotations

import pytest
import torch

from replicaft.state.flat import digest, flatten, unflatten
from replicaft.transfer.capture import BackgroundCapture
from replicaft.transfer.snapshot import Snapshot, tensors_from_buffer

BIG = 1 << 20  # bytes: the default threshold below which tensors are copied at once


def state() -> dict:
    torch.manual_seed(0)
    return {
        "model": {"weight": torch.randn(BIG // 4 * 3), "running_mean": torch.randn(16)},
        "optimizer": {"exp_avg": torch.randn(BIG // 4 * 2), "step": 7},
    }


def restored(snapshot: Snapshot) -> dict:
    return unflatten(snapshot.manifest.skeleton, tensors_from_buffer(snapshot.buffer, snapshot.manifest))


def test_background_copy_equals_a_synchronous_one_and_reuses_the_buffer() -> None:
    s = state()
    capture = BackgroundCapture(flatten(s), step=4, quorum_id=2, replica_id="g0")
    snapshot, why = capture.finish(timeout_s=60)
    assert snapshot is not None and why == ""
    expected = Snapshot.capture(flatten(s), step=4, quorum_id=2, replica_id="g0", with_checksums=False)
    assert torch.equal(snapshot.buffer, expected.buffer) and snapshot.manifest == expected.manifest
    again = BackgroundCapture(flatten(s), step=5, quorum_id=2, replica_id="g0", out=snapshot.buffer)
    assert again.buffer.data_ptr() == snapshot.buffer.data_ptr()
    assert again.finish(timeout_s=60)[0] is not None


def test_small_tensors_are_copied_at_once_so_a_later_write_does_not_reach_the_snapshot() -> None:
    s = state()
    before = digest(flatten(s))
    capture = BackgroundCapture(flatten(s), step=4, quorum_id=2, replica_id="g0")
    s["model"]["running_mean"].add_(1.0)  # a forward pass updating a BatchNorm statistic
    snapshot, _ = capture.finish(timeout_s=60)
    assert snapshot is not None and digest(flatten(restored(snapshot))) == before


def test_a_deferred_tensor_written_during_the_copy_refuses_the_snapshot_naming_it() -> None:
    s = state()
    capture = BackgroundCapture(flatten(s), step=4, quorum_id=2, replica_id="g0")
    s["optimizer"]["exp_avg"].mul_(0.5)  # e.g. user code stepping before should_commit
    snapshot, why = capture.finish(timeout_s=60)
    assert snapshot is None and "state.optimizer.exp_avg" in why and "changed during the background copy" in why
    assert capture.changed == frozenset({"state.optimizer.exp_avg"})
    # Named tensors are copied at once next time, so the same write no longer spoils it.
    s = state()
    before = digest(flatten(s))
    capture = BackgroundCapture(flatten(s), step=5, quorum_id=2, replica_id="g0", copy_now=capture.changed)
    s["optimizer"]["exp_avg"].mul_(0.5)
    snapshot, _ = capture.finish(timeout_s=60)
    assert snapshot is not None and digest(flatten(restored(snapshot))) == before


def test_pieces_copied_by_both_threads_make_the_same_snapshot(monkeypatch: pytest.MonkeyPatch) -> None:
    # Pieces that do not divide the tensors: every piece boundary and the padding after each
    # tensor's last piece must come out as in a synchronous copy.
    monkeypatch.setattr(BackgroundCapture, "PIECE_BYTES", 1000)
    s = state()
    s["model"]["odd"] = torch.randn(BIG // 4 + 3)  # 12 bytes past 1 MiB: 52 bytes of padding follow it
    expected = Snapshot.capture(flatten(s), step=4, quorum_id=2, replica_id="g0", with_checksums=False)
    dirty = torch.full_like(expected.buffer, 0xFF)  # a reused buffer: padding must be zeroed again
    capture = BackgroundCapture(flatten(s), step=4, quorum_id=2, replica_id="g0", out=dirty)
    snapshot, why = capture.finish(timeout_s=60)  # the training thread copies what is left
    assert snapshot is not None, why
    assert torch.equal(snapshot.buffer, expected.buffer) and not capture.running
