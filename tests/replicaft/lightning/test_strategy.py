"""FaultTolerantStrategy in one process against a real lighthouse: a step that does not commit
leaves global_step, the epoch, the LR and the data cursor where they were; what the strategy
cannot do is refused by name. The loop-counter rule and the data checks are pure."""

from __future__ import annotations

from typing import Any

import pytest
import pytorch_lightning as pl
import torch
from conftest import start_lighthouse
from support.training_events import read_events
from torch import nn

from replicaft import ManagerOptions, OptionsError
from replicaft.lightning import FaultTolerantStrategy
from replicaft.lightning.loop_counters import LoopCounters, counters_after
from replicaft.lightning.step_batches import _check_dataloader
from replicaft.lightning.training_state import CommittedStepScheduler


@pytest.mark.parametrize(
    ("committed_steps", "committed", "expected"),
    [
        (1, True, LoopCounters(global_step=1, epoch=0, batches_in_epoch=1)),
        (4, True, LoopCounters(global_step=4, epoch=0, batches_in_epoch=4)),  # ends epoch 0 on this batch
        (5, True, LoopCounters(global_step=5, epoch=1, batches_in_epoch=1)),
        (4, False, LoopCounters(global_step=4, epoch=1, batches_in_epoch=0)),  # a retry of step 5, in epoch 1
        (3, False, LoopCounters(global_step=3, epoch=0, batches_in_epoch=3)),
        (0, False, LoopCounters(global_step=0, epoch=0, batches_in_epoch=0)),
        (11, True, LoopCounters(global_step=11, epoch=2, batches_in_epoch=3)),  # a healer jumping to step 11
    ],
)
def test_loop_counters_follow_committed_steps(committed_steps: int, committed: bool, expected: LoopCounters) -> None:
    assert counters_after(committed_steps, committed, steps_per_epoch=4) == expected


def test_loop_counters_refuse_an_empty_epoch() -> None:
    with pytest.raises(ValueError, match="steps_per_epoch=0"):
        counters_after(3, True, steps_per_epoch=0)


def test_a_scheduler_steps_only_after_a_committed_step() -> None:
    optimizer = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1.0)
    committed = [True]
    scheduler = CommittedStepScheduler(torch.optim.lr_scheduler.StepLR(optimizer, 1, gamma=0.5), lambda: committed[0])
    optimizer.step()
    scheduler.step()
    committed[0] = False
    scheduler.step()
    assert scheduler.get_last_lr() == [0.5] and scheduler.optimizer is optimizer


class _Squares(torch.utils.data.IterableDataset):
    def __iter__(self) -> Any:
        return iter(range(4))


DATA = torch.utils.data.TensorDataset(torch.randn(64, 4), torch.randn(64, 1))


@pytest.mark.parametrize(
    ("dataloader", "message"),
    [
        ([1, 2], "the train dataloader is a list"),
        (torch.utils.data.DataLoader(_Squares(), batch_size=2), "dataset is an iterable-style .*_Squares"),
        (
            torch.utils.data.DataLoader(DATA, batch_sampler=torch.utils.data.BatchSampler(range(64), 4, False)),
            "the train DataLoader has batch_sampler=torch.utils.data.sampler.BatchSampler",
        ),
        (
            torch.utils.data.DataLoader(
                DATA, batch_size=4, sampler=torch.utils.data.WeightedRandomSampler([1.0] * 64, 64)
            ),
            "has sampler=torch.utils.data.sampler.WeightedRandomSampler",
        ),
        (
            torch.utils.data.DataLoader(
                DATA, batch_size=4, sampler=torch.utils.data.RandomSampler(DATA, replacement=True)
            ),
            "has sampler=torch.utils.data.sampler.RandomSampler",
        ),
        (torch.utils.data.DataLoader(DATA, batch_size=None), "batch_size=None"),
    ],
)
def test_train_data_the_exactly_once_order_cannot_read_is_refused(dataloader: Any, message: str) -> None:
    with pytest.raises(OptionsError, match=message):
        _check_dataloader(dataloader)


@pytest.mark.parametrize("shuffle", [False, True])
def test_train_data_with_the_dataloaders_own_order_is_read(shuffle: bool) -> None:
    assert _check_dataloader(torch.utils.data.DataLoader(DATA, batch_size=4, shuffle=shuffle)) == (DATA, 4)


class Linear(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(4, 1)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 1, gamma=0.9)
        return [optimizer], [{"scheduler": scheduler, "interval": "step"}]

    def train_dataloader(self) -> torch.utils.data.DataLoader:
        return torch.utils.data.DataLoader(DATA, batch_size=8, shuffle=True)


class Manual(Linear):
    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False


class FailStep(pl.Callback):
    """Reports an error in the given attempt, so that step does not commit; records what the
    loops say around it."""

    def __init__(self, attempt: int) -> None:
        self.attempt, self.attempts, self.seen = attempt, 0, []

    def on_before_optimizer_step(self, trainer: pl.Trainer, module: pl.LightningModule, optimizer: Any) -> None:
        self.attempts += 1
        if self.attempts == self.attempt:
            trainer.strategy.manager.report_error(RuntimeError("injected by the test"))

    def on_train_batch_end(self, trainer: pl.Trainer, module: pl.LightningModule, *args: Any) -> None:
        lr = trainer.lr_scheduler_configs[0].scheduler.get_last_lr()[0]
        cursor = trainer.strategy.data.sampler.cursor
        self.seen.append((trainer.global_step, trainer.current_epoch, round(lr, 6), cursor))


def _trainer(lighthouse: str, replica_id: str, **kwargs: Any) -> pl.Trainer:
    options = ManagerOptions(lighthouse=lighthouse, replica_id=replica_id)
    defaults: dict[str, Any] = {
        "accelerator": "cpu", "devices": 1, "logger": False, "enable_checkpointing": False,
        "enable_progress_bar": False, "enable_model_summary": False,
    }  # fmt: skip
    return pl.Trainer(strategy=FaultTolerantStrategy(options), **{**defaults, **kwargs})


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_step_that_does_not_commit_moves_no_counter_lr_or_data(tmp_path: Any) -> None:
    lighthouse = start_lighthouse("--min-replicas", "1", status=False)
    fail = FailStep(attempt=3)
    trainer = _trainer(lighthouse.grpc_address, "g0", max_steps=10, callbacks=[fail], default_root_dir=tmp_path)
    trainer.fit(Linear())
    # 64 samples, a global batch of 8: 8 steps an epoch. Attempt 3 did not commit: it leaves
    # step 2's counters, LR and cursor; its retry is step 3.
    assert fail.seen[:4] == [(1, 0, 0.09, 8), (2, 0, 0.081, 16), (2, 0, 0.081, 16), (3, 0, 0.0729, 24)]
    assert [s[0] for s in fail.seen] == [1, 2, 2, 3, 4, 5, 6, 7, 8, 9, 10]
    assert [s[1] for s in fail.seen] == [0] * 9 + [1] * 2  # epoch 0 ends on step 8 (its 9th batch)
    assert trainer.global_step == 10 and fail.seen[-1][3] == 80


class CountAllreduces(pl.Callback):
    """Counts the manager's fault-tolerant all-reduces, by the step they ran in."""

    def __init__(self) -> None:
        self.steps: list[int] = []

    def on_train_start(self, trainer: pl.Trainer, module: pl.LightningModule) -> None:
        manager = trainer.strategy.manager
        allreduce = manager.allreduce

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.steps.append(manager.current_step())
            return allreduce(*args, **kwargs)

        manager.allreduce = counted


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_accumulated_batches_make_one_step_and_an_aborted_step_gives_all_back(tmp_path: Any) -> None:
    """accumulate_grad_batches=2: one quorum, one all-reduce and one commit decision per
    optimizer step over two batches; the step that does not commit rolls both back."""
    lighthouse = start_lighthouse("--min-replicas", "1", status=False)
    fail, count = FailStep(attempt=3), CountAllreduces()
    options = ManagerOptions(lighthouse=lighthouse.grpc_address, replica_id="g0", events_dir=str(tmp_path / "ev"))
    trainer = pl.Trainer(
        strategy=FaultTolerantStrategy(options), accelerator="cpu", devices=1, max_steps=10,
        accumulate_grad_batches=2, callbacks=[fail, count], logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    trainer.fit(Linear())
    # 64 samples, 8 a batch, 2 batches a step: a global batch of 16, 4 steps (8 batches) an
    # epoch. The first batch of a step leaves the counters; its second steps them. Attempt 3
    # (batches 5 and 6) did not commit: both leave step 2's counters, LR and cursor.
    assert fail.seen[:8] == [
        (0, 0, 0.1, 0), (1, 0, 0.09, 16), (1, 0, 0.09, 16), (2, 0, 0.081, 32),
        (2, 0, 0.081, 32), (2, 0, 0.081, 32), (2, 0, 0.081, 32), (3, 0, 0.0729, 48),
    ]  # fmt: skip
    assert [s[0] for s in fail.seen[1::2]] == [1, 2, 2, 3, 4, 5, 6, 7, 8, 9, 10]
    assert [s[1] for s in fail.seen[1::2]] == [0] * 5 + [1] * 4 + [2] * 2  # epochs end on steps 4 and 8
    assert trainer.global_step == 10 and fail.seen[-1][3] == 160
    assert count.steps == sorted(count.steps) and len(count.steps) == 11, count.steps  # one per attempt
    decisions = [e for e in read_events(tmp_path / "ev") if e["event"] == "commit"]
    assert [e["committed"] for e in decisions] == [True, True, False] + [True] * 8
    assert [e["samples"] for e in decisions if e["committed"]] == [[16 * i, 16 * i + 16] for i in range(10)]


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("module", "kwargs", "message"),
    [
        (Manual, {}, "manual optimization is not"),
    ],
)
def test_what_the_strategy_cannot_do_is_refused_at_fit(module: type, kwargs: dict[str, Any], message: str) -> None:
    lighthouse = start_lighthouse("--min-replicas", "1", status=False)
    trainer = _trainer(lighthouse.grpc_address, "g0", max_steps=2, **kwargs)
    with pytest.raises(OptionsError, match=message):
        trainer.fit(module())
    assert trainer.strategy.manager is None, "the manager was shut down"


class RecordSteps(pl.Callback):
    def __init__(self) -> None:
        self.steps: list[int] = []

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        self.steps.append(trainer.global_step)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_new_job_resumes_from_replicaft_checkpoints_with_lightning_counters(tmp_path: Any) -> None:
    """Every group gone: a fresh Trainer and module resume from the last persistent checkpoint,
    with its weights, its LR and a global_step that goes on from the checkpoint's step."""
    lighthouse = start_lighthouse("--min-replicas", "1", status=False)
    checkpoints = {"checkpoint_dir": str(tmp_path / "ckpt"), "checkpoint_interval_steps": 5}

    def fit(max_steps: int) -> tuple[pl.Trainer, Linear, RecordSteps]:
        options = ManagerOptions(
            lighthouse=lighthouse.grpc_address, replica_id="g0", events_dir=str(tmp_path / "ev"), **checkpoints
        )
        record, module = RecordSteps(), Linear()
        trainer = pl.Trainer(
            strategy=FaultTolerantStrategy(options), accelerator="cpu", devices=1, max_steps=max_steps,
            logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
            callbacks=[record],
        )  # fmt: skip
        trainer.fit(module)
        return trainer, module, record

    first, first_module, _ = fit(10)
    weights = {k: v.clone() for k, v in first_module.state_dict().items()}
    second, second_module, record = fit(14)
    # The last checkpoint published is step 5's (step 10's would have been written during step
    # 11): the new job's first batch loads it and does not commit, then steps 6 to 14 train.
    assert record.steps == list(range(5, 15)), record.steps
    assert second.global_step == 14
    assert second.lr_scheduler_configs[0].scheduler.get_last_lr()[0] == pytest.approx(0.1 * 0.9**14)
    assert not all(torch.equal(weights[k], v) for k, v in second_module.state_dict().items()), "it trained on"
