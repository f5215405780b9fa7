"""The deterministic mode's costs, beside the normal mode's, in the same run.

The same training (benchmarks/deterministic_worker.py: an MLP with BatchNorm, AdamW, a global
batch of 64 samples per step, ``policy="global"``) runs as two replica groups of one rank and
a lighthouse process, in the normal mode and in the deterministic mode (8 virtual shards of 8
samples); then each mode once more as a single group. Figures:

* ``step_time_ms``: median step (``zero_grad`` to ``step``) of the slower group, against the
  normal mode's. The deterministic mode runs one backward per owned shard (4 of 8 samples
  instead of one of 32) and reduces after the last one (no overlap with backward).
* ``wire_bytes_per_step``: bytes this rank hands to the column all-reduce per step (the
  payload; a ring all-reduce sends about twice that over the wire), against the normal mode's:
  int64 instead of float32 gradients, plus one float64 maximum per bucket.
* ``fixed_point_bound_log2_rel``: log2 of the largest error the fixed-point sum may add to one
  gradient element over the run (each commit event's ``fixed_point_bound``) over the smallest
  step's largest averaged gradient; beside it float32's own relative rounding, log2 = -24 (the
  absolute bound is in ``params``: too small for the record's four decimals).
* ``final_eval_loss``, ``loss_curve_max_abs_diff`` and ``loss_curve_max_rel_diff``: the loss on
  a fixed evaluation set after every step; both curves are in ``params``. They differ by more
  than the rounding: BatchNorm normalises each shard (8 samples) instead of each group's share
  (32), a different model of the same data.
* ``final_state_equal_1_vs_2_groups``: 1.0 when the one-group run ends at the same bits as the
  two-group run; the normal mode's (baseline ``normal_final_state_equal_1_vs_2_groups``) is
  0.0: its sum depends on how the batch was split.
"""

from __future__ import annotations

import asyncio
import json
import math
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.processes import ChildProcesses
from benchmarks.results import BenchmarkResult

RUN_TIMEOUT_S = 300.0
SHARDS = 8
BATCH = 64
FLOAT32_ROUNDING = 2.0**-24


async def _one_run(deterministic: bool, groups: int, steps: int) -> dict[str, Any]:
    """Every group's "done" report, and the fixed-point bounds of the commit events."""
    deadline = time.monotonic() + RUN_TIMEOUT_S
    with tempfile.TemporaryDirectory(prefix="bench-deterministic-") as events:
        async with ChildProcesses() as children:
            lighthouse = await children.start_python(
                "lighthouse", "-m", "lighthouse", "--port", "0", "--min-replicas", str(groups), "--log-level", "WARNING"
            )
            address = (await lighthouse.expect_line("lighthouse serving gRPC at ", deadline)).strip()
            workers = [
                await children.start_python(
                    f"g{i}",
                    "-m",
                    "benchmarks.deterministic_worker",
                    "--lighthouse",
                    address,
                    "--replica-id",
                    f"g{i}",
                    "--steps",
                    str(steps),
                    "--shards",
                    str(SHARDS),
                    "--batch",
                    str(BATCH),
                    "--events-dir",
                    events,
                    *(["--deterministic"] if deterministic else []),
                )
                for i in range(groups)
            ]
            reports = [await w.expect_event("done", deadline) for w in workers]
        bounds = [
            e["fixed_point_bound"]
            for path in Path(events).glob("*.jsonl")
            for e in map(json.loads, path.read_text().splitlines())
            if e["event"] == "commit" and e.get("committed") and "fixed_point_bound" in e
        ]
    return {"reports": reports, "bounds": bounds}


def _slower_median_ms(run: dict[str, Any]) -> float:
    return max(statistics.median(r["step_s"][2:] or r["step_s"]) for r in run["reports"]) * 1000


def _same_final_state(a: dict[str, Any], b: dict[str, Any]) -> float:
    digests = {r["digest"] for r in a["reports"]} | {r["digest"] for r in b["reports"]}
    return 1.0 if len(digests) == 1 else 0.0


def run(*, quick: bool) -> BenchmarkResult:
    steps = 12 if quick else 40
    normal = asyncio.run(_one_run(False, 2, steps))
    exact = asyncio.run(_one_run(True, 2, steps))
    exact_alone = asyncio.run(_one_run(True, 1, steps))
    normal_alone = asyncio.run(_one_run(False, 1, steps))
    curve = exact["reports"][0]["eval_loss"]
    normal_curve = normal["reports"][0]["eval_loss"]
    grad_max = min(min(r["grad_max"]) for r in exact["reports"])
    bound = max(exact["bounds"]) if exact["bounds"] else 0.0
    figures = {
        "step_time_ms": _slower_median_ms(exact),
        "wire_bytes_per_step": float(statistics.median(exact["reports"][0]["wire_bytes"])),
        "fixed_point_bound_log2_rel": math.log2(bound / grad_max)
        if bound and grad_max
        else -1074.0,  # below any float64
        "final_eval_loss": curve[-1],
        "loss_curve_max_abs_diff": max(abs(a - b) for a, b in zip(curve, normal_curve, strict=True)),
        "loss_curve_max_rel_diff": max(abs(a - b) / abs(b) for a, b in zip(curve, normal_curve, strict=True)),
        "final_state_equal_1_vs_2_groups": _same_final_state(exact, exact_alone),
    }
    baselines = {
        "normal_step_time_ms": _slower_median_ms(normal),
        "normal_wire_bytes_per_step": float(statistics.median(normal["reports"][0]["wire_bytes"])),
        "float32_rounding_log2_rel": math.log2(FLOAT32_ROUNDING),
        "normal_final_eval_loss": normal_curve[-1],
        "normal_final_state_equal_1_vs_2_groups": _same_final_state(normal, normal_alone),
    }
    compared = {
        "step_time_ms": "normal_step_time_ms",
        "wire_bytes_per_step": "normal_wire_bytes_per_step",
        "final_eval_loss": "normal_final_eval_loss",
    }
    return BenchmarkResult(
        name="deterministic",
        figures=figures,
        baselines=baselines,
        compared_to=compared,
        notes=(
            f"2 replica groups of 1 rank + a lighthouse, {steps} steps, global batch {BATCH}, {SHARDS} virtual "
            "shards; step time is the slower group's median; wire bytes are the all-reduce payload per rank per "
            "step; the normal mode's final state between 1 and 2 groups is "
            f"{'equal' if baselines['normal_final_state_equal_1_vs_2_groups'] else 'not equal'}; the deterministic "
            "mode's "
            f"{'is equal' if figures['final_state_equal_1_vs_2_groups'] else 'is NOT equal'}"
        ),
        params={
            "steps": steps,
            "batch": BATCH,
            "virtual_shards": SHARDS,
            "fixed_point_bound_max_abs": bound,
            "smallest_step_grad_max": grad_max,
            "eval_loss_deterministic": curve,
            "eval_loss_normal": normal_curve,
        },
    )
