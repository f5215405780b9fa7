"""benchmarks/diloco.py's partial reruns: ``--update`` replaces some modes' figures and keeps the rest."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks.diloco import MODES, _result, update_results


def _run(tokens_per_s: float, **extra: Any) -> dict[str, Any]:
    return {
        "tokens": 1000,
        "tokens_per_s": tokens_per_s,
        "syncs": 10,
        "held_out_loss": 2.5,
        "retried_syncs": 0,
        "curve": [(500, 2.9), (1000, 2.6)],
        **extra,
    }


def _full_record(tmp_path: Path) -> Path:
    runs = {m: _run(100.0) for m in MODES}
    runs["ddp"] = {"tokens": 900, "tokens_per_s": 10.0, "steps": 5, "held_out_loss": 2.4}
    runs["diloco_h20_fault"] = _run(90.0, fault_cost_inner_steps=13.0)
    path = tmp_path / "diloco.json"
    path.write_text(json.dumps(_result(runs, 120.0).to_record(when="then", machine={})))
    return path


def test_update_replaces_the_rerun_modes_figures_and_keeps_the_others(tmp_path: Path) -> None:
    path = _full_record(tmp_path)
    fault = _run(
        99.0, fault_cost_inner_steps=0.5, fault_round_excess_inner_steps=-1.0, rejoin_round_excess_inner_steps=0.5
    )
    record = update_results({"diloco_h20_fault": fault}, 60.0, path, when="now", machine={})
    assert record["figures"]["fault_cost_inner_steps"] == 0.5
    assert record["figures"]["rejoin_round_excess_inner_steps"] == 0.5
    assert record["ratios"]["fault_run_tokens_per_s"] == pytest.approx(99.0 / 100.0, abs=1e-4)
    # Not rerun: kept, the loss at DDP's tokens included (its curve is not in the file).
    assert record["figures"]["diloco_h100_held_out_loss_at_ddp_tokens"] == 2.6
    assert record["ratios"]["diloco_h100_held_out_loss_at_ddp_tokens"] == pytest.approx(2.6 / 2.4, abs=1e-4)
    assert record["params"]["modes_run"] == {**{m: "then" for m in MODES}, "diloco_h20_fault": "now"}
    assert record["params"]["seconds_by_mode"]["diloco_h20_fault"] == 60.0
    assert record["params"]["seconds_by_mode"]["ddp"] == 120.0


def test_update_refuses_a_results_file_without_the_modes_it_must_keep(tmp_path: Path) -> None:
    path = _full_record(tmp_path)
    record = json.loads(path.read_text())
    del record["params"]["runs"]["streaming"]
    path.write_text(json.dumps(record))
    with pytest.raises(ValueError, match="streaming"):
        update_results({"diloco_h20_fault": _run(99.0, fault_cost_inner_steps=0.5)}, 60.0, path, when="now", machine={})
