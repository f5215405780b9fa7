"""One replica group of the deterministic benchmark: the same training in normal or deterministic mode.

A model with BatchNorm trains with AdamW on a fixed synthetic regression set, global batch
``--batch`` per step (``policy="global"``), through ``replicaft.DistributedDataParallel``.
Prints ``{"event": "done", ...}`` with, per committed step: its wall time (``zero_grad`` to
``step``), the bytes this rank all-reduced (every tensor handed to ``Manager.allreduce``),
the loss on a fixed evaluation set after the step, and the largest averaged gradient; and a
digest of the final parameters and buffers. The deterministic mode's fixed-point error bound
of each step is in the step's "commit" event (``fixed_point_bound``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time
from typing import Any

import torch
from torch import nn

import replicaft
from replicaft.data import ExactlyOnceSampler, StepDataLoader

DATASET = 2048
FEATURES = 32


def build_model(width: int) -> nn.Module:
    return nn.Sequential(
        nn.Linear(FEATURES, width),
        nn.BatchNorm1d(width),
        nn.ReLU(),
        nn.Linear(width, width),
        nn.ReLU(),
        nn.Linear(width, 1),
    )


def state_digest(model: nn.Module) -> str:
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(t.detach().reshape(-1).contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--lighthouse", required=True)
    p.add_argument("--replica-id", required=True)
    p.add_argument("--deterministic", action="store_true")
    p.add_argument("--shards", type=int, default=8)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--events-dir", required=True, help="the commit events carry the fixed-point error bound")
    args = p.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = build_model(args.width)
    target = build_model(args.width).eval()
    g = torch.Generator().manual_seed(1234)
    inputs, held_out = torch.randn(DATASET, FEATURES, generator=g), torch.randn(256, FEATURES, generator=g)
    with torch.no_grad():
        labels, held_out_labels = target(inputs), target(held_out)
    options = replicaft.ManagerOptions(
        lighthouse=args.lighthouse,
        replica_id=args.replica_id,
        digest_every_steps=0,
        events_dir=args.events_dir,
        deterministic=args.deterministic,
        virtual_shards=args.shards,
    )
    with replicaft.Manager(options) as manager:
        ddp = replicaft.DistributedDataParallel(manager, model)
        optimizer = replicaft.Optimizer(manager, torch.optim.AdamW(model.parameters(), lr=3e-3))
        sampler = ExactlyOnceSampler(manager, DATASET, args.batch, policy="global")
        loader = StepDataLoader(sampler, torch.utils.data.TensorDataset(inputs, labels))
        wire = [0]
        reduce = manager.allreduce

        def counted(tensor: torch.Tensor, **kw: Any) -> Any:
            wire[0] += tensor.numel() * tensor.element_size()
            return reduce(tensor, **kw)

        manager.allreduce = counted  # type: ignore[method-assign]
        record: dict[str, list[float]] = {"step_s": [], "wire_bytes": [], "eval_loss": [], "grad_max": []}
        while manager.current_step() < args.steps:
            started = time.perf_counter()
            wire[0] = 0
            optimizer.zero_grad()
            batches = loader.micro_batches() or [((inputs[:8], labels[:8]), 1.0)]
            for (x, y), weight in batches:
                (nn.functional.mse_loss(ddp(x), y) * weight).backward()
            grad_max = max(float(q.grad.abs().max()) for q in model.parameters() if q.grad is not None)
            committed = optimizer.step()
            took = time.perf_counter() - started
            if not committed:
                continue
            model.eval()
            with torch.no_grad():
                eval_loss = float(nn.functional.mse_loss(model(held_out), held_out_labels))
            model.train()
            record["step_s"].append(took)
            record["wire_bytes"].append(wire[0])
            record["eval_loss"].append(eval_loss)
            record["grad_max"].append(grad_max)
        print(json.dumps({"event": "done", "digest": state_digest(model), **record}), flush=True)


if __name__ == "__main__":
    main()
