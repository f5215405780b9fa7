"""The baseline without fault tolerance: the whole job checkpoints at the Young/Daly interval
and restarts from its last checkpoint whenever any group fails.

Simulated against the same fault schedule as the fault-tolerant systems (faults.py), so its
figure and theirs differ by the rules, not by the dice; Daly's closed form is reported beside
it as a check. The interval is Young's optimum,
``sqrt(2 x checkpoint cost x MTBF)``, with the MTBF the job's (every group's failures, racks
included: any of them stops a synchronous job). A checkpoint blocks training for
``checkpoint_s`` (the asynchronous save's blocking part, calibrated); a restart costs the
whole job's stop and start (``Costs.job_restart_s``) plus loading the checkpoint, and loses
the work since the last checkpoint. What each kind does here:

* kill, host, rack: the job stops at once (the survivors' collectives fail on the closed or
  dead peer), restarts, and redoes the work since the checkpoint;
* hang: the job stalls until torch.distributed's collective timeout notices it
  (``Costs.collective_timeout_s``), then as a kill;
* preempt: the notice lets the job checkpoint first, so it loses the save and the restart only;
* sigstop: the job stalls for the freeze, then goes on (nothing fails);
* lighthouse: there is none; nothing happens.

A fault that strikes while the job is restarting is absorbed by that restart (it swaps the
failed hosts anyway).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from benchmarks.scale.faults import HOUR_S, Fault
from benchmarks.scale.outcome import Outcome
from benchmarks.scale.params import Costs, FaultRates, JobShape


@dataclass(frozen=True, slots=True)
class CheckpointPlan:
    """What checkpoint-restart costs this job, and the interval that minimises its waste."""

    checkpoint_s: float
    restart_s: float
    mtbf_s: float
    interval_s: float

    @classmethod
    def young_daly(cls, shape: JobShape, costs: Costs, rates: FaultRates) -> CheckpointPlan:
        gb = shape.state_bytes_per_gpu / 1e9
        checkpoint_s = costs.checkpoint_s_per_gb * gb
        restart_s = costs.job_restart_s + costs.checkpoint_load_s_per_gb * gb
        failures_per_s = rates.per_group_h() * shape.groups / HOUR_S
        mtbf_s = 1 / failures_per_s if failures_per_s > 0 else math.inf
        interval_s = math.sqrt(2 * checkpoint_s * mtbf_s) if math.isfinite(mtbf_s) else math.inf
        return cls(checkpoint_s, restart_s, mtbf_s, interval_s)

    def closed_form_goodput(self) -> float:
        """Daly's expected wall time per interval of work under exponential failures (Daly 2006,
        "A higher order estimate of the optimum checkpoint interval for restart dumps", eq. 11):
        ``M e^(R/M) (e^((tau + C)/M) - 1)``, of which ``tau`` is work. It lets a failure strike
        during a restart (which the simulation absorbs instead), so it reads a little lower
        where restarts are a sizeable share of the MTBF."""
        m = self.mtbf_s
        if not math.isfinite(m):
            return 1.0
        wall_per_interval = m * math.exp(self.restart_s / m) * math.expm1((self.interval_s + self.checkpoint_s) / m)
        return self.interval_s / wall_per_interval


class CheckpointRestartJob:
    """The job's timeline in one pass over the fault schedule: work, saves, failures, restarts."""

    name = "checkpoint_restart"

    def __init__(
        self, shape: JobShape, costs: Costs, plan: CheckpointPlan, schedule: list[Fault], *, duration_s: float
    ):
        self.shape, self.costs, self.plan = shape, costs, plan
        self.schedule = [f for f in schedule if f.kind != "lighthouse" and f.at_s < duration_s]
        self.duration_s = duration_s
        self.t = 0.0
        self.saved_s = 0.0
        """Work (seconds of fault-free training) in the last checkpoint."""
        self.unsaved_s = 0.0
        """Work done since it."""
        self.lost: dict[str, float] = {}
        self.faults: dict[str, int] = {}

    def _train_until(self, end: float) -> None:
        """Train (and save every ``interval_s`` of work) from ``self.t`` until ``end``."""
        while self.t < end:
            to_save = self.plan.interval_s - self.unsaved_s
            if self.t + to_save > end:
                self.unsaved_s += end - self.t
                self.t = end
                return
            self.t += to_save
            self.unsaved_s = 0.0
            self.saved_s += self.plan.interval_s
            self.t += self.plan.checkpoint_s  # the save blocks; a fault during it is taken after
            self._charge("checkpoint", self.plan.checkpoint_s)

    def _charge(self, kind: str, seconds: float) -> None:
        self.lost[kind] = self.lost.get(kind, 0.0) + seconds

    def _restart(self, kind: str, *, redo: bool) -> None:
        if redo:
            self._charge(kind, self.unsaved_s)
        else:
            self.saved_s += self.unsaved_s
            self._charge(kind, self.plan.checkpoint_s)
            self.t += self.plan.checkpoint_s
        self.unsaved_s = 0.0
        self._charge(kind, self.plan.restart_s)
        self.t += self.plan.restart_s

    def run(self) -> Outcome:
        for f in self.schedule:
            self.faults[f.kind] = self.faults.get(f.kind, 0) + 1
            if f.at_s < self.t:  # the job is restarting or saving: absorbed
                continue
            self._train_until(f.at_s)
            if f.kind == "sigstop":
                self._charge("sigstop", f.duration_s)
                self.t += f.duration_s
            elif f.kind == "hang":
                self._charge("hang", self.costs.collective_timeout_s)
                self.t += self.costs.collective_timeout_s
                self._restart("hang", redo=True)
            else:
                self._restart(f.kind, redo=f.kind != "preempt")
        self._train_until(self.duration_s)
        # A restart the run's end cut short has no work after it: the saved work is what stays.
        useful_s = self.saved_s + self.unsaved_s
        ideal_step_s = self.shape.step_s  # steps only label the work: goodput is in seconds
        groups = self.shape.groups
        return Outcome(
            system=self.name,
            groups=groups,
            wall_s=self.duration_s,
            goodput=useful_s / self.duration_s,
            useful_group_steps=groups * useful_s / ideal_step_s,
            ideal_step_s=ideal_step_s,
            committed_steps=int(useful_s / ideal_step_s),
            faults=dict(self.faults),
            lost_group_s={k: v * groups for k, v in self.lost.items()},
            quorum_sizes=[(0.0, groups)],
        )
