"""Checkpoint: training time blocked by a save, async (ours) vs synchronous DCP vs torch.save.

The state is a model-and-optimizer-shaped dict of float32 tensors of 100 MB and 1 GB in total
(plus plain values), in this process. *Blocked* is what the training loop waits for:

* ``blocked_async_*``: replicaft's path: ``Snapshot.capture`` (one host copy of the state,
  no checksums, into the previous save's buffer as the manager does in steady state; the
  first repeat allocates it) plus queueing the save on ``CheckpointWriter``; the DCP write,
  fsync, checksums and publish run in the background and are timed separately
  (``async_total_*``);
* ``blocked_sync_dcp_*``: ``torch.distributed.checkpoint.save`` of the same state (the
  baseline of the ratio);
* ``torch_save_*``: ``torch.save`` of the same state to one file.

Also: a restart from disk (``CheckpointReader.load_latest_valid``: verify every file, load)
against a peer heal of the same state over loopback (one donor ``StateServer``, in-process
threads), both in seconds. Every figure is the median of the repeats; directories are under
one temporary directory on the machine's disk, deleted at the end.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp

from benchmarks.results import BenchmarkResult
from replicaft.checkpoint import CheckpointReader, CheckpointWriter
from replicaft.state import flatten
from replicaft.transfer.client import Donor, fetch_state
from replicaft.transfer.server import StateServer
from replicaft.transfer.snapshot import Snapshot

SIZES_MB = {"100mb": 100, "1gb": 1024}


def make_state(total_mb: int) -> dict:
    """A third parameters, two thirds Adam moments, in 4 tensors each, like a small model."""
    n = total_mb * 1024 * 1024 // 4 // 12
    params = {f"layer{i}.weight": torch.randn(n) for i in range(4)}
    moments = {i: {"exp_avg": torch.randn(n), "exp_avg_sq": torch.rand(n), "step": torch.tensor(10.0)} for i in range(4)}
    return {
        "model": params,
        "optimizer": {"state": moments, "param_groups": [{"lr": 1e-3, "betas": (0.9, 0.999), "params": [0, 1, 2, 3]}]},
        "replicaft": {"step": 10},
    }


def _time(f) -> float:
    started = time.perf_counter()
    f()
    return time.perf_counter() - started


def run(*, quick: bool) -> BenchmarkResult:
    repeats = 1 if quick else 3
    sizes = {"100mb": 100} if quick else SIZES_MB
    figures: dict[str, float] = {}
    baselines: dict[str, float] = {}
    compared: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="replicaft-bench-ckpt-", dir=".") as tmp:
        root = Path(tmp)
        for label, mb in sizes.items():
            state = make_state(mb)
            blocked, total, sync, tsave, load, heal = [], [], [], [], [], []
            spare: torch.Tensor | None = None
            for r in range(repeats):
                directory = root / f"{label}-{r}"
                writer = CheckpointWriter(directory, keep_last=2)
                started = time.perf_counter()
                snapshot = Snapshot.capture(
                    flatten(state), step=10, quorum_id=1, replica_id="g0", with_checksums=False, out=spare
                )
                handle = writer.save_async(snapshot, 10)
                blocked.append(time.perf_counter() - started)
                result = handle.wait(timeout_s=600)
                assert result.ok, result.reason
                total.append(time.perf_counter() - started)
                writer.close()
                spare = snapshot.buffer
                sync.append(_time(lambda d=directory, s=state: dcp.save(s, checkpoint_id=str(d / "sync"))))
                tsave.append(_time(lambda d=directory, s=state: torch.save(s, d / "state.pt")))
                load.append(_time(lambda d=directory, s=state: CheckpointReader(d).load_latest_valid(s)))
                served = Snapshot.capture(flatten(state), step=10, quorum_id=1, replica_id="g0")
                server = StateServer("127.0.0.1")
                address = server.start()
                server.publish(served)
                try:
                    heal.append(_time(lambda a=address: fetch_state([Donor("g0", a)], 10, token=None, timeout_s=600)))
                finally:
                    server.stop()
            figures[f"blocked_async_{label}_ms"] = statistics.median(blocked) * 1000
            figures[f"async_total_{label}_ms"] = statistics.median(total) * 1000
            figures[f"restart_from_disk_{label}_s"] = statistics.median(load)
            baselines[f"blocked_sync_dcp_{label}_ms"] = statistics.median(sync) * 1000
            baselines[f"torch_save_{label}_ms"] = statistics.median(tsave) * 1000
            baselines[f"peer_heal_{label}_s"] = statistics.median(heal)
            compared[f"blocked_async_{label}_ms"] = f"blocked_sync_dcp_{label}_ms"
            compared[f"restart_from_disk_{label}_s"] = f"peer_heal_{label}_s"
    result = BenchmarkResult(
        name="checkpoint",
        figures=figures,
        baselines=baselines,
        compared_to=compared,
        notes="blocked = time the training loop waits for a save; sync DCP and torch.save block for the whole write; "
        "restart_from_disk (verify + load) vs a one-donor peer heal of the same state over loopback",
        params={"repeats": repeats, "sizes_mb": list(sizes.values())},
    )
    if "blocked_async_1gb_ms" in figures:
        result = BenchmarkResult(
            name=result.name,
            figures={**figures, "blocked_async_vs_sync_1gb": figures["blocked_async_1gb_ms"] / baselines["blocked_sync_dcp_1gb_ms"]},
            baselines=baselines,
            compared_to=compared,
            notes=result.notes,
            params=result.params,
        )
    return result
