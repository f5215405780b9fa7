"""Processes of the GPU benchmark's heal: a training donor that serves its state, and a healer.

Run by ``benchmarks/gpu.py``, one process per role, on one ``--device`` (``cuda`` on a GPU
machine, ``cpu`` in the CPU test that drives the same code). Both build the same model
(``--layers`` square linear layers of ``--width``, no bias) with AdamW and take one step, so
the state (parameters and both moments, three times the parameters in bytes) exists, lives on
the device, and has the same names and shapes in both; the seeds differ, so the healer's
state differs until it heals. Commands are JSON lines on stdin; answers are JSON lines on stdout.

* ``donor``: a real ``StateServer`` on 127.0.0.1. ``{"op": "serve", "digest": bool}``: at
  the next step boundary, copy the state out of device memory (``Snapshot.capture``: on CUDA
  through the copy stream into pinned host memory, replicaft/transfer/device.py, as a donor's manager
  does for device state; the host buffer is reused from serve to serve), publish it (the
  previous one retired) and answer ``serving`` (address, step, bytes, the capture's start and
  seconds, and the state's digest when asked: hashing is slow, so only the idle heals ask).
  ``{"op": "train"}`` starts the training loop, which answers ``step`` (start, end: monotonic
  seconds, comparable across processes on one machine) for every step, a serve's capture
  inside the step it happened in, as in a manager; ``{"op": "stop"}`` ends it (``stopped``).
* ``healer``: ``{"op": "heal", "address", "step"}``: ``fetch_state`` from the donor into the
  healer's own tensors in place (on CUDA through pinned staging buffers and the copy stream;
  on the CPU through ``HostCopyStream``, so the staged pipeline runs there too), answered
  with ``healed`` (start, end, seconds, bytes, bytes received in place, the healed state's
  digest when asked). ``{"op": "h2d", "bytes"}``: the device's own limit, one copy of that many
  bytes from pinned host memory into device memory, timed to its end (on the CPU a plain
  host copy stands in), answered with ``copied``.
"""

from __future__ import annotations

import argparse
import queue
import threading
import time
from typing import Any

import torch
from torch import nn

from benchmarks.heal_worker import commands, emit
from replicaft.state.flat import digest, flatten
from replicaft.transfer.client import fetch_state
from replicaft.transfer.device import HostCopyStream
from replicaft.transfer.donors import Donor
from replicaft.transfer.server import StateServer
from replicaft.transfer.snapshot import Snapshot

DONOR_ID = "donor"
HEAL_TIMEOUT_S = 600.0
COPY_REPEATS = 3
"""Timed host-to-device copies per ``h2d`` command; the answer is the fastest (the link's limit)."""


class Trainer:
    """The model, AdamW and a fixed batch on ``device``; :meth:`step` ends when its kernels do."""

    def __init__(self, width: int, layers: int, batch: int, device: torch.device, seed: int) -> None:
        torch.manual_seed(seed)
        self.device = device
        self.model = nn.Sequential(*(nn.Linear(width, width, bias=False) for _ in range(layers))).to(device)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-4)
        self.inputs = torch.randn(batch, width, device=device)
        self.step()  # AdamW's moments exist from here on

    def state(self) -> dict[str, Any]:
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}

    def step(self) -> None:
        self.optimizer.zero_grad()
        self.model(self.inputs).square().mean().backward()
        self.optimizer.step()
        self.synchronize()

    def synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


def _trainer(args: argparse.Namespace, seed: int) -> Trainer:
    return Trainer(args.width, args.layers, args.batch, torch.device(args.device), seed)


def _stdin_commands() -> queue.SimpleQueue[dict[str, Any] | None]:
    """Commands read by a thread, so the training loop can look for one between steps; None at EOF."""
    received: queue.SimpleQueue[dict[str, Any] | None] = queue.SimpleQueue()

    def read() -> None:
        for cmd in commands():
            received.put(cmd)
        received.put(None)

    threading.Thread(target=read, name="gpu-worker-stdin", daemon=True).start()
    return received


def donor(args: argparse.Namespace) -> None:
    trainer = _trainer(args, seed=0)
    server = StateServer("127.0.0.1")
    emit("ready", address=server.start())
    received = _stdin_commands()
    spare: torch.Tensor | None = None
    training, step = False, 0
    while True:
        if training:  # a step starts here: a serve's capture is inside the step it happens in
            started = time.monotonic()
            try:
                cmd = received.get_nowait()
            except queue.Empty:
                cmd = {}
        else:
            cmd = received.get()
            started = time.monotonic()
        if cmd is None:
            break
        op = cmd.get("op")
        if op == "serve":
            server.retain(set())  # the healer has finished with the last one: its buffer is reused
            flat = flatten(trainer.state())
            snapshot = Snapshot.capture(flat, step=step, quorum_id=1, replica_id=DONOR_ID, out=spare)
            spare = snapshot.buffer
            server.publish(snapshot)
            emit(
                "serving",
                step=step,
                num_bytes=snapshot.manifest.total_bytes,
                capture_start=started,
                capture_s=time.monotonic() - started,
                digest=digest(flat) if cmd.get("digest") else None,
            )
        elif op == "train":
            training = True
        elif op == "stop":
            training = False
            emit("stopped", steps=step)
        if training:
            trainer.step()
            step += 1
            emit("step", start=started, end=time.monotonic())
    server.stop()


def healer(args: argparse.Namespace) -> None:
    trainer = _trainer(args, seed=1)
    flat = flatten(trainer.state())
    into = dict(zip(flat.names, flat.tensors, strict=True))
    # On the CPU the staged pipeline (StagedWriter, a staging pool) runs through a host thread.
    stream = HostCopyStream() if trainer.device.type == "cpu" else None
    emit("ready")
    for cmd in commands():
        if cmd["op"] == "h2d":
            emit("copied", seconds=_h2d_seconds(cmd["bytes"], trainer.device), num_bytes=cmd["bytes"])
            continue
        start = time.monotonic()
        result = fetch_state(
            [Donor(DONOR_ID, cmd["address"])],
            cmd["step"],
            token=None,
            timeout_s=HEAL_TIMEOUT_S,
            into=into,
            stream=stream,
        )
        end = time.monotonic()
        healed = digest(flatten(trainer.state())) if cmd.get("digest") else None
        emit(
            "healed",
            start=start,
            end=end,
            seconds=end - start,
            num_bytes=result.manifest.total_bytes,
            in_place_bytes=result.in_place_bytes,
            digest=healed,
        )


def _h2d_seconds(num_bytes: int, device: torch.device) -> float:
    """The fastest of COPY_REPEATS copies of ``num_bytes`` from pinned host memory into ``device``."""
    cuda = device.type == "cuda"
    host = torch.full((num_bytes,), 7, dtype=torch.uint8, pin_memory=cuda)
    target = torch.empty(num_bytes, dtype=torch.uint8, device=device)
    fastest = float("inf")
    for _ in range(COPY_REPEATS):
        if cuda:
            torch.cuda.synchronize(device)
        started = time.perf_counter()
        target.copy_(host, non_blocking=cuda)
        if cuda:
            torch.cuda.synchronize(device)
        fastest = min(fastest, time.perf_counter() - started)
    return fastest


ROLES = {"donor": donor, "healer": healer}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("role", choices=sorted(ROLES))
    p.add_argument("--device", required=True, help="cuda, cuda:N or cpu")
    p.add_argument("--width", type=int, required=True)
    p.add_argument("--layers", type=int, required=True)
    p.add_argument("--batch", type=int, required=True)
    args = p.parse_args()
    ROLES[args.role](args)


if __name__ == "__main__":
    main()
