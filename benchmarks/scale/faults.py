"""The failure process: when each fault strikes, of which kind, at which groups.

Each kind is an independent Poisson process at its rate (params.FaultRates): per group for the
group kinds (so a job of twice the groups fails twice as often), per rack for rack failures
(every group of the rack at once), per job for the lighthouse. The schedule is drawn once, from
a seed, before the run, and every system under comparison (replicaft, torchft's rules,
checkpoint-restart) is run against the same schedule: their differences are the rules', not
the dice's. Tests and the chaos replay pass a schedule of their own instead.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from benchmarks.scale.params import FaultKind, FaultRates

HOUR_S = 3600.0


@dataclass(frozen=True, slots=True)
class Fault:
    at_s: float
    kind: FaultKind
    groups: tuple[int, ...] = ()
    """The groups it strikes (none for a lighthouse loss)."""
    duration_s: float = 0.0
    """How long a sigstop freezes its group."""


def _poisson_times(rate_per_s: float, duration_s: float, rng: random.Random) -> list[float]:
    times, t = [], 0.0
    if rate_per_s <= 0:
        return times
    while (t := t + rng.expovariate(rate_per_s)) < duration_s:
        times.append(t)
    return times


def draw_schedule(rates: FaultRates, groups: int, duration_s: float, seed: int) -> list[Fault]:
    """Every fault of a ``duration_s`` run of ``groups`` groups, in time order."""
    rng = random.Random(seed)
    faults: list[Fault] = []
    per_group: list[tuple[FaultKind, float]] = [
        ("kill", rates.kill_per_h),
        ("host", rates.host_per_h),
        ("hang", rates.hang_per_h),
        ("sigstop", rates.sigstop_per_h),
        ("preempt", rates.preempt_per_h),
    ]
    for kind, rate in per_group:
        for t in _poisson_times(rate * groups / HOUR_S, duration_s, rng):
            faults.append(Fault(t, kind, (rng.randrange(groups),), rates.sigstop_s if kind == "sigstop" else 0.0))
    racks = max(1, groups // rates.rack_groups)
    for t in _poisson_times(rates.rack_per_h * racks / HOUR_S, duration_s, rng):
        first = rng.randrange(racks) * rates.rack_groups
        faults.append(Fault(t, "rack", tuple(range(first, min(groups, first + rates.rack_groups)))))
    for t in _poisson_times(rates.lighthouse_per_h / HOUR_S, duration_s, rng):
        faults.append(Fault(t, "lighthouse"))
    return sorted(faults, key=lambda f: f.at_s)
