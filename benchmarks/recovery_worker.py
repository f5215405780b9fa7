"""One replica group of the recovery benchmark: a plain training loop of a given size, on one core.

The model is ``layers`` square linear layers of ``width`` (no bias): width² × layers float32
parameters, three times that in state with AdamW's moments. Inputs are random, so start-up is
imports, building the model and starting the manager, as in a real script; there is no dataset
to prepare. ``--cpu`` pins the process (and torch's threads) to one core before torch is
imported: the benchmark gives the donor and the healer a core each, as separate hosts would
have, so the healer's own work does not land on the donor's core. Everything is reported
through replicaft's event log (``REPLICAFT_EVENTS_DIR``).

Under ``replicaft-launch`` every group gets the same arguments, so ``--cpu-by-replica-id`` pins
g0 to core 0 and g1 to core 1. A group the launcher restarts in its warm standby has imported
torch before it was pinned; the pinning applies to every thread started after it (torch's
intra-op threads start on first use).

``--impl plain`` runs the same loop with no fault tolerance at all (plain torch, no process
group), reporting steps on stdout like torchft below: how soon a fresh process of this script
can finish its first step on this machine, the floor under any restart.

``--impl torchft`` runs the same loop under torchft 0.2.0 (its Manager, DDP and Optimizer
wrappers, ProcessGroupGloo, its default HTTP checkpoint transport, ``init_sync``) against a
torchft lighthouse at ``--lighthouse``, and reports each step on stdout as a JSON line
(``{"event": "step", "ts", "step", "committed", "step_time_s"}``): torchft has no event log.
Its timeouts are raised to 300 s so that a slow heal is measured rather than cut off.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from datetime import timedelta
from typing import Any


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--width", type=int, required=True)
    p.add_argument("--layers", type=int, required=True)
    p.add_argument("--cpu", type=int, default=None, help="pin to this core")
    p.add_argument(
        "--cpu-by-replica-id",
        action="store_true",
        help="pin to the core numbered by the digits of REPLICAFT_REPLICA_ID (g0: core 0, g1: core 1), "
        "for groups started by replicaft-launch, which gives every group the same arguments",
    )
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--impl", choices=["replicaft", "torchft", "plain"], default="replicaft")
    p.add_argument("--lighthouse", help="torchft: http://host:port of its lighthouse")
    p.add_argument("--replica-id", help="torchft: this group's replica id")
    args = p.parse_args()
    if args.cpu_by_replica_id:
        args.cpu = int("".join(c for c in os.environ["REPLICAFT_REPLICA_ID"] if c.isdigit())) % (os.cpu_count() or 1)
    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})
    {"replicaft": train_replicaft, "torchft": train_torchft, "plain": train_plain}[args.impl](args)


def build(args: argparse.Namespace) -> Any:
    import torch
    from torch import nn

    torch.set_num_threads(1)
    torch.manual_seed(0)
    return nn.Sequential(*(nn.Linear(args.width, args.width, bias=False) for _ in range(args.layers)))


def train_replicaft(args: argparse.Namespace) -> None:
    import torch

    import replicaft

    model = build(args)
    options = replicaft.ManagerOptions.from_env()
    with replicaft.Manager(options) as manager:
        ddp = replicaft.DistributedDataParallel(manager, model)
        optimizer = replicaft.Optimizer(manager, torch.optim.AdamW(model.parameters(), lr=1e-5))
        inputs = torch.randn(args.batch, args.width)
        while True:
            optimizer.zero_grad()
            ddp(inputs).square().mean().backward()
            optimizer.step()


def train_plain(args: argparse.Namespace) -> None:
    import torch

    model = build(args)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    inputs = torch.randn(args.batch, args.width)
    step = 0
    while True:
        started = time.monotonic()
        optimizer.zero_grad()
        model(inputs).square().mean().backward()
        optimizer.step()
        step += 1
        report_step(step, True, started)


def report_step(step: int, committed: bool, started: float) -> None:
    """One step as a JSON line on stdout (the plain and torchft loops have no event log)."""
    print(
        json.dumps(
            {
                "event": "step",
                "ts": time.time(),
                "step": step,
                "committed": committed,
                "step_time_s": time.monotonic() - started,
            }
        ),
        flush=True,
    )


def train_torchft(args: argparse.Namespace) -> None:
    import torch
    from torchft import DistributedDataParallel, Manager, Optimizer, ProcessGroupGloo

    model = build(args)
    inner = torch.optim.AdamW(model.parameters(), lr=1e-5)
    # torchft's Manager joins an existing group store; with W = 1 the group hosts its own.
    store = torch.distributed.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)

    def state_dict() -> dict[str, Any]:
        return {"model": model.state_dict(), "optim": inner.state_dict()}

    def load_state_dict(state: dict[str, Any]) -> None:
        model.load_state_dict(state["model"])
        inner.load_state_dict(state["optim"])

    long = timedelta(seconds=300)
    manager = Manager(
        pg=ProcessGroupGloo(timeout=long),
        load_state_dict=load_state_dict,
        state_dict=state_dict,
        min_replica_size=1,
        timeout=long,
        quorum_timeout=long,
        connect_timeout=long,
        replica_id=args.replica_id,
        lighthouse_addr=args.lighthouse,
        store_addr="127.0.0.1",
        store_port=store.port,
        rank=0,
        world_size=1,
        hostname="127.0.0.1",
    )
    ddp = DistributedDataParallel(manager, model)
    optimizer = Optimizer(manager, inner)
    inputs = torch.randn(args.batch, args.width)
    while True:
        started = time.monotonic()
        optimizer.zero_grad()
        ddp(inputs).square().mean().backward()
        before = manager.current_step()
        optimizer.step()
        step = manager.current_step()
        report_step(step, step > before, started)


if __name__ == "__main__":
    main()
