"""One trainer process of the step-overhead benchmark: plain DDP or replicaft, same model.

Prints JSON lines: ``{"event": "ready"}`` once built, then ``{"event": "done",
"step_s": [...], "phases_s": {...}}`` with the wall time of every timed step (``zero_grad`` to
``step``) and, for replicaft, each phase's time in every timed step (``Manager.step_phases``).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable

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


def timed_steps(step: Callable[[], None], warmup: int, steps: int,
                phases: Callable[[], dict[str, float]] = dict) -> tuple[list[float], dict[str, list[float]]]:
    times: list[float] = []
    by_phase: dict[str, list[float]] = {}
    for i in range(warmup + steps):
        started = time.perf_counter()
        step()
        if i >= warmup:
            times.append(time.perf_counter() - started)
            for name, took in phases().items():
                by_phase.setdefault(name, []).append(took)
    return times, by_phase


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
    args = p.parse_args()
    torch.set_num_threads(1)
    model = build_model(args.size_mb)
    x = torch.randn(BATCH, HIDDEN)

    if args.mode == "ddp":
        dist.init_process_group("gloo", init_method=f"tcp://{args.store}", rank=args.rank, world_size=args.world)
        ddp = nn.parallel.DistributedDataParallel(model)
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)

        def step() -> None:
            opt.zero_grad()
            ddp(x).square().mean().backward()
            opt.step()

        print(json.dumps({"event": "ready"}), flush=True)
        times, phases = timed_steps(step, args.warmup, args.steps)
        dist.destroy_process_group()
    else:
        options = replicaft.ManagerOptions(lighthouse=args.lighthouse, replica_id=f"g{args.rank}",
                                           events_dir=args.events_dir, digest_every_steps=1 if args.events_dir else 0)
        with replicaft.Manager(options, init_sync=False) as manager:
            ddp = replicaft.DistributedDataParallel(manager, model)
            opt = replicaft.Optimizer(manager, torch.optim.SGD(model.parameters(), lr=1e-3))

            def step() -> None:
                opt.zero_grad()
                ddp(x).square().mean().backward()
                if not opt.step():
                    raise RuntimeError(f"step {manager.current_step()} did not commit: {manager.errored()}")

            print(json.dumps({"event": "ready"}), flush=True)
            times, phases = timed_steps(step, args.warmup, args.steps, manager.step_phases)
    print(json.dumps({"event": "done", "step_s": times, "phases_s": phases}), flush=True)


if __name__ == "__main__":
    main()
