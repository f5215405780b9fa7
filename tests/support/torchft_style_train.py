"""A training script written the way torchft's train_ddp.py is, with offline data: it imports
``torchft`` and nothing of replicaft, so it runs unmodified with the alias folder
(replicaft/compat/torchft_alias) first on the path.

The imports that stopped train_ddp.py on the earlier shim are here: ``DistributedSampler``,
the process-group names, and ``torchft.checkpointing.pg_transport.PGTransport`` handed to the
``Manager``. Prints one JSON line per committed step with a digest of the weights and, at the
end, the final digest.
"""

import hashlib
import json
import os
import sys
import time
from datetime import timedelta

import torch
from torch import nn
from torchft import (
    DistributedDataParallel,
    DistributedSampler,
    Manager,
    Optimizer,
    ProcessGroupGloo,
    ProcessGroupNCCL,
)
from torchft.checkpointing.pg_transport import PGTransport


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def digest(model: nn.Module) -> str:
    return hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest()


def main() -> None:
    steps = int(sys.argv[1])
    step_time_s = float(sys.argv[2])
    group = int(os.environ.get("REPLICA_GROUP_NUM", "0"))
    torch.manual_seed(0)
    inputs = torch.randn(512, 8, generator=torch.Generator().manual_seed(1))
    trainset = torch.utils.data.TensorDataset(inputs, inputs.sum(dim=1, keepdim=True))
    sampler = DistributedSampler(
        trainset, replica_rank=group, num_replica_groups=2, group_rank=0, num_replicas=1, shuffle=True
    )
    loader = torch.utils.data.DataLoader(trainset, batch_size=16, sampler=sampler)
    model = Net()
    optim = torch.optim.AdamW(model.parameters(), lr=1e-2)

    def state_dict() -> dict:
        return {"model": model.state_dict(), "optim": optim.state_dict()}

    def load_state_dict(state: dict) -> None:
        model.load_state_dict(state["model"])
        optim.load_state_dict(state["optim"])

    pg = (
        ProcessGroupNCCL(timeout=timedelta(seconds=10))
        if torch.cuda.is_available()
        else ProcessGroupGloo(timeout=timedelta(seconds=10))
    )
    manager = Manager(
        pg=pg,
        load_state_dict=load_state_dict,
        state_dict=state_dict,
        min_replica_size=1,
        timeout=timedelta(seconds=10),
        quorum_timeout=timedelta(seconds=60),
        checkpoint_transport=PGTransport(pg, timeout=timedelta(seconds=10), device="cpu"),
    )
    ddp = DistributedDataParallel(manager, model)
    optimizer = Optimizer(manager, optim)
    while manager.current_step() < steps:
        for x, y in loader:
            optimizer.zero_grad()
            loss = nn.functional.mse_loss(ddp(x), y)
            loss.backward()
            time.sleep(step_time_s)  # stands for the rest of a real step's work
            before = manager.current_step()
            optimizer.step()
            if manager.current_step() > before:
                print(
                    json.dumps({"event": "step", "step": manager.current_step(), "digest": digest(model)}), flush=True
                )
            if manager.current_step() >= steps:
                break
    print(json.dumps({"event": "final", "digest": digest(model)}), flush=True)
    manager.shutdown()


if __name__ == "__main__":
    main()
