"""Scale: goodput of 8- to 2,048-group jobs under published failure rates, simulated on the
lighthouse's real rules, against torchft's rules and whole-job checkpoint-restart.

A discrete-event simulation (benchmarks/scale/), not a measurement: every quorum, loss and fence
of replicaft's side is a call into the real ``lighthouse.rules.Membership`` with a virtual
clock; the costs of a restart, a heal, a rebuild and a lighthouse round are this machine's
measured figures (calibration.py; ``params.costs_basis`` names each one's source); failures
are Poisson processes at Llama 3's per-host rates (params.py cites them). Goodput is useful
group-steps over what the fault-free job does in the same wall time (outcome.py). The three
alternatives run against one fault schedule per configuration; checkpoint-restart is
simulated over it too (checkpoint_job.py), at the Young/Daly interval, with Daly's closed form
beside it. Two sweeps: the number of groups at Llama 3's rate, and the failure rate at one
size. ``params.left_out`` is a known rule problem reproduced (left_out.py); ``params.validation``
the simulator's predictions for the faults of real chaos runs (soak, commit_lease) against the
goodput each measured (validation.py; ``<scenario>_simulated_goodput`` over the measured
figure). The HTML page with
the charts is written beside the JSON (``benchmarks/results/scale.html``).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from benchmarks.results import RESULTS_DIR, BenchmarkResult
from benchmarks.scale import left_out, validation
from benchmarks.scale.calibration import calibrated_costs, lighthouse_round_ms
from benchmarks.scale.compare import SYSTEMS, Config, describe_config, describe_run, simulate
from benchmarks.scale.page import write_page
from benchmarks.scale.params import LLAMA3_BY_KIND, Costs, FaultRates, JobShape
from benchmarks.scale.steps import RoundCost
from lighthouse.config.options import MembershipOptions

GROUPS = (8, 32, 128, 512, 2048)
GROUPS_QUICK = (8, 32, 128, 512)
FAULTS, FAULTS_QUICK = 24, 8
"""Failures expected in each configuration's run (its duration follows, compare.py)."""
RSC_FACTOR = (1 / (7.9 * 128)) / (sum(LLAMA3_BY_KIND.values()) / (54 * 24 * 2048))
"""Meta's research clusters (Kokolis et al. 2024, arXiv 2410.21680): a mean time to failure of
7.9 h at 1,024 GPUs (128 hosts), 6.25 times Llama 3's per-host rate."""
RATE_FACTORS: dict[str, float] = {"llama3": 1.0, "meta_rsc": RSC_FACTOR, "x25": 25.0, "x100": 100.0}
RATE_GROUPS, RATE_GROUPS_QUICK = 512, 128
REPLICAFT_OPTIONS = MembershipOptions()
"""The lighthouse's defaults (a 2 s join timeout, below the 4 s step): the rules no longer leave
a group out of every quorum when the step outlasts the join timeout (left_out.py,
``params.left_out``), so the simulated job runs as a user's would, untuned."""


def _configuration(config: Config, costs: Costs, round_cost: RoundCost) -> dict[str, Any]:
    started = time.monotonic()
    outcomes = simulate(config, costs, round_cost, REPLICAFT_OPTIONS)
    return {
        **describe_config(config, costs),
        "runs": {name: describe_run(out) for name, out in outcomes.items()},
        "simulated_in_s": round(time.monotonic() - started, 2),
    }


def run(*, quick: bool) -> BenchmarkResult:
    costs, round_cost = calibrated_costs(), RoundCost(lighthouse_round_ms())
    faults = FAULTS_QUICK if quick else FAULTS
    llama3 = FaultRates.llama3()
    by_groups = []
    for n in GROUPS_QUICK if quick else GROUPS:
        config = Config.expecting(JobShape(groups=n), llama3, faults, min_h=24, max_h=50_000)
        by_groups.append(_configuration(dataclasses.replace(config, label=f"{n} groups"), costs, round_cost))
    rate_groups = RATE_GROUPS_QUICK if quick else RATE_GROUPS
    by_rate = []
    for label, factor in RATE_FACTORS.items():
        config = Config.expecting(JobShape(groups=rate_groups), llama3.scaled(factor), faults, min_h=6, max_h=50_000)
        row = _configuration(dataclasses.replace(config, label=label), costs, round_cost)
        by_rate.append({**row, "rate_factor": round(factor, 3)})
    problem = left_out.sweep(costs)
    replays = [validation.replay(name, costs) for name in validation.SCENARIOS]

    figures: dict[str, float] = {}
    baselines: dict[str, float] = {}
    compared_to: dict[str, str] = {}
    for rows, key in ((by_groups, lambda r: f"{r['groups']}g"), (by_rate, lambda r: r["label"])):
        for row in rows:
            suffix = key(row)
            ckpt = f"goodput_checkpoint_restart_{suffix}"
            baselines[ckpt] = row["runs"]["checkpoint_restart"]["goodput"]
            for name in SYSTEMS[:2]:
                figure = f"goodput_{name}_{suffix}"
                figures[figure] = row["runs"][name]["goodput"]
                compared_to[figure] = ckpt
    largest = by_groups[-1]
    for name in SYSTEMS:
        for kind, seconds in largest["runs"][name]["lost_job_s_per_fault"].items():
            figures[f"lost_job_s_per_{kind}_{name}_{largest['groups']}g"] = seconds
    for r in replays:
        figure, baseline = f"{r['scenario']}_simulated_goodput", f"{r['scenario']}_measured_goodput_vs_fault_free"
        figures[figure] = r["simulated_goodput"]
        baselines[baseline] = r["measured_goodput_vs_fault_free"]
        compared_to[figure] = baseline
    figures["left_out_smallest_step_to_join_timeout_ratio"] = problem["smallest_ratio_left_out"]["kill"] or 0.0
    figures["lighthouse_max_members_at_4s_step"] = float(round_cost.max_members(JobShape(groups=2)))
    params: dict[str, Any] = {
        "quick": quick,
        "shape": {k: v for k, v in dataclasses.asdict(JobShape(groups=1)).items() if k != "groups"},
        "replicaft_options": dataclasses.asdict(REPLICAFT_OPTIONS),
        "costs": {k: v for k, v in dataclasses.asdict(costs).items() if k != "basis"},
        "costs_basis": costs.basis,
        "faults_expected_per_run": faults,
        "rate_factors": {k: round(v, 4) for k, v in RATE_FACTORS.items()},
        "by_groups": by_groups,
        "by_rate": by_rate,
        "left_out": problem,
        "validation": {**{r["scenario"]: r for r in replays}, "table": validation.table(replays)},
    }
    result = BenchmarkResult(
        name="scale",
        figures=figures,
        baselines=baselines,
        compared_to=compared_to,
        notes=(
            "Simulated, not measured: the real lighthouse rules on a virtual clock, this machine's measured "
            "recovery costs, Llama 3's failure rates; one seed per configuration, each run as long as "
            f"{faults} failures are expected. Ratios are goodput over checkpoint-restart's on the same schedule. "
            f"replicaft runs with join_timeout_s={REPLICAFT_OPTIONS.join_timeout_s:g} (see params.left_out). "
            "Charts: benchmarks/results/scale.html."
        ),
        params=params,
    )
    write_page(result, RESULTS_DIR / "scale.html")
    return result
