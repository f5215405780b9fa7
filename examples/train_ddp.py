"""The smallest complete replicaft training script: one replica group of a data-parallel job.

Run several copies (one per group) against one lighthouse; the launcher does that for you::

    replicaft-launch --groups 3 examples/train_ddp.py --steps 200

Everything a real script has is here: a model (with BatchNorm, whose statistics replicaft keeps
identical across groups), AdamW, an LR schedule, data, the two wrappers, and the lighthouse
address from the environment (``REPLICAFT_LIGHTHOUSE``, set by the launcher) or ``--lighthouse``.

Data: a fixed synthetic regression dataset read in exactly-once order: the
``ExactlyOnceSampler`` hands each group its share of the step's samples, and its cursor
travels with heals, so across any failures every sample trains in exactly one committed step.
With ``REPLICAFT_DETERMINISTIC=1`` the batch policy is ``global`` (``--batch-size`` is then the
step's global batch, cut into ``REPLICAFT_VIRTUAL_SHARDS`` shards) and the run ends bit for bit
where the same run with any other membership, or any failures, ends (replicaft/deterministic/rules.py).
``--data hf`` holds the same samples in a Hugging Face ``datasets.Dataset``; ``--stateful-loader``
loads them through the user's own torchdata ``StatefulDataLoader`` (``StepDataLoader.from_loader``),
its state carried by checkpoints (replicaft/data/stateful.py).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
import time

import torch
from torch import nn

import replicaft
from replicaft.data import ExactlyOnceSampler, StepDataLoader
from replicaft.errors import CheckpointStoreUnavailable
from replicaft.persistence.resume_check import ResumeDiverged
from replicaft.state.grad_scaler import GradScalerState


def build_model(width: int, dropout: float = 0.0) -> nn.Module:
    if not dropout:
        return nn.Sequential(
            nn.Linear(16, width),
            nn.BatchNorm1d(width),
            nn.ReLU(),
            nn.Linear(width, width),
            nn.ReLU(),
            nn.Linear(width, 1),
        )
    return nn.Sequential(
        nn.Linear(16, width),
        nn.BatchNorm1d(width),
        nn.ReLU(),
        nn.Dropout(dropout),
        nn.Linear(width, width),
        nn.ReLU(),
        nn.Dropout(dropout),
        nn.Linear(width, 1),
    )


def build_loader(
    args: argparse.Namespace,
    options: replicaft.ManagerOptions,
    sampler: ExactlyOnceSampler,
    inputs: torch.Tensor,
    labels: torch.Tensor,
) -> StepDataLoader:
    """The step loader over the samples as ``--data`` holds them, through ``--stateful-loader``'s loader or not."""
    if args.data == "hf":
        import datasets  # optional: only this flag needs it

        columns = {"id": list(range(len(inputs))), "x": inputs.numpy(), "y": labels.numpy()}
        dataset: torch.utils.data.Dataset = datasets.Dataset.from_dict(columns).with_format("torch")
    else:
        dataset = torch.utils.data.TensorDataset(inputs, labels)
    if not args.stateful_loader:
        return StepDataLoader(sampler, dataset, micro_batch_size=args.micro_batch, num_workers=args.num_workers)
    from torchdata.stateful_dataloader import StatefulDataLoader  # optional: only this flag needs it

    shard = args.batch_size // options.virtual_shards if options.deterministic else args.batch_size
    user_loader = StatefulDataLoader(dataset, batch_size=args.micro_batch or shard, num_workers=args.num_workers)
    return StepDataLoader.from_loader(sampler, user_loader)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lighthouse", help="host:port of the lighthouse (default: $REPLICAFT_LIGHTHOUSE)")
    p.add_argument("--replica-id", help="this group's name (default: $REPLICAFT_REPLICA_ID)")
    p.add_argument("--steps", type=int, default=100, help="committed steps to train for")
    p.add_argument("--width", type=int, default=64, help="hidden width (model size)")
    p.add_argument("--batch-size", type=int, default=32, help="samples per group per step")
    p.add_argument("--dataset-size", type=int, default=1000)
    p.add_argument("--micro-batch", type=int, default=None, help="accumulate gradients over micro-batches of this size")
    p.add_argument("--num-workers", type=int, default=0, help="DataLoader worker processes")
    p.add_argument(
        "--data",
        choices=("tensors", "hf"),
        default="tensors",
        help="the samples as a TensorDataset, or as a Hugging Face datasets.Dataset (with an id column)",
    )
    p.add_argument(
        "--stateful-loader",
        action="store_true",
        help="load through a torchdata StatefulDataLoader handed to StepDataLoader.from_loader",
    )
    p.add_argument(
        "--annotate-ids",
        action="store_true",
        help="with --data hf: annotate each commit with the dataset ids this group trained on "
        "(a test's check that the loader delivered the sampler's share)",
    )
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--device", default="cpu", help="where the model trains: cpu, cuda or cuda:N")
    p.add_argument(
        "--loss-scale",
        type=float,
        default=1.0,
        help="multiply the loss by this: a changed loss normalisation, which the verification of a resume "
        "from disk reports (replicaft/persistence/resume_check.py)",
    )
    p.add_argument(
        "--dropout",
        type=float,
        default=0.0,
        help="dropout probability: draws from torch's global generator, which heals and checkpoints carry",
    )
    p.add_argument(
        "--grad-scaler",
        action="store_true",
        help="scale the loss with torch.amp.GradScaler (growth every 4 steps), registered with the manager",
    )
    p.add_argument("--step-delay", type=float, default=0.0, help="seconds of extra work per step (demo pacing)")
    args = p.parse_args(argv)
    if args.annotate_ids and args.data != "hf":
        p.error("--annotate-ids reads the id column of --data hf")
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    try:
        options = replicaft.ManagerOptions.from_env(lighthouse=args.lighthouse, replica_id=args.replica_id)
    except replicaft.OptionsError as e:
        print(f"train_ddp: error: {e}", file=sys.stderr)
        return 2
    torch.manual_seed(0)
    model = build_model(args.width, args.dropout)
    target = build_model(args.width).eval()
    inputs = torch.randn(args.dataset_size, 16, generator=torch.Generator().manual_seed(1234))
    with torch.no_grad():
        labels = target(inputs)
    device = torch.device(args.device)
    model.to(device)
    with replicaft.Manager(options) as manager:
        manager.checkpoint_tags(experiment="train_ddp", config=vars(args))
        ddp = replicaft.DistributedDataParallel(manager, model)
        inner = torch.optim.AdamW(model.parameters(), lr=args.lr)
        scheduler = torch.optim.lr_scheduler.LambdaLR(inner, lambda step: 1.0 / (1.0 + step / 100))
        optimizer = replicaft.Optimizer(manager, inner, scheduler)
        scaler = None
        if args.grad_scaler:
            scaler = torch.amp.GradScaler(device.type, growth_interval=4)
            GradScalerState(manager, scaler, optimizer)
        policy = "global" if options.deterministic else "per_group"
        sampler = ExactlyOnceSampler(manager, args.dataset_size, args.batch_size, policy=policy)
        loader = build_loader(args, options, sampler, inputs, labels)
        started = time.monotonic()
        while manager.current_step() < args.steps:
            optimizer.zero_grad()
            # A healer's gradient is replaced by zeros, but it still runs the step (any batch)
            # so that its collectives line up with the donors'.
            loaded = loader.micro_batches()
            if args.annotate_ids:
                manager.annotate_commit(trained_ids=[i for batch, _ in loaded for i in batch["id"].tolist()])
            batches = loaded or [((inputs[: args.batch_size], labels[: args.batch_size]), 1.0)]
            loss = torch.zeros((), device=device)
            for i, (batch, weight) in enumerate(batches):
                x, y = (batch["x"], batch["y"]) if isinstance(batch, dict) else batch
                last = i == len(batches) - 1
                with contextlib.nullcontext() if last else ddp.no_sync():
                    micro_loss = nn.functional.mse_loss(ddp(x.to(device)), y.to(device)) * (weight * args.loss_scale)
                    (micro_loss if scaler is None else scaler.scale(micro_loss)).backward()
                loss += micro_loss.detach()
            # The deterministic mode's micro-batches are shards, each weighted 1.0: their mean is the loss.
            step_loss = loss.item() / (len(batches) if options.deterministic else 1)
            manager.annotate_commit(loss=step_loss)
            manager.report_metrics(loss=step_loss)  # saved with the checkpoint of this step, if one is due
            if scaler is not None:
                manager.annotate_commit(grad_scale=scaler.get_scale())
            if args.step_delay:
                time.sleep(args.step_delay)
            # scaler.step skips optimizer.step (and so should_commit) when a gradient overflowed,
            # and update() backs off, in every group alike (they share the averaged gradients);
            # an update() after a step that did not commit is undone by GradScalerState.
            committed = optimizer.step() if scaler is None else scaler.step(optimizer)
            if scaler is not None:
                scaler.update()
            if committed and manager.current_step() % 10 == 0:
                print(
                    f"[{options.replica_id}] step {manager.current_step()} loss {loss.item():.4f} "
                    f"groups {manager.num_participants()} ({time.monotonic() - started:.1f}s)",
                    flush=True,
                )
        loader.close()
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except replicaft.GroupBroken as e:  # a rank of this group died, or a failed heal left no one to heal from
        print(f"train_ddp: {e}", file=sys.stderr)
        sys.exit(1)
    except ResumeDiverged as e:  # REPLICAFT_RESUME_VERIFY_ACTION=stop, and the resumed run is not the saved one
        print(f"train_ddp: {e}", file=sys.stderr)
        sys.exit(1)
    except CheckpointStoreUnavailable as e:  # no local checkpoint, and the object store could not be asked
        print(f"train_ddp: {e}", file=sys.stderr)
        sys.exit(1)
