"""Replica groups training on one GPU (issue 25): needs CUDA, skipped without it.

Real processes run ``examples/train_ddp.py --device cuda`` (a model with BatchNorm, whose
statistics live on the device and are averaged across groups, AdamW): gradients are
all-reduced from CUDA tensors over Gloo, a SIGKILLed group heals into GPU memory from donors
serving GPU state, and a persistent checkpoint is captured from GPU memory and resumed
bitwise. Run on a GPU machine: ``python -m pytest -m gpu``.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch
from conftest import start_lighthouse
from support.training_events import (
    CHECKPOINT_INTERVAL_STEPS,
    assert_digests_agree,
    commits,
    committed_digest,
    read_events,
    start_checkpointing_group,
    start_group,
    wait_for_event,
)

from replicaft.checkpoint import CheckpointReader

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.slow,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: torch.cuda.is_available() is false"),
]

GPU_ARGS = ("--device", "cuda", "--width", "600")
"""Width 600: tensors over 1 MiB, received in place through staging and captured behind the step."""


@pytest.fixture(autouse=True)
def _gloo_across_groups(monkeypatch: pytest.MonkeyPatch) -> None:
    """Gloo between the groups: they share one GPU, and NCCL refuses two ranks on one device
    ("Duplicate GPU detected"); the default with CUDA present would be NCCL."""
    monkeypatch.setenv("REPLICAFT_BACKEND", "gloo")


@pytest.mark.timeout(300)
def test_three_groups_on_one_gpu_one_killed_heals_into_gpu_memory_digests_equal(tmp_path: Path) -> None:
    lh = start_lighthouse("--min-replicas", "3", status=False)
    args = ("--steps", "50", "--step-delay", "0.02", *GPU_ARGS)
    groups = {rid: start_group(lh.grpc_address, rid, tmp_path, *args) for rid in ("g0", "g1", "g2")}
    wait_for_event(
        tmp_path, lambda e: e["event"] == "commit" and e["replica_id"] == "g2" and e["step"] >= 10, 180, "g2 at step 10"
    )
    groups["g2"].kill()
    restarted_at = time.time()
    groups["g2"] = start_group(lh.grpc_address, "g2", tmp_path, *args)
    heal = wait_for_event(
        tmp_path,
        lambda e: e["event"] == "heal_end" and e["replica_id"] == "g2" and e["ts"] > restarted_at,
        120,
        "g2 heal",
    )
    assert heal["ok"], heal
    assert heal["in_place_bytes"] > 0, "nothing was received in place into GPU memory"
    for rid, g in groups.items():
        assert g.wait_exit(180) == 0, f"{rid}\n{g.output_tail()}"
    assert_digests_agree(tmp_path, min_steps=40)  # parameters, AdamW moments and BatchNorm statistics
    healed_steps = [e["step"] for e in commits(tmp_path, "g2") if e["ts"] > restarted_at]
    assert healed_steps and min(healed_steps) > 10, healed_steps


@pytest.mark.timeout(300)
def test_checkpoint_captured_from_gpu_resumes_bitwise(tmp_path: Path) -> None:
    lh = start_lighthouse("--min-replicas", "2", status=False)
    args = ("--steps", "40", "--step-delay", "0.02", *GPU_ARGS)
    groups = {rid: start_checkpointing_group(lh.grpc_address, rid, tmp_path, *args) for rid in ("g0", "g1")}
    events = tmp_path / "events"
    wait_for_event(
        events,
        lambda e: e["event"] == "checkpoint" and e["ok"] and e["checkpoint_step"] >= CHECKPOINT_INTERVAL_STEPS,
        180,
        "a checkpoint",
    )
    for g in groups.values():
        g.kill()
    published = [i for i in CheckpointReader(tmp_path / "ckpt").list() if i.valid]
    assert published, "no checkpoint published"
    groups = {rid: start_checkpointing_group(lh.grpc_address, rid, tmp_path, *args) for rid in ("g0", "g1")}
    for rid in groups:
        resume = wait_for_event(
            events, lambda e, rid=rid: e["event"] == "resume" and e["replica_id"] == rid, 180, f"{rid} resumed"
        )
        assert resume["checkpoint_step"] == published[0].step
        assert resume["digest"] == committed_digest(events, published[0].step), (
            "resumed state differs from what was saved"
        )
    for rid, g in groups.items():
        assert g.wait_exit(180) == 0, f"{rid}\n{g.output_tail()}"
    starts = [e for e in read_events(events) if e["event"] == "checkpoint_start"]
    assert starts and all(e["background_copy_bytes"] > 0 for e in starts), starts
    assert not [e for e in read_events(events) if e["event"] == "checkpoint" and not e["ok"]]
    assert_digests_agree(events, min_steps=35)
