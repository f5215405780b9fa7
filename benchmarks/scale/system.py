"""The seam between the simulated job and a fault-tolerance system's lighthouse rules.

The job (job.py) owns the groups, their steps and their failures; a :class:`System` owns the
rules that decide who is in the quorum, who is lost and who may commit, and says how its
managers behave around them. replicaft_lighthouse.py puts the real ``Membership`` behind it;
torchft_lighthouse.py a port of torchft 0.2.0's ``quorum_compute``. Every call takes the
virtual time, as the rules themselves do.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class Formed:
    """A quorum as the job needs it: who is in it, at which step, who heals."""

    quorum_id: int
    replica_ids: tuple[str, ...]
    max_step: int
    healers: frozenset[str]
    new_roster: bool
    """Its members differ from the last quorum's: the column process group is rebuilt."""


@dataclass(frozen=True, slots=True)
class Behaviour:
    """How a system's managers act around its rules (what the rules alone do not say)."""

    notices: bool
    """Survivors are told at once that a member was lost, and abort the step they share."""
    heal_blocks_donors: bool
    """The donors hold their step until the healer has fetched their state (torchft's lock)."""
    graceful_preemption: bool
    """A SIGTERM ends the group at a step boundary instead of killing it mid-step."""
    lighthouse_loss_crashes_groups: bool
    """A lighthouse loss makes every group's quorum call fail and the process exit."""
    collective_timeout_s: float
    """A step blocked on a silent or hung peer fails after this, whatever the lighthouse says."""
    warm_restart: bool
    """A crashed process restarts in a standby that already imported and built its model."""


class System(Protocol):
    name: str
    tick_s: float
    behaviour: Behaviour
    calls: int
    """Calls made into the rules (a figure of the run)."""

    @property
    def up(self) -> bool: ...

    def heartbeat_interval_s(self) -> float:
        """How often a live group's process must call :meth:`heartbeat` now."""
        ...

    def outage_s(self) -> float:
        """How long a lost lighthouse is gone before one serves again."""
        ...

    def register(self, rid: str, instance: int, step: int, last_quorum_id: int, now: float) -> list[str]:
        """A group's process opens its session; returns the groups this declared lost."""
        ...

    def close(self, rid: str, now: float, *, graceful: bool) -> list[str]:
        """The group's session ended (its process exited): the groups declared lost."""
        ...

    def silence(self, rid: str, now: float) -> None:
        """The group's process stopped sending anything (frozen, or its host gone)."""
        ...

    def heartbeat(self, rid: str, step: int, progress: int, now: float) -> None: ...

    def join(self, rid: str, step: int, commit_failures: int, now: float) -> Formed | None:
        """The group asks for the next quorum; the quorum if this request formed one."""
        ...

    def tick(self, now: float) -> tuple[list[str], Formed | None]:
        """The lighthouse's periodic check: groups found lost, and a quorum a deadline formed."""
        ...

    def may_commit(self, rid: str, formed: Formed, step: int, now: float) -> bool: ...

    def lose_lighthouse(self, now: float) -> None: ...

    def restore_lighthouse(self, now: float) -> float:
        """A lighthouse serves again (restarted, or a standby took over): when groups may reconnect."""
        ...
