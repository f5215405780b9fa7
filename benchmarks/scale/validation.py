"""The simulator against reality: the chaos ``soak`` scenario's real run, replayed.

chaos/results/soak.json is the last real run of ``python -m chaos run soak --reference``: 3
groups, steps of ~0.4 s, 36 faults (SIGKILL, SIGSTOP 3 s, SIGTERM, lighthouse kill) at
recorded times, and its goodput against the fault-free run of the same scenario. The replay
runs the simulator with that run's faults at the times they struck (from its first commit),
its step time (useful step seconds over committed steps) and its settings (the lighthouse's
defaults, ``restart_delay_s`` before every restart, a fresh process each time: no warm
standby in that scenario), and compares the predicted goodput with the measured one. The
soak is not rerun here (it takes ten minutes of both cores).
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

from benchmarks.scale.faults import Fault
from benchmarks.scale.job import Job
from benchmarks.scale.params import Costs, FaultKind, JobShape
from benchmarks.scale.replicaft_lighthouse import ReplicaftLighthouse
from benchmarks.scale.steps import RoundCost
from lighthouse.config.options import MembershipOptions

SOAK = Path(__file__).resolve().parents[2] / "chaos" / "results" / "soak.json"
KINDS: dict[str, FaultKind] = {
    "sigkill": "kill",
    "sigstop": "sigstop",
    "sigterm": "preempt",
    "kill_lighthouse": "lighthouse",
}
RESTART_DELAY_S = 1.0
"""chaos/scenarios/soak.toml's ``restart_delay_s``: the orchestrator's pause before a restart."""
STEP_SIGMA = 0.05
PLANNED = re.compile(r"at t\+([0-9.]+)s")


def soak_faults(record: dict[str, Any]) -> list[Fault]:
    """The run's faults at the times they struck, counted from its first commit (the labels
    give the planned time from it; a fault that waited for its target struck later)."""
    first_commit = min(f["at_s"] - float(PLANNED.search(f["label"]).group(1)) for f in record["faults"])
    faults = []
    for f in record["faults"]:
        kind = KINDS[f["kind"]]
        groups = () if kind == "lighthouse" else (int(f["target"].lstrip("g")),)
        faults.append(Fault(f["at_s"] - first_commit, kind, groups, 3.0 if kind == "sigstop" else 0.0))
    return sorted(faults, key=lambda f: f.at_s)


def replay_soak(costs: Costs, path: Path = SOAK) -> dict[str, Any]:
    """The simulator's goodput for the soak's real faults, beside the goodput it measured."""
    record = json.loads(path.read_text())
    detail = record["goodput_detail"]
    step_s = detail["useful_step_seconds"] / record["committed_steps"]
    fresh_s = RESTART_DELAY_S + costs.cold_restart_s
    soak_costs = dataclasses.replace(costs, warm_restart_s=fresh_s, host_replace_s=fresh_s)
    shape = JobShape(
        groups=record["groups"], gpus_per_group=1, step_s=step_s, step_sigma=STEP_SIGMA, state_bytes_per_gpu=1e5
    )
    system = ReplicaftLighthouse(soak_costs, MembershipOptions(heartbeat_timeout_s=2.0, progress_timeout_s=20.0))
    job = Job(
        shape, soak_costs, system, soak_faults(record), duration_s=detail["window_seconds"], round_cost=RoundCost({})
    )
    out = job.run()
    measured = record["goodput_vs_fault_free"]
    return {
        "scenario": "soak",
        "run_started_at": record["started_at"],
        "groups": record["groups"],
        "step_s": round(step_s, 4),
        "faults": dict(sorted(record["faults_injected"].items())),
        "measured_goodput_vs_fault_free": measured,
        "simulated_goodput": round(out.goodput, 4),
        "error": round(out.goodput / measured - 1, 4),
        "simulated_lost_job_s_per_fault": {k: round(v, 3) for k, v in out.lost_job_s_per_fault().items()},
        "measured_recovery_s_median": {k: v["median"] for k, v in sorted(record["recovery_seconds"].items())},
    }
