"""A replica group whose rank reports an error in the middle of one step (``report_error``).

Usage: ``python tests/support/reported_error_train.py STEPS MODE FAIL_STEP [ddp|fsdp]``. The group named
``g0`` reports a ``RuntimeError`` once, at step FAIL_STEP:

* ``allreduce``: through the manager's API, before the step's ``allreduce()`` call;
* ``backward``: before backward through ``DistributedDataParallel``, which still runs;
* ``skip-backward``: in place of forward and backward (a failed data load), then
  ``optimizer.step()`` at once;
* ``short-backward``: no error reported, but only the step's first micro-batch goes through
  backward (the deterministic mode takes one per virtual shard the group owns).

With ``fsdp`` the model is FSDP2 over a group of one rank under ``FaultTolerantFSDP`` instead
of ``DistributedDataParallel``. The other groups run the step as usual. Configured by
``REPLICAFT_*``.
"""

from __future__ import annotations

import contextlib
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

import replicaft
from replicaft.data import ExactlyOnceSampler, StepDataLoader
from replicaft.wrappers.fsdp import FaultTolerantFSDP, shard_optimizer_state

MODES = ("allreduce", "backward", "skip-backward", "short-backward")


def train_with_allreduce(manager: replicaft.Manager, steps: int, fail_step: int, fails: bool) -> None:
    weights = torch.zeros(1000)
    manager.register_state("weights", lambda: {"weights": weights}, lambda s: weights.copy_(s["weights"]))
    while manager.current_step() < steps:
        step = manager.current_step()
        manager.start_quorum()
        if fails and step == fail_step:
            fails = False
            manager.report_error(RuntimeError(f"injected by the test at step {step}"))
        update = torch.full((1000,), float(step + 1))
        work = manager.allreduce(update)
        work.wait()
        if manager.should_commit():
            weights.add_(update)


def train_with_wrapper(
    manager: replicaft.Manager, steps: int, fail_step: int, fails: bool, mode: str, fsdp: bool
) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.BatchNorm1d(32), nn.Linear(32, 4))
    ddp: nn.Module
    if fsdp:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        mesh = init_device_mesh("cpu", (1,))
        for layer in model:
            if any(True for _ in layer.parameters()):
                fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        ddp = FaultTolerantFSDP(manager, model)
        inner = shard_optimizer_state(torch.optim.SGD(ddp.parameters(), lr=0.1))
    else:
        ddp = replicaft.DistributedDataParallel(manager, model, bucket_cap_mb=1e-3)  # several buckets
        inner = torch.optim.SGD(model.parameters(), lr=0.1)
    optimizer = replicaft.Optimizer(manager, inner)
    generator = torch.Generator().manual_seed(1)
    data = torch.utils.data.TensorDataset(
        torch.randn(512, 16, generator=generator), torch.randn(512, 4, generator=generator)
    )
    # The deterministic mode takes one backward per virtual shard the group owns (micro-batches).
    policy = "global" if manager.options.deterministic else "per_group"
    loader = StepDataLoader(
        ExactlyOnceSampler(manager, len(data), 16, policy=policy),
        data,
        micro_batch_size=None if manager.options.deterministic else 8,
    )
    while manager.current_step() < steps:
        step = manager.current_step()
        optimizer.zero_grad()
        batches = loader.micro_batches() or [(data[:16], 1.0)]  # a healer's batch: any
        if fails and step == fail_step:
            fails = False
            if mode == "short-backward":
                batches = batches[:1]
            else:
                manager.report_error(RuntimeError(f"injected by the test at step {step}"))
            if mode == "skip-backward":
                optimizer.step()
                continue
        for i, ((x, y), weight) in enumerate(batches):
            with contextlib.nullcontext() if i == len(batches) - 1 else ddp.no_sync():
                (nn.functional.mse_loss(ddp(x), y) * weight).backward()
        optimizer.step()


def main() -> int:
    steps, mode, fail_step = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    fsdp = sys.argv[4:] == ["fsdp"]  # else ddp
    if mode not in MODES:
        raise SystemExit(f"mode {mode!r}; expected one of {MODES}")
    options = replicaft.ManagerOptions.from_env()
    fails = options.replica_id == "g0"
    with replicaft.Manager(options) as manager:
        if mode == "allreduce":
            train_with_allreduce(manager, steps, fail_step, fails)
        else:
            train_with_wrapper(manager, steps, fail_step, fails, mode, fsdp)
    return 0


if __name__ == "__main__":
    sys.exit(main())
