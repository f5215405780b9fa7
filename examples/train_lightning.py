"""A PyTorch Lightning job on replicaft: an ordinary LightningModule and LightningDataModule,
trained fault-tolerantly by swapping in one strategy.

Run several copies (one per replica group) against one lighthouse; the launcher does that::

    replicaft-launch --groups 3 examples/train_lightning.py --steps 200

Nothing in ``Regression`` or ``RegressionData`` knows about replicaft: the only change from a
single-process Lightning script is ``strategy=FaultTolerantStrategy()`` (and one device per
process). The DataLoader's ``batch_size`` is per group: the strategy reads the dataset in
replicaft's exactly-once order, ``batch_size`` times the job's group count samples a step.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time

import pytorch_lightning as pl
import torch
from torch import nn

import replicaft
from replicaft.lightning import FaultTolerantStrategy


class Regression(pl.LightningModule):
    """A small MLP with BatchNorm fitting a fixed random teacher network."""

    def __init__(self, width: int = 64, lr: float = 1e-2) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(
            nn.Linear(16, width), nn.BatchNorm1d(width), nn.ReLU(),
            nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 1),
        )  # fmt: skip

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self) -> dict:
        optimizer = torch.optim.AdamW(self.parameters(), lr=self.hparams.lr)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (1.0 + step / 100))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


class RegressionData(pl.LightningDataModule):
    def __init__(self, size: int = 1000, batch_size: int = 32, num_workers: int = 0) -> None:
        super().__init__()
        self.size, self.batch_size, self.num_workers = size, batch_size, num_workers

    def setup(self, stage: str) -> None:
        torch.manual_seed(0)
        teacher = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1)).eval()
        inputs = torch.randn(self.size, 16, generator=torch.Generator().manual_seed(1234))
        with torch.no_grad():
            self.dataset = torch.utils.data.TensorDataset(inputs, teacher(inputs))

    def train_dataloader(self) -> torch.utils.data.DataLoader:
        return torch.utils.data.DataLoader(
            self.dataset, batch_size=self.batch_size, shuffle=True, num_workers=self.num_workers
        )


class StepDelay(pl.Callback):
    """Extra seconds per step, to spread a chaos scenario's faults over the run."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def on_train_batch_end(self, *args: object) -> None:
        time.sleep(self.seconds)


class PrintSteps(pl.Callback):
    """One line per committed step, as the other examples print (the launcher labels it)."""

    def __init__(self, every: int) -> None:
        self.every = every

    def on_train_batch_end(self, trainer: pl.Trainer, module: pl.LightningModule, outputs, batch, batch_idx) -> None:
        step = trainer.global_step
        if step and step % self.every == 0 and step != getattr(self, "_last", None):
            self._last = step
            replica = os.environ.get("REPLICAFT_REPLICA_ID", "?")
            loss = float(outputs["loss"])
            print(f"[{replica}] step {step} epoch {trainer.current_epoch} loss {loss:.4f}", flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=100, help="committed steps to train for (Trainer max_steps)")
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=32, help="samples per group per step")
    p.add_argument("--dataset-size", type=int, default=1000)
    p.add_argument("--num-workers", type=int, default=0, help="DataLoader worker processes")
    p.add_argument("--print-every", type=int, default=10)
    p.add_argument("--step-delay", type=float, default=0.0, help="seconds of extra work per step (demo pacing)")
    p.add_argument("--log-dir", default="lightning_logs", help="each group's CSV log goes to LOG_DIR/<replica id>")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        strategy = FaultTolerantStrategy(replicaft.ManagerOptions.from_env())
    except replicaft.OptionsError as e:
        print(f"train_lightning: error: {e}", file=sys.stderr)
        return 2
    replica = os.environ.get("REPLICAFT_REPLICA_ID", "group")
    trainer = pl.Trainer(
        strategy=strategy,
        accelerator="cpu",
        devices=1,
        max_steps=args.steps,
        max_epochs=-1,
        logger=pl.loggers.CSVLogger(os.path.join(args.log_dir, replica), name="", version=""),
        log_every_n_steps=args.print_every,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[PrintSteps(args.print_every), *([StepDelay(args.step_delay)] if args.step_delay else [])],
    )
    trainer.fit(Regression(args.width), RegressionData(args.dataset_size, args.batch_size, args.num_workers))
    return 0


if __name__ == "__main__":
    sys.exit(main())
