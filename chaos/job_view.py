"""What the runner knows about the job so far, folded from the events as they arrive. Pure.

The runner injects faults and decides when a run is over from observable facts only: the
job's highest committed step, when training started (its first commit), the current quorum
size, and, per rank process (by the pid its ``start`` event carries), whether it has committed
since it started and whether it has finished training. Keying by pid tells a restarted
group's new process apart from the one it replaced, which share a replica id and a file.

A group's *current* processes are the ranks whose ``start`` event is no older than the
moment the runner launched the group (``since_ts``): with W > 1 the runner's child is
torchrun, whose pid no event carries, and each rank has a pid of its own.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class JobView:
    step: int = 0
    """The highest step any group has committed."""
    first_commit_ts: float | None = None
    """When training started, by definition: the job's first committed step."""
    quorum_size: int = 0
    """``num_replicas`` of the latest quorum any group reported."""
    quorum_ts: float = 0.0
    pid_of: dict[tuple[str, int], int] = field(default_factory=dict)
    """The pid of each (group, rank)'s latest ``start`` event."""
    started_ts: dict[int, float] = field(default_factory=dict)
    """Process -> when it emitted ``start``."""
    committed_pids: set[int] = field(default_factory=set)
    """Processes that have committed at least one step."""
    stopped_at: dict[int, int] = field(default_factory=dict)
    """Process -> the step at which it emitted ``stop`` (its training loop ended)."""
    last_commit_ts: dict[str, float] = field(default_factory=dict)
    """Group -> when it last committed a step (any rank)."""
    checkpoints: list[tuple[float, int]] = field(default_factory=list)
    """(ts, step) of every checkpoint a group reported published."""

    def absorb(self, events: Iterable[dict[str, Any]]) -> None:
        """Fold new events in (each rank's in its own order)."""
        for e in events:
            kind, key = e["event"], (str(e["replica_id"]), int(e.get("group_rank", 0)))
            pid = self.pid_of.get(key)
            if kind == "start" and "pid" in e:
                self.pid_of[key] = int(e["pid"])
                self.started_ts[int(e["pid"])] = float(e["ts"])
            elif kind == "quorum" and e["ts"] >= self.quorum_ts:
                self.quorum_size, self.quorum_ts = int(e.get("num_replicas", 0)), e["ts"]
            elif kind == "commit" and e.get("committed"):
                self.step = max(self.step, int(e["step"]))
                if self.first_commit_ts is None or e["ts"] < self.first_commit_ts:
                    self.first_commit_ts = e["ts"]
                if pid is not None:
                    self.committed_pids.add(pid)
                self.last_commit_ts[key[0]] = max(self.last_commit_ts.get(key[0], 0.0), float(e["ts"]))
            elif kind == "stop" and pid is not None:
                self.stopped_at[pid] = int(e["step"])
            elif kind == "checkpoint" and e.get("ok") and isinstance(e.get("checkpoint_step"), int):
                self.checkpoints.append((float(e["ts"]), int(e["checkpoint_step"])))

    def rank_pids(self, group: str, since_ts: float) -> dict[int, int]:
        """Rank -> pid of ``group``'s processes that started at or after ``since_ts``."""
        return {
            rank: pid
            for (g, rank), pid in self.pid_of.items()
            if g == group and self.started_ts.get(pid, -1.0) >= since_ts
        }

    def committed_since(self, group: str, since_ts: float) -> bool:
        """Whether a process of ``group`` started at or after ``since_ts`` has committed a step."""
        return any(pid in self.committed_pids for pid in self.rank_pids(group, since_ts).values())

    def finished_since(self, group: str, since_ts: float, target_steps: int) -> bool:
        """Whether a process of ``group`` started at or after ``since_ts`` ended its loop at ``target_steps``."""
        return any(self.stopped_at.get(pid, -1) >= target_steps for pid in self.rank_pids(group, since_ts).values())
