"""The staged, stream-ordered copy paths (replicaft/transfer/device.py) driven on the CPU.

HostCopyStream performs the queued copies on its own thread, in order, with events: the same
pipelines a CUDA stream runs (CopyPlan's queued device-to-host pieces for a donor's and a checkpoint's
copies, StagedWriter for a healer's host-to-device ones), with the same bounded, reused
staging buffers. tests/test_cuda_*.py run them on a GPU.
"""

from __future__ import annotations

import threading
import time

import pytest
import torch
from test_transfer import (
    CHUNK,
    DEADLINE_S,
    STEP,
    assert_same_state,
    connection_counter,
    donors,
    sample_snapshot,
    sample_state,
)

from replicaft.state.flat import flatten
from replicaft.transfer.capture import BackgroundCapture
from replicaft.transfer.client import fetch_state
from replicaft.transfer.device import (
    STAGING_BUFFERS,
    CopyTimeout,
    HostCopyStream,
    StagedWriter,
    StagingPool,
    raw_bytes,
)
from replicaft.transfer.placement import Placement
from replicaft.transfer.snapshot import Snapshot


def deadline() -> float:
    return time.monotonic() + DEADLINE_S


def test_staging_pool_allocates_up_to_its_bound_then_reuses() -> None:
    pool = StagingPool(HostCopyStream(), 16, max_buffers=2)
    a, b = pool.acquire(deadline()), pool.acquire(deadline())
    assert pool.try_acquire() is None and pool.allocated == 2
    with pytest.raises(CopyTimeout, match="all 2 in use"):
        pool.acquire(time.monotonic() + 0.05)
    pool.release(a)
    assert pool.acquire(deadline()) is a and pool.allocated == 2
    pool.release(b)


def test_host_copy_stream_performs_copies_in_queued_order() -> None:
    stream = HostCopyStream()
    dst = torch.zeros(1000)
    events = [stream.copy(dst, torch.full((1000,), float(k))) for k in range(20)]
    events[-1].wait(deadline())
    assert all(e.done() for e in events) and torch.equal(dst, torch.full((1000,), 19.0))


def test_host_copy_failure_is_raised_by_wait_naming_the_error() -> None:
    event = HostCopyStream().copy(torch.zeros(3), torch.zeros(4))
    with pytest.raises(Exception, match="staged copy failed: RuntimeError"):
        event.wait(deadline())


def test_staged_writer_lands_pieces_in_place_without_bumping_the_version() -> None:
    target = torch.zeros(2500, dtype=torch.float32)
    version = target._version
    expected = torch.randn(2500)
    raw, want = raw_bytes(target), expected.view(torch.uint8)
    writer = StagedWriter(StagingPool(HostCopyStream(), 1024, max_buffers=2))
    for lo in range(0, raw.numel(), 1024):  # more pieces than buffers: each waits for a landed one
        buffer = writer.buffer(deadline())
        n = min(1024, raw.numel() - lo)
        buffer[:n].copy_(want[lo : lo + n])
        writer.land(buffer, [(raw[lo : lo + n], buffer[:n])])
    writer.finish(deadline())
    assert torch.equal(target, expected) and target._version == version
    assert writer.pool.allocated == 2 and len(writer.pool._free) == 2


def test_staged_writer_shared_by_threads_lands_every_piece() -> None:
    target = torch.zeros(64 * 100, dtype=torch.uint8)
    writer = StagedWriter(StagingPool(HostCopyStream(), 64, max_buffers=3))
    raw = raw_bytes(target)

    def write(k: int) -> None:
        for piece in range(k, 100, 4):
            buffer = writer.buffer(deadline())
            buffer.fill_(piece % 251 + 1)
            writer.land(buffer, [(raw[piece * 64 : piece * 64 + 64], buffer)])

    threads = [threading.Thread(target=write, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(DEADLINE_S)
    writer.finish(deadline())
    assert all(int(target[p * 64]) == p % 251 + 1 for p in range(100))


def test_a_writer_waiting_for_a_buffer_takes_one_landed_by_a_writer_that_has_finished() -> None:
    """The one buffer is landed by a thread that then stops asking; the thread already waiting
    must reap it rather than wait for a release nobody will make."""
    target = torch.zeros(64, dtype=torch.uint8)
    writer = StagedWriter(StagingPool(HostCopyStream(), 64, max_buffers=1))
    first = writer.buffer(deadline())
    got: list[torch.Tensor] = []
    waiter = threading.Thread(target=lambda: got.append(writer.buffer(deadline())))
    waiter.start()
    until = deadline()
    while not writer.pool._cond._waiters and time.monotonic() < until:  # the waiter is parked
        time.sleep(0.001)
    assert writer.pool._cond._waiters, "the second writer never waited for a buffer"
    first.fill_(7)
    writer.land(first, [(raw_bytes(target), first)])
    waiter.join(DEADLINE_S)
    assert got and got[0] is first and int(target[0]) == 7


def test_fetch_through_staging_receives_in_place_and_a_second_heal_allocates_within_the_bound() -> None:
    """The healer's staged path end to end over real sockets: chunks received into staging
    buffers, verified there, copied into the healer's own tensors on the copy stream. The pool
    reuses its buffers: two heals of 19 chunks each allocate at most ``STAGING_BUFFERS``. (How
    many of those the first heal reaches depends on how its connections interleave, so the
    second may add one up to the bound: asserting it adds none raced that interleaving.)"""
    snapshot = sample_snapshot()
    stream = HostCopyStream()
    for heal in range(2):
        mine = flatten(sample_state(seed=heal + 1))
        into = dict(zip(mine.names, mine.tensors, strict=True))
        versions = {n: t._version for n, t in into.items()}
        _, hook_of = connection_counter(2)
        with donors(("a", snapshot, hook_of("a")), ("b", snapshot, hook_of("b"))) as ds:
            result = fetch_state(ds, STEP, token=None, timeout_s=DEADLINE_S, into=into, stream=stream)
        assert_same_state(result, snapshot)
        assert "state.model.w" in result.in_place and all(into[n]._version == versions[n] for n in into)
        placement = Placement(snapshot.manifest, into, stream)
        pool = placement._writer.pool
        assert len(snapshot.manifest.checksums) > pool.max_buffers == STAGING_BUFFERS
        assert 1 <= pool.allocated <= pool.max_buffers
        assert len(pool._free) == pool.allocated  # every buffer back: none held past the heal


def test_placement_drops_an_unverified_chunk_and_its_buffer_goes_back() -> None:
    snapshot = sample_snapshot()
    mine = flatten(sample_state(seed=1))
    placement = Placement(snapshot.manifest, dict(zip(mine.names, mine.tensors, strict=True)), HostCopyStream())
    landing = placement.receive(0, CHUNK, deadline())
    landing.drop()
    placement.finish(deadline())
    pool = placement._writer.pool
    assert len(pool._free) == pool.allocated


def test_background_capture_through_the_copy_stream_equals_a_plain_snapshot_and_reuses_its_buffer() -> None:
    flat = flatten(sample_state())
    plain = Snapshot.capture(flat, step=STEP, quorum_id=1, replica_id="r", with_checksums=False)
    stream = HostCopyStream()
    out = None
    for attempt in range(2):
        capture = BackgroundCapture(flat, step=STEP, quorum_id=1, replica_id="r", out=out, stream=stream)
        snapshot, why = capture.finish(DEADLINE_S)
        assert snapshot is not None and why == "" and capture._plan.reused == (attempt == 1)
        assert torch.equal(snapshot.buffer, plain.buffer)
        out = snapshot.buffer


def test_background_capture_through_the_copy_stream_refuses_a_tensor_written_meanwhile() -> None:
    flat = flatten(sample_state())
    capture = BackgroundCapture(flat, step=STEP, quorum_id=1, replica_id="r", stream=HostCopyStream())
    with torch.no_grad():
        flat.tensors[flat.names.index("state.model.w")].add_(1.0)
    snapshot, why = capture.finish(DEADLINE_S)
    assert snapshot is None and "state.model.w" in why
