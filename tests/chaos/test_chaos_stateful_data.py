"""Exactly-once data through a user's own loader, end to end: the ``stateful_data`` scenario.

``python -m chaos run stateful_data`` as a user would run it: a real lighthouse and three real
groups of ``examples/train_ddp.py``, each loading a Hugging Face ``datasets.Dataset`` through a
torchdata ``StatefulDataLoader`` with two worker processes (``StepDataLoader.from_loader``), and
g1 SIGKILLed, restarted and healed from two donors. The run must exit 0 with the chaos
``exactly_once_samples`` invariant held; then the ids each group reports it trained on
(``--annotate-ids``) must be, step by step, exactly the samples of the step's range: what the
loaders' workers delivered, not only what the cursor planned.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pytest
from conftest import spawn_python
from support.training_events import read_events

from replicaft.data import sample_ids

DEADLINE_S = 120.0
"""The scenario's run_timeout_s (90 s) plus start-up and writing the report."""
DATASET_SIZE = 1000
"""examples/train_ddp.py's --dataset-size default; its sampler's seed is 0."""


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_stateful_loader_over_a_datasets_dataset_trains_every_sample_once_through_a_sigkill(tmp_path: Path) -> None:
    out = tmp_path / "stateful_data"
    run = spawn_python("-m", "chaos", "run", "stateful_data", "--out", str(out), name="chaos-stateful-data")
    assert run.wait_exit(DEADLINE_S) == 0, run.output_tail(60)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["violations"] == []
    assert {"exactly_once_samples", "identical_digests", "faults_rejoined"} <= set(summary["invariants_checked"])
    assert summary["faults_injected"] == {"sigkill": 1} and summary["restarts"]["g1"] == 1
    assert summary["committed_steps"] == summary["target_steps"] == 32

    events = read_events(out / "events")
    heal_steps = [
        e["max_step"] for e in events if e["event"] == "heal_start" and e["replica_id"] == "g1" and e["max_step"] > 0
    ]
    assert heal_steps, "the restarted g1 never healed from its peers"
    trained: dict[int, list[int]] = defaultdict(list)
    ranges: dict[int, tuple[int, int]] = {}
    for e in events:
        if e["event"] == "commit" and e["committed"]:
            trained[e["step"]] += e["trained_ids"]
            ranges[e["step"]] = (e["samples"][0], e["samples"][1])
    for step, (start, stop) in sorted(ranges.items()):
        assert sorted(trained[step]) == sorted(sample_ids(start, stop, DATASET_SIZE, seed=0)), (
            f"step {step}: the groups trained on other samples than the step's positions [{start}, {stop})"
        )
    assert any(
        e["event"] == "commit" and e["replica_id"] == "g1" and e["trained_ids"] and e["step"] > heal_steps[-1]
        for e in events
    ), "the healed g1 never trained on a share through its new loader"
