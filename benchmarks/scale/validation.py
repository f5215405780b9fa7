"""The simulator against reality: real chaos runs, replayed with their faults where they struck.

Each scenario in :data:`SCENARIOS` has a committed result of ``python -m chaos run NAME
--reference`` in chaos/results/: its faults at recorded times, its committed steps, and its
goodput against the fault-free run of the same scenario. The replay runs the simulator with
that run's faults at the times they struck (counted from its first commit), its
step time (useful step seconds over committed steps) and its settings, read from the
scenario's own file (chaos/scenarios/NAME.toml: heartbeat and progress timeouts, the
orchestrator's ``restart_delay_s`` before every restart, a fresh process each time, since no
scenario replayed here runs a warm standby), and compares the predicted goodput with the
measured one. The runs are not repeated here (the soak takes ten minutes of both cores).

* ``soak``: 36 random faults over ten minutes of 0.4 s steps (SIGKILL, SIGSTOP 3 s, SIGTERM,
  lighthouse kill), each planned at a time after the first commit.
* ``commit_lease``: six faults at planned steps of a 1,500-step job of ~0.1 s steps, where
  the groups commit inside their commit leases: SIGSTOPs of 0.2 to 0.5 s (around the
  lighthouse's silence limit), a SIGKILL and a 2 s network partition.

What each real fault is in the simulator (:data:`KINDS`): a partition is a freeze of its
duration (params.FaultKind ``sigstop``): its group goes silent to the lighthouse and to its
peers, with its process running but unable to commit, and comes back on a broken session that
reconnects and heals, which is what the simulator's freeze does once the lighthouse has
declared the group lost. Rejected: a new fault kind, whose only difference (the process keeps
computing a step it cannot commit) changes nothing the goodput counts.
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
from chaos.scenario import load_scenario
from lighthouse.config.options import MembershipOptions

RESULTS = Path(__file__).resolve().parents[2] / "chaos" / "results"
SCENARIOS = ("soak", "commit_lease")
KINDS: dict[str, FaultKind] = {
    "sigkill": "kill",
    "sigstop": "sigstop",
    "partition": "sigstop",
    "sigterm": "preempt",
    "kill_lighthouse": "lighthouse",
}
STEP_SIGMA = 0.05
"""Log-normal sigma of a group's step: an assumption (the chaos records give the mean only)."""
STATE_BYTES = 1e5
"""The chaos model's state (width 32 or 64: 20k to 60k parameters), so a heal is its fixed cost."""
PLANNED = re.compile(r"at t\+([0-9.]+)s")
DURATION = re.compile(r"for ([0-9.]+)s")
TABLE_HEADER = ["scenario", "faults", "step s", "measured goodput vs fault-free", "simulated", "error"]


def step_s(record: dict[str, Any]) -> float:
    """A step's useful time in the run: useful step seconds over committed steps."""
    return record["goodput_detail"]["useful_step_seconds"] / record["committed_steps"]


def origin_s(record: dict[str, Any]) -> float:
    """The time the simulator counts the run's faults from, in seconds on their clock (from the
    run's start): its first commit, within a step.

    A fault planned at a time (``at t+X s``, the random faults of the soak) was planned from the
    first commit, and a fault that waited for its target struck later than planned, so the
    earliest of ``at_s - X`` is the first commit. A fault planned at a step struck when the job
    reached it: the first such fault, less its step times the mean step, dates the first commit
    (an error of a few steps' spread moves every fault by the same amount, not their intervals,
    and the last fault is tens of seconds before the run's end)."""
    planned = [(f["at_s"], PLANNED.search(f["label"])) for f in record["faults"]]
    if all(m is not None for _, m in planned):
        return min(at_s - float(m.group(1)) for at_s, m in planned if m is not None)
    first = min(record["faults"], key=lambda f: f["at_s"])
    return first["at_s"] - first["step"] * step_s(record)


def replay_faults(record: dict[str, Any]) -> list[Fault]:
    """The run's faults at the times they struck, counted from its first commit (:func:`origin_s`)."""
    origin = origin_s(record)
    faults = []
    for f in record["faults"]:
        kind = KINDS[f["kind"]]
        groups = () if kind == "lighthouse" else (int(f["target"].lstrip("g")),)
        duration = DURATION.search(f["label"])
        frozen_s = float(duration.group(1)) if kind == "sigstop" and duration is not None else 0.0
        faults.append(Fault(f["at_s"] - origin, kind, groups, frozen_s))
    return sorted(faults, key=lambda f: f.at_s)


def replay(name: str, costs: Costs, path: Path | None = None) -> dict[str, Any]:
    """The simulator's goodput for the faults of scenario ``name``'s recorded run, beside the
    goodput that run measured against its fault-free reference."""
    record = json.loads((path or RESULTS / f"{name}.json").read_text())
    measured = record["goodput_vs_fault_free"]
    if measured is None:
        raise ValueError(f"{name}: its record has no goodput_vs_fault_free; run it with --reference")
    scenario = load_scenario(name)
    fresh_s = scenario.restart_delay_s + costs.cold_restart_s
    run_costs = dataclasses.replace(costs, warm_restart_s=fresh_s, host_replace_s=fresh_s)
    shape = JobShape(
        groups=record["groups"],
        gpus_per_group=1,
        step_s=step_s(record),
        step_sigma=STEP_SIGMA,
        state_bytes_per_gpu=STATE_BYTES,
    )
    options = MembershipOptions(
        heartbeat_timeout_s=scenario.heartbeat_timeout_s, progress_timeout_s=scenario.progress_timeout_s
    )
    window_s = record["goodput_detail"]["window_seconds"]
    job = Job(
        shape,
        run_costs,
        ReplicaftLighthouse(run_costs, options),
        replay_faults(record),
        duration_s=window_s,
        round_cost=RoundCost({}),
    )
    out = job.run()
    return {
        "scenario": name,
        "run_started_at": record["started_at"],
        "groups": record["groups"],
        "step_s": round(shape.step_s, 4),
        "window_s": window_s,
        "faults": dict(sorted(record["faults_injected"].items())),
        "measured_goodput_vs_fault_free": measured,
        "simulated_goodput": round(out.goodput, 4),
        "error": relative_error(out.goodput, measured),
        "simulated_lost_job_s_per_fault": {k: round(v, 3) for k, v in out.lost_job_s_per_fault().items()},
        "measured_recovery_s_median": {k: v["median"] for k, v in sorted(record["recovery_seconds"].items())},
    }


def relative_error(simulated: float, measured: float) -> float:
    """The prediction's error, relative to the measurement (positive: the simulator is optimistic)."""
    return round(simulated / measured - 1, 4)


def table(replays: list[dict[str, Any]]) -> list[list[Any]]:
    """The comparison as rows under :data:`TABLE_HEADER` (the page and the docs show it)."""
    rows: list[list[Any]] = [list(TABLE_HEADER)]
    for r in replays:
        rows.append(
            [
                r["scenario"],
                sum(r["faults"].values()),
                r["step_s"],
                r["measured_goodput_vs_fault_free"],
                r["simulated_goodput"],
                r["error"],
            ]
        )
    return rows
