"""A training script written the way a torchft user writes one; only the import differs.

Prints one JSON line per committed step and, at the end, a digest of the final weights.
"""

import hashlib
import json
import sys
import time
from datetime import timedelta

import torch
from torch import nn

from replicaft.compat.torchft import DistributedDataParallel, Manager, Optimizer, ProcessGroupGloo


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def main() -> None:
    steps = int(sys.argv[1])
    step_time_s = float(sys.argv[2])
    torch.manual_seed(0)
    model = Net()
    optim = torch.optim.AdamW(model.parameters(), lr=1e-2)

    def state_dict() -> dict:
        return {"model": model.state_dict(), "optim": optim.state_dict()}

    def load_state_dict(state: dict) -> None:
        model.load_state_dict(state["model"])
        optim.load_state_dict(state["optim"])

    manager = Manager(
        pg=ProcessGroupGloo(timeout=timedelta(seconds=10)),
        load_state_dict=load_state_dict,
        state_dict=state_dict,
        min_replica_size=1,
        timeout=timedelta(seconds=10),
        quorum_timeout=timedelta(seconds=60),
    )
    ddp = DistributedDataParallel(manager, model)
    optimizer = Optimizer(manager, optim)
    while manager.current_step() < steps:
        optimizer.zero_grad()
        x = torch.randn(16, 8)
        loss = (ddp(x) - x.sum(dim=1, keepdim=True)).square().mean()
        loss.backward()
        time.sleep(step_time_s)  # stands for the rest of a real step's work
        before = manager.current_step()
        optimizer.step()
        if manager.current_step() > before:
            print(json.dumps({"event": "step", "step": manager.current_step()}), flush=True)
    weights = b"".join(p.detach().numpy().tobytes() for p in model.parameters())
    print(json.dumps({"event": "final", "digest": hashlib.sha256(weights).hexdigest()}), flush=True)
    manager.shutdown()


if __name__ == "__main__":
    main()
