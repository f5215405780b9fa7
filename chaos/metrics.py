"""The figures of a chaos run: goodput and recovery times. Pure functions over commits and faults.

**Goodput** is the fraction of the training window spent training steps the job kept::

    goodput = sum over the job's committed steps s of  median_g (step_time_s - quorum_wait_s)(g, s)
              ------------------------------------------------------------------------------------
              last commit ts  -  (first commit ts - its step_time_s)

``step_time_s`` is a group's time from asking for the step's quorum to committing it, and
``quorum_wait_s`` the part of it spent forming that quorum (the ``latency_s`` of its quorum
event), so the numerator is the time spent computing, all-reducing and committing steps that
committed. Each step counts once (the median over the groups that committed it, so a
healer's slow first step does not inflate it). Lost, by construction: aborted attempts,
waiting for a quorum to form (a membership change after a failure, a lighthouse restart),
a restarted group's repeated work, and any time with no group training. The window starts
when the first committed step started, so start-up (torch import, the initial weight sync) is
not counted against a run.

Caveats, measured rather than assumed: a fault-free run stays below 1 (the gap between a
commit and the next quorum request is not step time; 0.92 for the smoke scenario on the
2-core box), and the quorum request overlaps the forward pass, so for a model whose forward
outlasts the quorum RPC part of the "wait" was compute. Compare runs of one scenario through
``goodput_vs_fault_free`` rather than reading the absolute value.
**Recovery** of a fault is the time from the fault to the next *new* step (above the job's
highest committed step at the fault) committed by a group that survived it (any group, for a
lighthouse kill): how long the job as a whole stalled. "New" matters: survivors often log
their commit of the step in flight a few milliseconds after the fault, which says nothing
about recovery (measured: 0.003 s for a SIGKILL landing just after a commit).
After every group was killed (``kill_all_groups``, ``corrupt_checkpoint``) there are no
survivors and every commit is new work of restarted processes: recovery is then the time to
the job's first commit after the fault, whatever its step (it resumed from disk, below the
old frontier). For the checkpoint disk filling up, recovery is any group's next new step.
**Rejoin** is the time from the moment the target could run again (respawned, SIGCONT, the
lighthouse restarted) to its first committed step after that (any group's, for the
lighthouse): what restarting costs, without the orchestrator's restart delay in it.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from chaos.record import JOB_TARGETS, InjectedFault
from chaos.scenario import ALL_GROUPS_KINDS
from chaos.timeline import Commit, frontier, next_commit


@dataclass(frozen=True, slots=True)
class Goodput:
    useful_s: float
    window_s: float

    @property
    def value(self) -> float | None:
        return self.useful_s / self.window_s if self.window_s > 0 else None


def goodput(all_commits: Sequence[Commit]) -> Goodput:
    if not all_commits:
        return Goodput(0.0, 0.0)
    times: dict[int, list[float]] = defaultdict(list)
    for c in all_commits:
        times[c.step].append(max(0.0, c.step_time_s - c.quorum_wait_s))
    useful = sum(statistics.median(t) for t in times.values())
    first = min(all_commits, key=lambda c: c.ts)
    last = max(c.ts for c in all_commits)
    return Goodput(useful, last - (first.ts - first.step_time_s))


def recovery_seconds(all_commits: Sequence[Commit], fault: InjectedFault) -> float | None:
    """Fault to the next new step committed by a survivor; None if there was none."""
    exclude = None if fault.target in JOB_TARGETS else fault.target
    above = -1 if fault.kind in ALL_GROUPS_KINDS else frontier(all_commits, fault.ts)
    nxt = next_commit(all_commits, fault.ts, exclude=exclude, above_step=above)
    return None if nxt is None else nxt.ts - fault.ts


def rejoin_seconds(all_commits: Sequence[Commit], fault: InjectedFault) -> float | None:
    """Target runnable again to its first commit; None if it never came back or never committed."""
    if fault.resumed_ts is None:
        return None
    group = None if fault.target in JOB_TARGETS else fault.target
    nxt = next_commit(all_commits, fault.resumed_ts, group=group)
    return None if nxt is None else nxt.ts - fault.resumed_ts


def summarise(seconds_by_kind: dict[str, list[float]]) -> dict[str, dict[str, float]]:
    """``{kind: {"median", "max"}}`` (the DESIGN summary format), kinds without a figure left out."""
    return {
        kind: {"median": round(statistics.median(values), 3), "max": round(max(values), 3)}
        for kind, values in sorted(seconds_by_kind.items())
        if values
    }
