"""Fault-tolerant HSDP: FSDP2 shards the model inside each replica group, replicaft averages across.

One copy of this script is one rank of one replica group. Launch a group of W ranks with
torchrun, one torchrun per group, all against one lighthouse::

    REPLICAFT_LIGHTHOUSE=127.0.0.1:29510 REPLICAFT_REPLICA_ID=g0 \\
        python -m torch.distributed.run --standalone --nproc-per-node 2 examples/train_hsdp.py

or let the launcher do it: ``replicaft-launch --groups 2 --ranks-per-group 2 examples/train_hsdp.py``.

Inside a group the script initialises torch.distributed (Gloo on CPU; torchrun's RANK,
WORLD_SIZE, MASTER_ADDR and MASTER_PORT) and shards every layer over its W ranks with
``fully_shard``. Across groups nothing is a fixed process group: ``replicaft.wrappers.fsdp.FaultTolerantFSDP``
averages rank r's gradient shards over rank r of every group through the manager, so a group
that dies only costs the others an uncommitted step, and when it comes back each of its ranks
heals its own shards (parameters, AdamW moments) from the same rank of a healthy group.

Data: the ``ExactlyOnceSampler`` gives each rank its slice of its group's share of the step.
``--norm batch`` puts BatchNorm layers in the model, whose statistics (not sharded by FSDP)
are averaged across groups with the gradients, as the DDP wrapper does.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

import replicaft
from replicaft.data import ExactlyOnceSampler
from replicaft.wrappers.fsdp import FaultTolerantFSDP, shard_optimizer_state


def build_model(width: int, norm: str) -> nn.Sequential:
    def norm_layer() -> nn.Module:
        return nn.BatchNorm1d(width) if norm == "batch" else nn.LayerNorm(width)

    return nn.Sequential(
        nn.Linear(16, width), norm_layer(), nn.GELU(), nn.Linear(width, width), nn.GELU(), nn.Linear(width, 1)
    )


def shard(model: nn.Sequential, world_size: int) -> nn.Module:
    """FSDP2 over this group's ranks: each layer with parameters is one unit, then the root."""
    mesh = init_device_mesh("cpu", (world_size,))
    for layer in model:
        if any(True for _ in layer.parameters()):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def init_group_process_group(options: replicaft.ManagerOptions) -> None:
    """The group's own process group: torchrun's environment, or a private one for W = 1."""
    if options.group_world_size > 1:
        dist.init_process_group("gloo")
    else:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lighthouse", help="host:port of the lighthouse (default: $REPLICAFT_LIGHTHOUSE)")
    p.add_argument("--replica-id", help="this group's name (default: $REPLICAFT_REPLICA_ID)")
    p.add_argument("--steps", type=int, default=100, help="committed steps to train for")
    p.add_argument("--width", type=int, default=64, help="hidden width (model size)")
    p.add_argument("--norm", choices=("layer", "batch"), default="layer", help="normalisation layer")
    p.add_argument("--batch-size", type=int, default=32, help="samples per group per step (split over its ranks)")
    p.add_argument("--dataset-size", type=int, default=1000)
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--step-delay", type=float, default=0.0, help="seconds of extra work per step (demo pacing)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    try:
        options = replicaft.ManagerOptions.from_env(lighthouse=args.lighthouse, replica_id=args.replica_id)
    except replicaft.OptionsError as e:
        print(f"train_hsdp: error: {e}", file=sys.stderr)
        return 2
    init_group_process_group(options)
    torch.manual_seed(0)
    model = build_model(args.width, args.norm)
    target = build_model(args.width, "layer").eval()
    inputs = torch.randn(args.dataset_size, 16, generator=torch.Generator().manual_seed(1234))
    with torch.no_grad():
        labels = target(inputs)
    model = shard(model, options.group_world_size)
    try:
        with replicaft.Manager(options) as manager:
            hsdp = FaultTolerantFSDP(manager, model)
            inner = shard_optimizer_state(torch.optim.AdamW(hsdp.parameters(), lr=args.lr))
            scheduler = torch.optim.lr_scheduler.LambdaLR(inner, lambda step: 1.0 / (1.0 + step / 100))
            optimizer = replicaft.Optimizer(manager, inner, scheduler)
            sampler = ExactlyOnceSampler(manager, args.dataset_size, args.batch_size)
            started = time.monotonic()
            while manager.current_step() < args.steps:
                optimizer.zero_grad()
                # A healer's gradient is replaced by zeros, but it still runs the step (any
                # batch) so that its collectives, inside the group and across, line up.
                ids = sampler.step_indices() or list(range(max(args.batch_size // options.group_world_size, 2)))
                loss = nn.functional.mse_loss(hsdp(inputs[ids]), labels[ids])
                loss.backward()
                manager.annotate_commit(loss=loss.item())
                if args.step_delay:
                    time.sleep(args.step_delay)
                if optimizer.step() and manager.current_step() % 10 == 0 and options.group_rank == 0:
                    print(
                        f"[{options.replica_id}] step {manager.current_step()} loss {loss.item():.4f} "
                        f"groups {manager.num_participants()} ({time.monotonic() - started:.1f}s)",
                        flush=True,
                    )
    except replicaft.OptionsError as e:  # e.g. a setting this script's sharded state cannot honour
        print(f"train_hsdp: error: {e}", file=sys.stderr)
        return 2
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except replicaft.GroupBroken as e:  # a rank of this group died, or a failed heal left no one to heal from
        print(f"train_hsdp: {e}", file=sys.stderr)
        sys.exit(1)
