"""A rule problem the simulator found, and its fix checked: with steps longer than
``join_timeout_s``, one group was left out of every quorum after a single failure, for good.

The mechanism, in the rules before the fix (lighthouse/rules/quorum.py, membership.py): a group
that comes back mid-step (a restart) asks for a quorum and waits while the others finish their
step. ``Membership.may_form_now`` lets a decision run as soon as as many members wait as the
last quorum had survivors, which the waiting newcomer makes true one join early; the fast path
does not apply (one survivor has not asked yet), so the slow path ran, and its join timeout ran
from the first waiter, the newcomer, who had waited longer than ``join_timeout_s``: the quorum
formed without the last member to ask. That member then waited a whole step, and the next round
left out whoever asked last. Each round one group sat out and the one it let in healed: a job
of ``n`` groups kept about ``(n - 2) / n`` of its work (0.51 at 3 groups, 0.77 at 8, with a step
1.5 times the join timeout). The join timeout now runs from the first member of the previous
quorum to ask, and no ratio of :data:`RATIOS` leaves a group out. torchft's ``quorum_compute``
has the old slow path (its default join timeout, 60 s, needs longer steps): its rows still show it.

:func:`sweep` runs one fault in jobs of a few groups at step time / join timeout ratios around
1 and reports for each ratio whether the job ever gets its full quorum back and how much of its
work it keeps. Two faults: a kill, whose victim restarts in the step its loss started (the
survivors abort and start a new one, so the victim waits a step less its restart), and a host
loss, whose replacement comes back at any point of a step (it waits up to a whole step).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from benchmarks.scale.faults import Fault
from benchmarks.scale.job import Job
from benchmarks.scale.params import Costs, JobShape
from benchmarks.scale.replicaft_lighthouse import ReplicaftLighthouse
from benchmarks.scale.steps import RoundCost
from benchmarks.scale.system import Formed, System
from benchmarks.scale.torchft_lighthouse import TorchftLighthouse, TorchftOptions
from lighthouse.config.options import MembershipOptions

RATIOS = (0.5, 0.8, 0.9, 0.95, 0.97, 1.0, 1.05, 1.1, 1.15, 1.2, 1.25, 1.5, 2.0, 4.0)
PHASES = (0.1, 0.4, 0.7)
"""Where in a step a replaced host's group comes back (it waits the rest of the step)."""
STEPS_AFTER = 60
"""Steps the job runs after the group is back: a left-out group that came back would have by then."""
FAULT_AT_STEP = 25.5


class _Counted:
    """A System whose formed quorums are recorded (size, time), every other call passed on."""

    def __init__(self, inner: System) -> None:
        self._inner = inner
        self.formed: list[tuple[float, int]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def _seen(self, formed: Formed | None, now: float) -> Formed | None:
        if formed is not None:
            self.formed.append((now, len(formed.replica_ids)))
        return formed

    def join(self, rid: str, step: int, commit_failures: int, now: float) -> Formed | None:
        return self._seen(self._inner.join(rid, step, commit_failures, now), now)

    def tick(self, now: float) -> tuple[list[str], Formed | None]:
        lost, formed = self._inner.tick(now)
        return lost, self._seen(formed, now)


def one_fault(
    system: System, groups: int, step_s: float, kind: str, back_after_s: float, costs: Costs
) -> dict[str, float]:
    """One fault of group 1 mid-step in a job of fixed-length steps: a ``kill`` (restarted at
    once, in the step its loss started) or a ``host`` loss (replaced ``back_after_s`` later,
    at any point of a step); the share of quorums after its return that leave a group out."""
    shape = JobShape(groups=groups, step_s=step_s, step_sigma=0.0, state_bytes_per_gpu=1e9)
    costs = dataclasses.replace(costs, host_replace_s=back_after_s)
    counted = _Counted(system)
    at_s = FAULT_AT_STEP * step_s
    back_s = at_s + (costs.warm_restart_s if kind == "kill" else back_after_s)
    wall_s = back_s + STEPS_AFTER * step_s
    fault = Fault(at_s, kind, (1,))  # type: ignore[arg-type]
    out = Job(shape, costs, counted, [fault], duration_s=wall_s, round_cost=RoundCost({})).run()
    later = [n for t, n in counted.formed if t > back_s + 2 * step_s]  # it is back and healed by then
    short = sum(1 for n in later if n < groups)
    return {
        "goodput": out.goodput,
        "short_quorum_share": short / len(later) if later else 0.0,
        "full_again": float(bool(later) and later[-1] == groups),
    }


def _runs(make: Callable[[], System], groups: int, step_s: float, costs: Costs) -> dict[str, list[dict[str, float]]]:
    return {
        "kill": [one_fault(make(), groups, step_s, "kill", 0.0, costs)],
        "host": [one_fault(make(), groups, step_s, "host", (10 + phase) * step_s, costs) for phase in PHASES],
    }


def sweep(costs: Costs, *, groups: Sequence[int] = (3, 8), join_timeout_s: float = 2.0) -> dict[str, Any]:
    """replicaft's rules at each ratio of :data:`RATIOS` and torchft's at two: after one kill and
    after one host loss, whether a group is left out for good, and the goodput of the run."""
    rows = []
    options = MembershipOptions(join_timeout_s=join_timeout_s)
    for n in groups:
        for ratio in RATIOS:
            runs = _runs(lambda: ReplicaftLighthouse(costs, options), n, ratio * join_timeout_s, costs)
            rows += [_row("replicaft", n, ratio, join_timeout_s, kind, r) for kind, r in runs.items()]
    torchft_timeout_s = TorchftOptions().join_timeout_s
    for ratio in (0.5, 1.5):
        runs = _runs(lambda: TorchftLighthouse(costs), 3, ratio * torchft_timeout_s, costs)
        rows += [_row("torchft", 3, ratio, torchft_timeout_s, kind, r) for kind, r in runs.items()]

    def smallest(kind: str) -> float | None:
        hit = [r["ratio"] for r in rows if r["system"] == "replicaft" and r["fault"] == kind and r["left_out_for_good"]]
        return min(hit) if hit else None

    return {
        "join_timeout_s": join_timeout_s,
        "host_return_phases": list(PHASES),
        "rows": rows,
        "smallest_ratio_left_out": {"kill": smallest("kill"), "host": smallest("host")},
    }


def _row(
    system: str, groups: int, ratio: float, join_timeout_s: float, kind: str, runs: list[dict[str, float]]
) -> dict[str, Any]:
    return {
        "system": system,
        "groups": groups,
        "fault": kind,
        "ratio": ratio,
        "step_s": round(ratio * join_timeout_s, 3),
        "join_timeout_s": join_timeout_s,
        "left_out_for_good": any(r["full_again"] == 0.0 for r in runs),
        "short_quorum_share": round(max(r["short_quorum_share"] for r in runs), 3),
        "goodput_min": round(min(r["goodput"] for r in runs), 4),
    }
