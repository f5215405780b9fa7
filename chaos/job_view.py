"""What the runner knows about the job so far, folded from the events as they arrive. Pure.

The runner injects faults and decides when a run is over from observable facts only: the
job's highest committed step, when training started (its first commit), the current quorum
size, and, per process (by the pid its ``start`` event carries), whether it has committed
since it started and whether it has finished training. Keying by pid tells a restarted
group's new process apart from the one it replaced, which share a replica id and a file.
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
    pid_of: dict[str, int] = field(default_factory=dict)
    """The pid of each group's latest ``start`` event."""
    committed_pids: set[int] = field(default_factory=set)
    """Processes that have committed at least one step."""
    stopped_at: dict[int, int] = field(default_factory=dict)
    """Process -> the step at which it emitted ``stop`` (its training loop ended)."""

    def absorb(self, events: Iterable[dict[str, Any]]) -> None:
        """Fold new events in (each rank's in its own order)."""
        for e in events:
            kind, gid = e["event"], e["replica_id"]
            pid = self.pid_of.get(gid)
            if kind == "start" and "pid" in e:
                self.pid_of[gid] = int(e["pid"])
            elif kind == "quorum" and e["ts"] >= self.quorum_ts:
                self.quorum_size, self.quorum_ts = int(e.get("num_replicas", 0)), e["ts"]
            elif kind == "commit" and e.get("committed"):
                self.step = max(self.step, int(e["step"]))
                if self.first_commit_ts is None or e["ts"] < self.first_commit_ts:
                    self.first_commit_ts = e["ts"]
                if pid is not None:
                    self.committed_pids.add(pid)
            elif kind == "stop" and pid is not None:
                self.stopped_at[pid] = int(e["step"])

    def finished_training(self, pid: int, target_steps: int) -> bool:
        """Whether process ``pid`` ended its training loop having reached ``target_steps``."""
        return self.stopped_at.get(pid, -1) >= target_steps
