"""A replica group that averages gradients the way torchtitan's HSDP does, through c10d.

FSDP2 shards the model over the group's own one-rank mesh; every FSDP module's all-reduce hook
calls ``dist.all_reduce(grad, group=pg, op=ReduceOp.AVG)`` with ``pg`` a registered
``replicaft.ManagedProcessGroup``, and the loss is averaged with a functional collective on the
same group. Nothing else reaches across groups: no replicaft wrapper owns the model. The
manager's events carry each committed step's digest.

Usage: managed_group_train.py STEPS STEP_DELAY_S; the manager's options from REPLICAFT_*.
"""

import sys
import time

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, fully_shard

import replicaft
from replicaft.data import ExactlyOnceSampler


def build_model() -> nn.Module:
    torch.manual_seed(0)
    mesh = init_device_mesh("cpu", (1,))
    model = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 1))
    for layer in (model[0], model[2]):
        fully_shard(layer, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def main() -> None:
    steps, delay_s = int(sys.argv[1]), float(sys.argv[2])
    options = replicaft.ManagerOptions.from_env()
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    model = build_model()
    params = dict(model.named_parameters())  # the shards (DTensors), captured while sharded
    inputs = torch.randn(512, 8, generator=torch.Generator().manual_seed(1))
    labels = inputs.sum(dim=1, keepdim=True)

    def load_model(state: dict) -> None:
        with torch.no_grad():
            for name, value in state.items():
                params[name].to_local().copy_(value)

    with replicaft.Manager(options) as manager:
        inner = replicaft.shard_optimizer_state(torch.optim.AdamW(model.parameters(), lr=1e-2))
        optimizer = replicaft.Optimizer(manager, inner)
        manager.register_state("model", lambda: dict(params), load_model)
        pg = replicaft.ManagedProcessGroup(manager).register("dp_replicate")
        for module in model.modules():
            if isinstance(module, FSDPModule):
                module.set_all_reduce_hook(lambda grad: dist.all_reduce(grad, group=pg, op=dist.ReduceOp.AVG))
        sampler = ExactlyOnceSampler(manager, len(inputs), 16)
        while manager.current_step() < steps:
            optimizer.zero_grad()
            ids = sampler.step_indices() or list(range(16))  # a healer still runs the step's collectives
            loss = nn.functional.mse_loss(model(inputs[ids]), labels[ids])
            loss.backward()
            mean_loss = funcol.all_reduce(loss.detach(), "avg", group=pg)
            manager.annotate_commit(loss=float(mean_loss))
            time.sleep(delay_s)  # stands for the rest of a real step's work
            optimizer.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
