"""One trainer process of the step-overhead benchmark: plain DDP or replicaft, same model.

``--device cuda`` trains on the GPU (both sides all-reduce the CUDA gradients over Gloo, so
that several trainers can share one GPU, which NCCL refuses) and ends every timed step with
``torch.cuda.synchronize()``, so a step's time is its kernels', not their launch
(``python -m benchmarks gpu``); ``--batch`` sets how much compute a step has.

Prints JSON lines: ``{"event": "ready"}`` once built, then ``{"event": "done",
"step_s": [...], "segments_s": {...}, "phases_s": {...}}`` with the wall time of every timed
step (``zero_grad`` to ``step``), of each of its four calls (``zero_grad``, ``forward``,
``backward``, ``step``: the same segments on both sides, so the gap splits along them) and,
for replicaft, each phase's time in every timed step (``Manager.step_phases``).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist
from torch import nn

import replicaft

HIDDEN = 1024
BATCH = 32


def build_model(size_mb: float) -> nn.Module:
    """A stack of HIDDEN x HIDDEN linear layers holding about ``size_mb`` of float32 parameters."""
    layers = max(1, round(size_mb * 1024 * 1024 / (4 * (HIDDEN * HIDDEN + HIDDEN))))
    torch.manual_seed(0)
    return nn.Sequential(*[m for _ in range(layers) for m in (nn.Linear(HIDDEN, HIDDEN), nn.ReLU())])


SEGMENTS = ("zero_grad", "forward", "backward", "step")


def timed_steps(
    segments: Sequence[Callable[[], None]], warmup: int, steps: int, phases: Callable[[], dict[str, float]] = dict
) -> tuple[list[float], dict[str, list[float]], dict[str, list[float]]]:
    """Run ``warmup + steps`` steps, each the ``SEGMENTS`` calls in order; the timed steps'
    wall times, their segments' and their ``phases()``."""
    times: list[float] = []
    by_segment: dict[str, list[float]] = {name: [] for name in SEGMENTS}
    by_phase: dict[str, list[float]] = {}
    for i in range(warmup + steps):
        marks = [time.perf_counter()]
        for segment in segments:
            segment()
            marks.append(time.perf_counter())
        if i >= warmup:
            times.append(marks[-1] - marks[0])
            for name, start, end in zip(SEGMENTS, marks[:-1], marks[1:], strict=True):
                by_segment[name].append(end - start)
            for name, took in phases().items():
                by_phase.setdefault(name, []).append(took)
    return times, by_segment, by_phase


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--mode", choices=["ddp", "replicaft"], required=True)
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world", type=int, required=True)
    p.add_argument("--store", help="host:port of the rendezvous store (ddp; rank 0 hosts it)")
    p.add_argument("--lighthouse", help="host:port (replicaft)")
    p.add_argument("--size-mb", type=float, required=True)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--events-dir", help="replicaft: write the event log (with a digest every step) here")
    p.add_argument("--device", default="cpu", help="where the model trains: cpu, cuda or cuda:N")
    p.add_argument("--batch", type=int, default=BATCH, help="samples per step")
    args = p.parse_args()
    torch.set_num_threads(1)
    device = torch.device(args.device)
    model = build_model(args.size_mb).to(device)
    x = torch.randn(args.batch, HIDDEN, device=device)
    synchronize = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    if args.mode == "ddp":
        dist.init_process_group("gloo", init_method=f"tcp://{args.store}", rank=args.rank, world_size=args.world)
        ddp = nn.parallel.DistributedDataParallel(model)
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)

        loss: list[torch.Tensor] = []

        def step() -> None:
            opt.step()
            synchronize()

        print(json.dumps({"event": "ready"}), flush=True)
        times, segments, phases = timed_steps(
            (opt.zero_grad, lambda: loss.append(ddp(x).square().mean()), lambda: loss.pop().backward(), step),
            args.warmup,
            args.steps,
        )
        dist.destroy_process_group()
    else:
        # Gloo, as plain DDP above: the trainers may share one GPU, which NCCL refuses.
        options = replicaft.ManagerOptions(
            lighthouse=args.lighthouse,
            replica_id=f"g{args.rank}",
            backend="gloo",
            events_dir=args.events_dir,
            digest_every_steps=1 if args.events_dir else 0,
        )
        with replicaft.Manager(options, init_sync=False) as manager:
            ddp = replicaft.DistributedDataParallel(manager, model)
            opt = replicaft.Optimizer(manager, torch.optim.SGD(model.parameters(), lr=1e-3))

            loss: list[torch.Tensor] = []

            def step() -> None:
                if not opt.step():
                    raise RuntimeError(f"step {manager.current_step()} did not commit: {manager.errored()}")
                synchronize()

            print(json.dumps({"event": "ready"}), flush=True)
            times, segments, phases = timed_steps(
                (opt.zero_grad, lambda: loss.append(ddp(x).square().mean()), lambda: loss.pop().backward(), step),
                args.warmup,
                args.steps,
                manager.step_phases,
            )
    print(json.dumps({"event": "done", "step_s": times, "segments_s": segments, "phases_s": phases}), flush=True)


if __name__ == "__main__":
    main()
