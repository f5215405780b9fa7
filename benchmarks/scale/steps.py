"""How long a synchronous step takes, and what the lighthouse's round adds to it.

A step of ``n`` groups ends when its slowest group does, so its compute time is the maximum of
``n`` draws of one group's step time (log-normal around the median). That maximum is drawn
directly, by inverting its distribution (the n-th power of one draw's), so a step of 2,048
groups costs one draw, not 2,048.

The quorum request is sent at the step's start and overlaps the forward pass; the all-reduce
needs its answer. So the lighthouse adds to the step only the part of its round latency that
outlasts the forward pass. The latency at ``n`` members is interpolated (log-log) between the
lighthouse benchmark's measured sizes (2 ... 1,024 members on this 2-core machine) and
extrapolated beyond them along the last measured slope.
"""

from __future__ import annotations

import bisect
import functools
import math
import random
from collections.abc import Mapping
from statistics import NormalDist

from benchmarks.scale.params import JobShape

_NORMAL = NormalDist()


LEAP_EXACT_STEPS = 64
"""A leap over fewer steps draws each; a longer one draws their sum at once (:func:`sum_of_steps`)."""
MOMENT_DRAWS = 4000


def slowest_of(n: int, shape: JobShape, rng: random.Random) -> float:
    """The compute time of one step of ``n`` groups: the slowest group's."""
    if shape.step_sigma <= 0:
        return shape.step_s
    u = min(rng.random() ** (1.0 / max(1, n)), 1.0 - 1e-12)
    return shape.step_s * math.exp(shape.step_sigma * _NORMAL.inv_cdf(max(u, 1e-12)))


@functools.lru_cache(maxsize=256)
def step_moments(n: int, shape: JobShape) -> tuple[float, float]:
    """Mean and standard deviation of one step of ``n`` groups, from a fixed seed's draws: the
    fault-free step that goodput is measured against, and what a long leap's sum is drawn from
    (one estimate for both, so that a fault-free run's goodput is 1 within its draws' noise)."""
    rng = random.Random(n)
    draws = [slowest_of(n, shape, rng) for _ in range(MOMENT_DRAWS)]
    mean = sum(draws) / len(draws)
    return mean, math.sqrt(sum((d - mean) ** 2 for d in draws) / len(draws))


def sum_of_steps(n: int, shape: JobShape, added_s: float, budget_s: float, rng: random.Random) -> tuple[int, float]:
    """As many steps of ``n`` groups (each ``added_s`` longer) as end ``budget_s`` or more before
    ``budget_s`` runs out, leaving room for one more: (steps, their total time).

    Up to :data:`LEAP_EXACT_STEPS` steps each is drawn; past that their sum is drawn from its
    normal limit (the draws are independent), so that a leap over a day of steps between two
    faults costs one draw instead of twenty thousand."""
    mean, sd = step_moments(n, shape)
    mean += added_s
    if budget_s < LEAP_EXACT_STEPS * mean:
        t, steps = 0.0, 0
        while (duration := slowest_of(n, shape, rng) + added_s) and t + 2 * duration < budget_s:
            t += duration
            steps += 1
        return steps, t
    steps = int(budget_s / mean) - 2
    total = steps * mean + math.sqrt(steps) * sd * rng.gauss(0.0, 1.0)
    return steps, min(total, budget_s - mean)


class RoundCost:
    """The lighthouse's round at ``n`` members: latency (last request to every answer) and CPU."""

    def __init__(self, measured: Mapping[int, tuple[float, float]]) -> None:
        self._sizes = sorted(measured)
        self._latency_ms = [measured[n][0] for n in self._sizes]
        self._cpu_ms = [measured[n][1] for n in self._sizes]

    def latency_s(self, n: int) -> float:
        return self._interpolate(n, self._latency_ms) / 1000

    def cpu_s(self, n: int) -> float:
        return self._interpolate(n, self._cpu_ms) / 1000

    def added_s(self, n: int, shape: JobShape) -> float:
        """What the round adds to a step of ``n`` groups: the latency the forward pass does not hide."""
        return max(0.0, self.latency_s(n) - shape.forward_fraction * shape.step_s)

    def _interpolate(self, n: int, values: list[float]) -> float:
        sizes = self._sizes
        if not sizes:
            return 0.0
        if len(sizes) == 1 or n <= sizes[0]:
            return values[0] * (n / sizes[0] if n < sizes[0] else 1.0)
        i = min(max(1, bisect.bisect_left(sizes, n)), len(sizes) - 1)
        x0, x1 = math.log(sizes[i - 1]), math.log(sizes[i])
        y0, y1 = math.log(values[i - 1]), math.log(values[i])
        return math.exp(y0 + (math.log(n) - x0) * (y1 - y0) / (x1 - x0))

    def max_members(self, shape: JobShape, *, cpu_share: float = 0.5) -> int:
        """The most members one lighthouse serves before it adds to the step: its round stays
        hidden behind the forward pass, and its CPU per round within ``cpu_share`` of a step
        (a lighthouse busier than that falls behind on heartbeats, liveness.py)."""
        n = 2
        while n < 1 << 20:
            if self.latency_s(n * 2) > shape.forward_fraction * shape.step_s or self.cpu_s(n * 2) > (
                cpu_share * shape.step_s
            ):
                break
            n *= 2
        lo, hi = n, n * 2
        while hi - lo > 1:
            mid = (lo + hi) // 2
            fits = self.latency_s(mid) <= shape.forward_fraction * shape.step_s
            fits = fits and self.cpu_s(mid) <= cpu_share * shape.step_s
            lo, hi = (mid, hi) if fits else (lo, mid)
        return lo
