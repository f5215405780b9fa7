"""A replica group training a data-dependent model: each group leaves a different part unused.

The model has two equal-sized experts, ``a`` and ``b``; on each step a group's batch goes
through ``a`` alone or through both, and which one depends on the group and the step. So
the groups' backward passes fill their gradient buckets in different orders, while the
buckets' sizes match: the case where all-reducing buckets in fill order would pair one
group's ``a`` with another's ``b`` without any error. Configured by ``REPLICAFT_*``.

Usage: ``python tests/support/routed_train.py STEPS PARITY``: the batch goes through ``b`` on the
steps of this parity (give each group another).
"""

from __future__ import annotations

import sys

import torch
from torch import nn

import replicaft


class Routed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, use_b: bool) -> torch.Tensor:
        y = self.a(x)
        return y + self.b(x) if use_b else y


def main() -> int:
    steps, parity = int(sys.argv[1]), int(sys.argv[2])
    options = replicaft.ManagerOptions.from_env()
    torch.manual_seed(0)
    model = Routed()
    inputs = torch.randn(4, 8, generator=torch.Generator().manual_seed(7))
    with replicaft.Manager(options) as manager:
        ddp = replicaft.DistributedDataParallel(manager, model, bucket_cap_mb=1e-6)  # a bucket per parameter
        optimizer = replicaft.Optimizer(manager, torch.optim.SGD(model.parameters(), lr=0.1))
        while manager.current_step() < steps:
            optimizer.zero_grad()
            use_b = manager.current_step() % 2 == parity
            ddp(inputs, use_b).square().mean().backward()
            optimizer.step()
    return 0


if __name__ == "__main__":
    sys.exit(main())
