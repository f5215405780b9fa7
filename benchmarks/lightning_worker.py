"""One trainer process of ``python -m benchmarks lightning_step``: examples/train_lightning.py's
module and data under Lightning's own DDP strategy (``--mode ddp``, one rank of a Gloo job) or
under replicaft's (``--mode replicaft``, one replica group).

Prints one JSON line on stdout: ``{"event": "done", "step_s": [...]}``, each timed batch from
``on_train_batch_start`` to ``on_train_batch_end`` (the whole step: data, forward, backward,
the gradient all-reduce, the optimizer step, and replicaft's quorum and vote), warm-up left out.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
import warnings
from pathlib import Path

import pytorch_lightning as pl
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from train_lightning import Regression, RegressionData  # noqa: E402

WARMUP_STEPS = 10


class StepTimer(pl.Callback):
    def __init__(self) -> None:
        self.step_s: list[float] = []
        self._started = 0.0

    def on_train_batch_start(self, trainer: pl.Trainer, *args: object) -> None:
        self._started = time.perf_counter()

    def on_train_batch_end(self, trainer: pl.Trainer, *args: object) -> None:
        self.step_s.append(time.perf_counter() - self._started)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--mode", choices=("ddp", "replicaft"), required=True)
    p.add_argument("--rank", type=int, default=0)
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--master-port", type=int, default=0)
    p.add_argument("--lighthouse", default=None)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=32)
    args = p.parse_args()
    logging.basicConfig(level=logging.ERROR, stream=sys.stderr)
    logging.getLogger("pytorch_lightning").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    common = {
        "accelerator": "cpu", "max_steps": args.steps + WARMUP_STEPS, "max_epochs": -1, "logger": False,
        "enable_checkpointing": False, "enable_progress_bar": False, "enable_model_summary": False,
    }  # fmt: skip
    if args.mode == "ddp":
        # One process per rank, started by the benchmark: Lightning sees LOCAL_RANK and does not spawn.
        os.environ.update(
            MASTER_ADDR="127.0.0.1", MASTER_PORT=str(args.master_port), WORLD_SIZE=str(args.world),
            RANK=str(args.rank), LOCAL_RANK=str(args.rank), NODE_RANK="0",
        )  # fmt: skip
        strategy: object = pl.strategies.DDPStrategy(process_group_backend="gloo")
        devices = args.world
    else:
        from replicaft import ManagerOptions
        from replicaft.lightning import FaultTolerantStrategy

        options = ManagerOptions(lighthouse=args.lighthouse, replica_id=f"g{args.rank}", digest_every_steps=0)
        strategy = FaultTolerantStrategy(options, global_batch_size=args.batch_size * args.world)
        devices = 1
    timer = StepTimer()
    trainer = pl.Trainer(strategy=strategy, devices=devices, callbacks=[timer], **common)
    # 10,000 samples: no epoch ends inside the timed steps on either side.
    trainer.fit(Regression(args.width), RegressionData(10_000, args.batch_size))
    print(json.dumps({"event": "done", "step_s": timer.step_s[WARMUP_STEPS:]}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
