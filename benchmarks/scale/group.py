"""One simulated replica group: what its process is doing, as the job sees it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class Group:
    rid: str
    alive: bool = True
    """Its process runs (false from a crash or a host loss until its restart)."""
    frozen: bool = False
    """It sends nothing and computes nothing (SIGSTOP, or its host died without closing a socket)."""
    stuck: bool = False
    """It heartbeats but its training loop is stuck (hung in a collective)."""
    leaving: bool = False
    """Preempted: it leaves after the step it is in."""
    session: bool = False
    """It holds a session the lighthouse has not declared lost."""
    instance: int = 0
    """Its process incarnation: a restart is a new process (a new client instance)."""
    epoch: int = 0
    """Bumped at every change of process or session, so that its scheduled events go stale."""
    step: int = 0
    quorum_id: int = -1
    progress: int = 0
    last_msg: float = 0.0
    heal_until: float = 0.0
    fault: str = ""
    """The kind of the fault it is recovering from (the blame for its lost time)."""

    @property
    def runs(self) -> bool:
        """It can take part in a step now."""
        return self.alive and not self.frozen and not self.stuck
