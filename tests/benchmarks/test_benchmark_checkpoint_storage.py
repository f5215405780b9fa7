"""The checkpoint_storage benchmark's pure helpers (the benchmark itself runs for minutes:
``python -m benchmarks checkpoint_storage``, not part of the suite)."""

from __future__ import annotations

import pytest
import torch

from benchmarks.__main__ import BENCHMARKS
from benchmarks.checkpoint_storage import (
    FINETUNE,
    GPTRun,
    bytes_floor,
    changed_bytes,
    frozen_fraction,
    judge_targets,
    state_chunks,
)
from replicaft.state.content import CHUNK_BYTES
from replicaft.state.flat import flatten
from replicaft.transfer.snapshot import Snapshot


def test_the_benchmark_is_registered() -> None:
    assert BENCHMARKS["checkpoint_storage"] == "benchmarks.checkpoint_storage"


@pytest.mark.parametrize(
    ("ratios", "target", "met"),
    [
        ({"a": 0.25}, ("<=", 0.25), True),
        ({"a": 0.2501}, ("<=", 0.25), False),
        ({"a": 0.8}, (">=", 0.8), True),
        ({"a": 0.79}, (">=", 0.8), False),
        ({}, ("<=", 1.1), False),  # not measured is not met
    ],
)
def test_judge_targets_table(ratios: dict[str, float], target: tuple, met: bool) -> None:
    judged = judge_targets(ratios, {"a": target})["a"]
    assert judged["met"] is met and judged["target"] == f"{target[0]} {target[1]}x"
    assert judged["ratio"] == ratios.get("a") and ("why" in judged) == (not ratios)


def test_changed_bytes_counts_new_changed_and_reshaped_tensors_only() -> None:
    before = {"same": torch.zeros(10), "changed": torch.zeros(10), "reshaped": torch.zeros(4), "gone": torch.zeros(3)}
    after = {
        "same": torch.zeros(10),
        "changed": torch.ones(10),
        "reshaped": torch.zeros(2, 2),
        "new": torch.zeros(5, dtype=torch.float64),
    }
    assert changed_bytes(before, after) == 10 * 4 + 4 * 4 + 5 * 8
    assert changed_bytes(after, after) == 0


@pytest.mark.parametrize(("label", "floor"), [("finetune", 0.36), ("finetune_wide", 0.19)])
def test_finetune_freezes_at_least_80_percent_and_its_bytes_floor_is_3t_over_e_plus_3t(
    label: str, floor: float
) -> None:
    run = GPTRun(FINETUNE[label], freeze_embedding=True, corpus_bytes=1 << 16)
    assert frozen_fraction(run.model) >= 0.8
    assert not any(p is run.model.tok.weight for g in run.optimizer.param_groups for p in g["params"])
    frozen = run.model.tok.weight.numel()
    trainable = sum(p.numel() for p in run.model.parameters() if p.requires_grad)
    assert (
        bytes_floor(run.model)
        == pytest.approx(3 * trainable / (frozen + 3 * trainable))
        == pytest.approx(floor, abs=0.01)
    )


def test_state_chunks_cut_each_tensor_as_the_writer_does() -> None:
    state = {"big": torch.arange(CHUNK_BYTES // 4 + 3, dtype=torch.float32), "small": torch.ones(7)}
    snapshot = Snapshot.capture(flatten(state), step=0, quorum_id=1, replica_id="t", with_checksums=False)
    chunks = state_chunks(snapshot)
    assert [len(c) for c in chunks] == [CHUNK_BYTES, 12, 28]
    assert bytes(chunks[2]) == torch.ones(7).numpy().tobytes()
