"""What a simulated run reports, and the ledger that adds it up as the run goes.

**Goodput** is committed useful work over the work a fault-free job would have done in the same
wall time: useful group-steps (a committed step counts once for each group that contributed
real gradients to it; a healer's zeros do not count) divided by ``groups x wall / step``, where
``step`` is the mean compute time of a step with no fault-tolerance machinery at all (the
slowest of the groups' draws, nothing added). So a fault-free replicaft run scores 1 less its
per-step overhead (the lighthouse round the forward pass does not hide, the gap between steps).

**Time lost by kind.** Every group-second that is not spent in a committed contributing step
is lost, and is charged to the fault that made the group lose it: its own failure, or the
failure that aborted its step, or the lighthouse loss it waited out; with no fault to blame it
is overhead. A group's loss is charged when it next commits useful work (or at the run's end),
as one interval from its last useful step's end, so a restart, a heal and the aborted step
before them are one charge to one fault.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field

OVERHEAD = "overhead"


@dataclass(frozen=True, slots=True)
class Outcome:
    system: str
    groups: int
    wall_s: float
    goodput: float
    useful_group_steps: float
    ideal_step_s: float
    committed_steps: int
    faults: dict[str, int]
    lost_group_s: dict[str, float]
    """Group-seconds lost, by the kind of fault they are charged to (and ``overhead``)."""
    quorum_sizes: list[tuple[float, int]]
    """(time, participants) whenever the quorum's size changed."""
    lighthouse_calls: int = 0
    """Calls into the real lighthouse rules (Membership) the run made; 0 for the others."""

    def lost_job_s_per_fault(self) -> dict[str, float]:
        """Seconds of the whole job lost per fault of each kind: its group-seconds over the groups."""
        return {
            kind: self.lost_group_s.get(kind, 0.0) / self.groups / n for kind, n in sorted(self.faults.items()) if n
        }

    def summary(self) -> dict[str, object]:
        return {
            "system": self.system,
            "groups": self.groups,
            "wall_h": round(self.wall_s / 3600, 3),
            "goodput": round(self.goodput, 5),
            "committed_steps": self.committed_steps,
            "faults": dict(sorted(self.faults.items())),
            "lost_job_s_per_fault": {k: round(v, 3) for k, v in self.lost_job_s_per_fault().items()},
            "overhead_share": round(self.lost_group_s.get(OVERHEAD, 0.0) / (self.groups * self.wall_s), 5),
            "min_quorum": min((n for _, n in self.quorum_sizes), default=self.groups),
        }


@dataclass(slots=True)
class Ledger:
    """Adds up one run: useful group-steps, losses by blame, faults, quorum sizes."""

    groups: int
    ideal_step_s: float
    useful_group_steps: float = 0.0
    lost_group_s: defaultdict[str, float] = field(default_factory=lambda: defaultdict(float))
    faults: Counter[str] = field(default_factory=Counter)
    quorum_sizes: list[tuple[float, int]] = field(default_factory=list)
    committed_steps: int = 0
    useful_until: dict[str, float] = field(default_factory=dict)
    blame: dict[str, str] = field(default_factory=dict)

    def fault(self, kind: str) -> None:
        self.faults[kind] += 1

    def charge(self, rid: str, kind: str) -> None:
        """``rid``'s time from now until its next useful step is ``kind``'s fault (the first
        fault to strike it keeps the charge: the later ones only prolong what it caused)."""
        self.blame.setdefault(rid, kind)

    def useful(self, rid: str, started: float, ended: float, steps: int = 1) -> None:
        """``rid`` contributed to ``steps`` committed steps over [started, ended]."""
        since = self.useful_until.get(rid, 0.0)
        if started > since:
            self.lost_group_s[self.blame.pop(rid, OVERHEAD)] += started - since
        else:
            self.blame.pop(rid, None)
        # Negative for a step faster than the mean: the draws average out over a run.
        self.lost_group_s[OVERHEAD] += (ended - max(started, since)) - steps * self.ideal_step_s
        self.useful_until[rid] = ended
        self.useful_group_steps += steps

    def quorum(self, now: float, size: int) -> None:
        if not self.quorum_sizes or self.quorum_sizes[-1][1] != size:
            self.quorum_sizes.append((now, size))

    def close(self, system: str, rids: list[str], wall_s: float, lighthouse_calls: int = 0) -> Outcome:
        for rid in rids:
            since = self.useful_until.get(rid, 0.0)
            if wall_s > since:
                self.lost_group_s[self.blame.pop(rid, OVERHEAD)] += wall_s - since
        ideal = self.groups * wall_s / self.ideal_step_s
        return Outcome(
            system=system,
            groups=self.groups,
            wall_s=wall_s,
            goodput=self.useful_group_steps / ideal if ideal else 0.0,
            useful_group_steps=self.useful_group_steps,
            ideal_step_s=self.ideal_step_s,
            committed_steps=self.committed_steps,
            faults=dict(self.faults),
            lost_group_s=dict(self.lost_group_s),
            quorum_sizes=list(self.quorum_sizes),
            lighthouse_calls=lighthouse_calls,
        )
