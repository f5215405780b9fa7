"""One replica group of the recovery benchmark: a plain training loop of a given size, on one core.

The model is ``layers`` square linear layers of ``width`` (no bias): width² × layers float32
parameters, three times that in state with AdamW's moments. Inputs are random, so start-up is
imports, building the model and starting the manager, as in a real script; there is no dataset
to prepare. ``--cpu`` pins the process (and torch's threads) to one core before torch is
imported: the benchmark gives the donor and the healer a core each, as separate hosts would
have, so the healer's own work does not land on the donor's core. Everything is reported
through replicaft's event log (``REPLICAFT_EVENTS_DIR``).
"""

from __future__ import annotations

import argparse
import os


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--width", type=int, required=True)
    p.add_argument("--layers", type=int, required=True)
    p.add_argument("--cpu", type=int, default=None, help="pin to this core")
    p.add_argument("--batch", type=int, default=8)
    args = p.parse_args()
    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})
    import torch
    from torch import nn

    import replicaft

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = nn.Sequential(*(nn.Linear(args.width, args.width, bias=False) for _ in range(args.layers)))
    options = replicaft.ManagerOptions.from_env()
    with replicaft.Manager(options) as manager:
        ddp = replicaft.DistributedDataParallel(manager, model)
        optimizer = replicaft.Optimizer(manager, torch.optim.AdamW(model.parameters(), lr=1e-5))
        inputs = torch.randn(args.batch, args.width)
        while True:
            optimizer.zero_grad()
            ddp(inputs).square().mean().backward()
            optimizer.step()


if __name__ == "__main__":
    main()
