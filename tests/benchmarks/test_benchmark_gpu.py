"""``python -m benchmarks gpu`` (issue 25): its code, driven on the CPU, and its refusal without CUDA.

The GPU benchmark's figures need a GPU, but its code must not wait for one to be known to
work: every measuring function takes a ``device``, and here the whole benchmark runs on
``"cpu"`` with tiny sizes (real processes, sockets, a real SIGKILL and heal), so a broken
worker, a missing event or a malformed record fails here, on the machines this project is
built on. The numbers it produces on the CPU mean nothing and are not checked. On a GPU
machine, ``python -m pytest -m gpu`` runs the same on ``"cuda"``.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from benchmarks import gpu
from benchmarks.__main__ import main as benchmarks_main

TINY = gpu.Sizes(
    heal_model=(64, 2),
    heal_batch=4,
    heal_repeats=1,
    donor_heals=1,
    donor_steady_steps=3,
    step_size_mb=0.5,
    step_batch=4,
    step_steps=2,
    step_trainers=1,
    step_repeats=1,
    checkpoint_model=(64, 2),
    checkpoint_repeats=1,
    num_groups=2,
    group_width=32,
    group_step_delay_s=0.05,
    kill_at_step=3,
    steps_after_heal=2,
)
"""Every piece once, as small as it goes: the code path, not a measurement."""

needs_no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal where CUDA is absent")


def check_record(record: dict, device: str) -> None:
    assert set(record) >= {"name", "when", "machine", "figures", "baselines", "ratios", "notes", "params"}
    assert record["name"] == "gpu"
    assert record["params"]["device"]["type"] == device
    assert set(record["ratios"]) == {"heal_gbps", "donor_step_during_heal_ms", "step_time_ms", "checkpoint_blocked_ms"}
    assert record["params"]["compared_to"]["heal_gbps"] == "heal_limit_gbps"
    assert record["baselines"]["heal_limit_gbps"] == min(
        record["baselines"]["pinned_h2d_gbps"], record["baselines"]["socket_gbps"]
    )
    assert all(v > 0 for v in record["baselines"].values()), record["baselines"]
    assert record["figures"]["heal_gbps"] > 0
    assert record["figures"]["groups_digests_equal"] == 1.0, record["params"]["groups_differing_steps"]
    assert record["figures"]["groups_steps_compared"] >= 1
    assert set(record["params"]["meets_targets"]) == set(gpu.TARGETS)
    json.dumps(record)  # what write_result writes


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_benchmark_runs_end_to_end_on_cpu_and_records_every_figure_beside_its_baseline() -> None:
    record = gpu.collect("cpu", TINY).to_record(when="now", machine={})
    check_record(record, "cpu")
    assert record["params"]["heal_bytes"] >= 3 * 64 * 64 * 2 * 4  # parameters and both AdamW moments


def test_donor_steps_overlapping_a_heal_are_told_from_steady_ones() -> None:
    steps = [(0.0, 1.0), (1.0, 2.0), (2.0, 3.5), (3.5, 4.0), (4.0, 5.0)]
    during, steady = gpu._split_steps(steps, [(1.5, 3.6)])
    assert during == [1.0, 1.5, 0.5]
    assert steady == [1.0, 1.0]


@needs_no_cuda
def test_without_cuda_the_benchmark_refuses_and_writes_no_result(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    measured = gpu.BenchmarkResult(name="gpu", figures={"heal_gbps": 9.0}, baselines={}).to_record(
        when="earlier", machine={"device": "a GPU machine"}
    )
    real = tmp_path / "gpu.json"
    real.write_text(json.dumps(measured))
    assert benchmarks_main(["gpu", "--results-dir", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "needs CUDA" in err and "Traceback" not in err, err
    assert json.loads(real.read_text()) == measured, "a result from a GPU machine was overwritten"


@needs_no_cuda
def test_without_cuda_run_raises_benchmark_unavailable() -> None:
    with pytest.raises(gpu.BenchmarkUnavailable, match="needs CUDA"):
        gpu.run(quick=True)


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: torch.cuda.is_available() is false")
def test_benchmark_runs_end_to_end_on_cuda() -> None:
    # Width 600: train_ddp's tensors above 1 MiB, which a heal receives in place
    # (tests/replicaft/step/test_cuda_training.py).
    record = gpu.collect("cuda", dataclasses.replace(TINY, group_width=600)).to_record(when="now", machine={})
    check_record(record, "cuda")
    assert record["params"]["groups_heal_in_place_bytes"] > 0, "the restarted group healed nothing in place on the GPU"
