"""Checkpoint: training time blocked by a save, async (ours) vs synchronous DCP vs torch.save.

The state is a real model and its AdamW moments, ~100 MB and ~1 GB in total (an MLP of
square float32 layers; parameters are a third of the state), trained on random data in this
process. *Blocked* is how much longer a training step takes when a save starts at its
boundary than a step without one, both medians over the same run:

* ``blocked_async_*``: replicaft's path, through the manager's own ``Persistence`` in the
  manager's order: ``after_commit`` at the step boundary (the save is due: small tensors are
  copied at once, the rest by ``BackgroundCapture`` behind the step), forward and backward,
  ``settle`` (waits for whatever of the copy has not overlapped, queues the save), then the
  optimizer step. The step is timed whole, so the copy's competition with forward/backward
  for the two cores and memory bandwidth counts as blocked too. The DCP write, fsync,
  checksums and publish then run on the writer thread; the test waits for them before the
  next measurement, and their own cost to concurrent steps is ``write_slowdown_*`` (the
  extra time of the steps trained while the writer ran, summed);
* ``blocked_sync_dcp_*``: ``torch.distributed.checkpoint.save`` of the same state (the
  baseline of the ratio);
* ``torch_save_*``: ``torch.save`` of the same state to one file.

Also: a restart from disk (``CheckpointReader.load_latest_valid``: verify every file, load)
against a peer heal of the same state over loopback (one donor ``StateServer``, in-process
threads), both in seconds. Directories are under one temporary directory on the machine's
disk, deleted at the end.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch import nn

from benchmarks.results import BenchmarkResult
from replicaft.checkpoint import CheckpointReader
from replicaft.config.options import ManagerOptions
from replicaft.persistence.duties import Persistence
from replicaft.state.flat import flatten
from replicaft.transfer.client import fetch_state
from replicaft.transfer.donors import Donor
from replicaft.transfer.server import StateServer
from replicaft.transfer.snapshot import Snapshot
from replicaft.transfer.spare import SpareBuffer

SIZES = {"100mb": (1024, 8), "1gb": (4096, 5)}
"""label -> (layer width, layers): width² × layers parameters, × 12 bytes with AdamW's moments."""
BATCH = 16


class Trainer:
    """A model, AdamW and the manager's step order around ``Persistence``.

    On ``device="cuda"`` (``python -m benchmarks gpu``) the state lives in GPU memory, the save
    captures it through the copy stream (replicaft/transfer/device.py), and every step ends with
    ``torch.cuda.synchronize()``, so that its time is its kernels', not their launch."""

    def __init__(self, width: int, layers: int, directory: Path, device: str = "cpu") -> None:
        torch.manual_seed(0)
        self.model = nn.Sequential(*(nn.Linear(width, width, bias=False) for _ in range(layers))).to(device)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-4)
        self.inputs = torch.randn(BATCH, width, device=device)
        self.step = 0
        options = ManagerOptions(
            lighthouse="127.0.0.1:1",
            replica_id="bench",
            checkpoint_dir=str(directory),
            checkpoint_interval_steps=1,
            checkpoint_keep_last=2,
        )
        self.events: list[tuple[str, dict]] = []
        self.persistence = Persistence(
            options, lambda event, **fields: self.events.append((event, fields)), SpareBuffer()
        )
        self.persistence.start()
        self.train_step(save=False)  # AdamW's moments exist from here on

    def state(self) -> dict:
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "replicaft": {"step": self.step},
        }

    def train_step(self, *, save: bool) -> float:
        """One step in the manager's order; its seconds. ``save``: a save is due at its boundary."""
        started = time.perf_counter()
        self.persistence.after_commit(self.step, is_writer=save, state=self.state, quorum_id=1)
        self.optimizer.zero_grad()
        self.model(self.inputs).square().mean().backward()
        self.persistence.settle()
        self.optimizer.step()
        if self.inputs.is_cuda:
            torch.cuda.synchronize()
        self.step += 1
        return time.perf_counter() - started

    def writing(self) -> bool:
        return self.persistence._writer is not None and self.persistence._writer.statistics().num_pending > 0

    def close(self) -> None:
        self.persistence.close()


def _time(f: Callable[[], object]) -> float:
    started = time.perf_counter()
    f()
    return time.perf_counter() - started


def measure_async(trainer: Trainer, repeats: int) -> tuple[list[float], list[float], list[float], int]:
    """(plain step times, save step times, writer slowdowns, bytes copied in the background)."""
    plain, saving, slowdown = [], [], []
    # The writer's first call sets its baseline.
    trainer.persistence.after_commit(trainer.step, is_writer=True, state=trainer.state, quorum_id=1)
    for r in range(repeats + 1):  # the first save allocates the host buffer; later ones reuse it
        plain += [trainer.train_step(save=False) for _ in range(3)]
        t = trainer.train_step(save=True)
        during = []
        deadline = time.monotonic() + 900
        while trainer.writing() and time.monotonic() < deadline:
            during.append(trainer.train_step(save=False))
        if r > 0:
            saving.append(t)
            slowdown.append(sum(during) - len(during) * statistics.median(plain))
    failed = [f for e, f in trainer.events if e == "checkpoint" and not f["ok"]]
    assert not failed, failed
    deferred = [f["background_copy_bytes"] for e, f in trainer.events if e == "checkpoint_start"]
    return plain, saving, slowdown, max(deferred)


def run(*, quick: bool) -> BenchmarkResult:
    repeats = 1 if quick else 5  # the blocked time is a difference of medians: 3 saves gave 0.05-0.14x
    sizes = {"100mb": SIZES["100mb"]} if quick else SIZES
    figures: dict[str, float] = {}
    baselines: dict[str, float] = {}
    compared: dict[str, str] = {}
    params: dict[str, object] = {"repeats": repeats, "batch": BATCH}
    with tempfile.TemporaryDirectory(prefix="replicaft-bench-ckpt-", dir=".") as tmp:
        root = Path(tmp)
        for label, (width, layers) in sizes.items():
            trainer = Trainer(width, layers, root / f"{label}-async")
            try:
                plain, saving, slowdown, deferred = measure_async(trainer, repeats)
            finally:
                trainer.close()
            state = trainer.state()
            state_bytes = Snapshot.capture(
                flatten(state), step=0, quorum_id=1, replica_id="b", with_checksums=False
            ).manifest.total_bytes
            sync, tsave, load, heal = [], [], [], []
            for r in range(repeats):
                directory = root / f"{label}-{r}"
                directory.mkdir()
                saved = root / f"{label}-async"
                sync.append(_time(lambda d=directory, s=state: dcp.save(s, checkpoint_id=str(d / "sync"))))
                tsave.append(_time(lambda d=directory, s=state: torch.save(s, d / "state.pt")))
                load.append(_time(lambda d=saved, s=state: CheckpointReader(d).load_latest_valid(s)))
                served = Snapshot.capture(flatten(state), step=10, quorum_id=1, replica_id="g0")
                server = StateServer("127.0.0.1")
                address = server.start()
                server.publish(served)
                try:
                    heal.append(_time(lambda a=address: fetch_state([Donor("g0", a)], 10, token=None, timeout_s=600)))
                finally:
                    server.stop()
            step_s = statistics.median(plain)
            figures[f"blocked_async_{label}_ms"] = max(statistics.median(saving) - step_s, 0.0) * 1000
            figures[f"write_slowdown_{label}_ms"] = statistics.median(slowdown) * 1000
            figures[f"restart_from_disk_{label}_s"] = statistics.median(load)
            baselines[f"step_{label}_ms"] = step_s * 1000
            baselines[f"blocked_sync_dcp_{label}_ms"] = statistics.median(sync) * 1000
            baselines[f"torch_save_{label}_ms"] = statistics.median(tsave) * 1000
            baselines[f"peer_heal_{label}_s"] = statistics.median(heal)
            compared[f"blocked_async_{label}_ms"] = f"blocked_sync_dcp_{label}_ms"
            compared[f"write_slowdown_{label}_ms"] = f"blocked_sync_dcp_{label}_ms"
            compared[f"restart_from_disk_{label}_s"] = f"peer_heal_{label}_s"
            params[f"state_bytes_{label}"] = state_bytes
            params[f"background_copy_bytes_{label}"] = deferred
    if "blocked_async_1gb_ms" in figures:
        figures["blocked_async_vs_sync_1gb"] = figures["blocked_async_1gb_ms"] / baselines["blocked_sync_dcp_1gb_ms"]
    return BenchmarkResult(
        name="checkpoint",
        figures=figures,
        baselines=baselines,
        compared_to=compared,
        notes="blocked = median step time with a save starting at its boundary minus the median step time "
        "without (the manager's Persistence, background copy included); write_slowdown = extra time of the "
        "steps trained while the writer thread wrote; sync DCP and torch.save block for the whole write; "
        "restart_from_disk (verify + load) vs a one-donor peer heal of the same state over loopback",
        params=params,
    )
