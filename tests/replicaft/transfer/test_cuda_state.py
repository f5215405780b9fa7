"""State in GPU memory through heal and snapshot (issue 25): needs CUDA, skipped without it.

Run on a GPU machine: ``python -m pytest -m gpu``. Real StateServers on loopback, real
sockets; the state lives on the current CUDA device.
"""

from __future__ import annotations

import dataclasses
import time

import pytest
import torch
from test_transfer import CHUNK, DEADLINE_S, STEP, assert_same_state, donors, sample_state, serving

from replicaft.state.flat import digest, flatten
from replicaft.transfer.capture import BackgroundCapture
from replicaft.transfer.client import Donor, fetch_state
from replicaft.transfer.device import pool_for, stream_for
from replicaft.transfer.live import LiveSnapshot
from replicaft.transfer.snapshot import Snapshot
from replicaft.transfer.spare import SpareBuffer

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: torch.cuda.is_available() is false"),
]


def cuda_state(seed: int = 0) -> dict:
    """sample_state with every tensor on the GPU (4 MiB of weights: staged in place on a heal)."""
    return to_device(sample_state(num_floats=1 << 20, seed=seed), torch.device("cuda"))


def to_device(value: object, device: torch.device) -> object:
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, dict):
        return {k: to_device(v, device) for k, v in value.items()}
    return value


def test_heal_into_gpu_memory_lands_in_place_pinned_and_reuses_its_staging() -> None:
    snapshot = Snapshot.capture(
        flatten(sample_state(num_floats=1 << 20)), step=STEP, quorum_id=1, replica_id="donor", chunk_bytes=CHUNK
    )
    allocated = None
    for heal in range(2):
        mine = flatten(cuda_state(seed=heal + 1))
        into = dict(zip(mine.names, mine.tensors, strict=True))
        versions = {n: t._version for n, t in into.items()}
        with donors(("a", snapshot, None), ("b", snapshot, None)) as ds:
            result = fetch_state(ds, STEP, token=None, timeout_s=DEADLINE_S, into=into)
        assert "state.model.w" in result.in_place and into["state.model.w"].is_cuda
        assert all(into[n]._version == versions[n] for n in into), "the staged writes counted as the step's own"
        assert_same_state(dataclasses.replace(result, tensors=[t.cpu() for t in result.tensors]), snapshot)
        pool = pool_for(stream_for(torch.device("cuda", torch.cuda.current_device())), CHUNK)
        assert pool.allocated > 0 and all(b.is_pinned() for b in pool._free)
        allocated = pool.allocated if allocated is None else allocated
        assert pool.allocated == allocated, "a second heal allocated new staging buffers"


def test_donor_serves_gpu_state_from_a_pinned_reused_host_copy() -> None:
    state = cuda_state()
    spare = SpareBuffer()
    for attempt in range(2):
        live = LiveSnapshot(
            flatten(state),
            step=STEP + attempt,
            quorum_id=1,
            replica_id="donor",
            readers=frozenset({"h"}),
            spare=spare,
            chunk_bytes=CHUNK,
        )
        assert live.reused_buffer == (attempt == 1)
        with serving(live) as (server, address):
            result = fetch_state(
                [Donor("donor", address)], STEP + attempt, token=None, timeout_s=DEADLINE_S, reader="h"
            )
            assert live.seal(wait_s=DEADLINE_S) == ""
            server.retain(set())
        cpu_state = to_device(state, torch.device("cpu"))
        assert_same_state(
            result, Snapshot.capture(flatten(cpu_state), step=STEP, quorum_id=1, replica_id="donor", chunk_bytes=CHUNK)
        )
    buffer = spare.take()
    assert buffer is not None and buffer.is_pinned()


def test_snapshot_from_gpu_waits_for_the_compute_streams_queued_writes() -> None:
    """The copy stream orders its copies after what the compute stream had queued: a large
    in-place write queued just before the capture is in the snapshot."""
    state = cuda_state()
    w = state["model"]["w"]
    for _ in range(20):
        w.mul_(1.0001)  # queued on the compute stream, still running when the capture starts
    expected = w.cpu()
    capture = BackgroundCapture(flatten(state), step=STEP, quorum_id=1, replica_id="r")
    snapshot, why = capture.finish(DEADLINE_S)
    assert snapshot is not None, why
    names = [s.name for s in snapshot.manifest.tensors]
    spec = snapshot.manifest.tensors[names.index("state.model.w")]
    got = snapshot.buffer[spec.offset : spec.offset + spec.num_bytes].view(torch.float32)
    assert torch.equal(got, expected) and snapshot.buffer.is_pinned()


def test_background_capture_from_gpu_overlaps_training_and_matches_a_cpu_copy() -> None:
    state = cuda_state()
    flat = flatten(state)
    out = None
    for attempt in range(2):
        capture = BackgroundCapture(flat, step=STEP, quorum_id=1, replica_id="r", out=out)
        x = torch.randn(2048, 2048, device="cuda")
        for _ in range(10):  # the step's forward and backward go on meanwhile
            x = torch.tanh(x @ x)
        snapshot, why = capture.finish(DEADLINE_S)
        assert snapshot is not None, why
        assert capture._plan.reused == (attempt == 1) and capture.deferred_bytes > 0
        plain = Snapshot.capture(
            flatten(to_device(state, torch.device("cpu"))), step=STEP, quorum_id=1, replica_id="r", with_checksums=False
        )
        assert torch.equal(snapshot.buffer, plain.buffer)
        out = snapshot.buffer
    assert digest(flat) == digest(flatten(to_device(state, torch.device("cpu"))))


def test_gpu_copy_stream_is_one_per_device() -> None:
    device = torch.device("cuda", torch.cuda.current_device())
    assert stream_for(device) is stream_for(device)
    event = stream_for(device).copy(torch.empty(4, pin_memory=True), torch.ones(4, device=device))
    event.wait(time.monotonic() + DEADLINE_S)
    assert event.done()
