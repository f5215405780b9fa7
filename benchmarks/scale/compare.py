"""One configuration, three alternatives: the same job and fault schedule under replicaft's
rules, torchft's rules and checkpoint-restart, and what each run reports in the results file.

How long a configuration runs is set by how many faults it should see, not by a fixed wall
time: a job of 8 groups at Llama 3's per-host rate fails once a month, one of 2,048 every three
hours, and a goodput measured over a day of the first would be one fault's luck. So the
duration is the time in which ``faults`` failures are expected, within ``[min_h, max_h]``;
the leaps (job.py) make a simulated year of a small job as cheap as a day.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from benchmarks.scale.checkpoint_job import CheckpointPlan, CheckpointRestartJob
from benchmarks.scale.faults import HOUR_S, draw_schedule
from benchmarks.scale.job import Job
from benchmarks.scale.outcome import Outcome
from benchmarks.scale.params import Costs, FaultRates, JobShape
from benchmarks.scale.replicaft_lighthouse import ReplicaftLighthouse
from benchmarks.scale.steps import RoundCost
from benchmarks.scale.torchft_lighthouse import TorchftLighthouse, TorchftOptions
from lighthouse.config.options import MembershipOptions

SYSTEMS = ("replicaft", "torchft", "checkpoint_restart")
SIZE_POINTS = 60
"""Quorum-size samples kept per run for the chart (the run's changes, thinned to this many)."""


@dataclass(frozen=True, slots=True)
class Config:
    shape: JobShape
    rates: FaultRates
    duration_s: float
    seed: int = 1
    label: str = ""

    @classmethod
    def expecting(
        cls, shape: JobShape, rates: FaultRates, faults: float, *, min_h: float, max_h: float, seed: int = 1
    ) -> Config:
        """A run long enough that ``faults`` failures are expected in it, within [min_h, max_h]."""
        per_h = rates.per_group_h() * shape.groups + rates.lighthouse_per_h
        hours = min(max_h, max(min_h, faults / per_h if per_h > 0 else min_h))
        return cls(shape, rates, hours * HOUR_S, seed)


def simulate(
    config: Config,
    costs: Costs,
    round_cost: RoundCost,
    options: MembershipOptions,
    systems: Sequence[str] = SYSTEMS,
) -> dict[str, Outcome]:
    """Every system of ``systems`` on ``config``'s job, against one fault schedule."""
    shape = config.shape
    schedule = draw_schedule(config.rates, shape.groups, config.duration_s, config.seed)
    out: dict[str, Outcome] = {}
    for name in systems:
        if name == "checkpoint_restart":
            plan = CheckpointPlan.young_daly(shape, costs, config.rates)
            out[name] = CheckpointRestartJob(shape, costs, plan, schedule, duration_s=config.duration_s).run()
            continue
        system = (
            ReplicaftLighthouse(costs, options)
            if name == "replicaft"
            else TorchftLighthouse(costs, TorchftOptions(min_replicas=shape.min_replicas))
        )
        job = Job(shape, costs, system, schedule, duration_s=config.duration_s, round_cost=round_cost, seed=config.seed)
        out[name] = job.run()
    return out


def quorum_summary(outcome: Outcome) -> dict[str, Any]:
    """Quorum sizes over the run: time-weighted mean, minimum, the share of time at full size,
    how often it changed, and a thinned series (time in hours, size) for the chart."""
    sizes, wall, full = outcome.quorum_sizes, outcome.wall_s, outcome.groups
    if not sizes:
        return {"mean": 0.0, "min": 0, "full_share": 0.0, "changes": 0, "series": []}
    weighted, at_full = 0.0, 0.0
    for (t, n), (t_next, _) in zip(sizes, [*sizes[1:], (wall, 0)], strict=True):
        span = max(0.0, min(t_next, wall) - t)
        weighted += n * span
        at_full += span if n == full else 0.0
    stride = max(1, len(sizes) // SIZE_POINTS)
    series = [[round(t / HOUR_S, 4), n] for t, n in sizes[::stride]]
    return {
        "mean": round(weighted / wall, 3),
        "min": min(n for _, n in sizes),
        "full_share": round(at_full / wall, 5),
        "changes": len(sizes) - 1,
        "series": series,
    }


def describe_run(outcome: Outcome) -> dict[str, Any]:
    """What the results file keeps of one run."""
    per_fault_group_s = {
        kind: round(outcome.lost_group_s.get(kind, 0.0) / n, 3) for kind, n in sorted(outcome.faults.items()) if n
    }
    return {
        **outcome.summary(),
        "lost_group_s_per_fault": per_fault_group_s,
        "lost_group_s": {k: round(v, 2) for k, v in sorted(outcome.lost_group_s.items())},
        "quorum_sizes": quorum_summary(outcome),
        "lighthouse_calls": outcome.lighthouse_calls,
    }


def describe_config(config: Config, costs: Costs) -> dict[str, Any]:
    plan = CheckpointPlan.young_daly(config.shape, costs, config.rates)
    return {
        "label": config.label,
        "groups": config.shape.groups,
        "gpus": config.shape.groups * config.shape.gpus_per_group,
        "hours": round(config.duration_s / HOUR_S, 2),
        "seed": config.seed,
        "job_mtbf_h": round(plan.mtbf_s / HOUR_S, 3),
        "checkpoint": {
            "interval_s": round(plan.interval_s, 1),
            "checkpoint_s": round(plan.checkpoint_s, 2),
            "restart_s": round(plan.restart_s, 1),
            "closed_form_goodput": round(plan.closed_form_goodput(), 5),
        },
        "rates_per_group_h": {k: v for k, v in asdict(config.rates).items() if k.endswith("_h")},
    }
