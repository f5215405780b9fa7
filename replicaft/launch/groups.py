"""Keeping replica groups running: the one supervisor behind ``replicaft-launch`` and the chaos harness.

A :class:`GroupSupervisor` starts each group, notices when its process exits, asks its owner
what to do about it (restart after a delay, done, or give up: a :class:`RestartDecision`),
and starts it again, in a warm standby when one is ready (``standby_pool``), cold otherwise.
What differs between its two owners is behind :class:`GroupHooks`: the command line and
variables of a start, where the output goes, and the restart policy (the launcher's is
``decide_restart`` with ``--max-restarts``; the chaos runner's restarts every fault-killed
group ``restart_delay_s`` later until its job has finished, and records why each exit
happened). So chaos exercises the very restart path, standbys and memory reserves included,
that a launched job runs on.

Rejected: the chaos runner keeping a restart loop of its own beside this one. It did, and so
warm standbys and reserves were never under chaos; two loops also drift apart (the launcher
learnt standbys, the runner never did).

The supervisor never blocks except in :meth:`GroupSupervisor.kill` (bounded by the reaper) and
runs on its owner's thread: the owner calls :meth:`GroupSupervisor.tick` every turn of its loop
and feeds it the job's events (:meth:`GroupSupervisor.note_event`), from which it learns when
no group is starting up (standbys start only then) and how large the groups' state is (the
standbys' reserves).
"""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from replicaft.launch.children import DEFAULT_SPAWN, Child, SpawnSettings
from replicaft.launch.job_status import GroupState
from replicaft.launch.reaper import Reaper
from replicaft.launch.restart_policy import RestartDecision
from replicaft.launch.standby_pool import StandbyPool
from replicaft.process.process_tree import read_process_table, running_below, send_signal

logger = logging.getLogger(__name__)

STANDBY_QUIET_S = 30.0
"""A standby starts once every running group has committed since its start, or this long after
the latest start (for scripts that write no events, or a group that cannot commit alone)."""


@dataclass(slots=True)
class Group:
    """One replica group as its supervisor sees it; the current process is its incarnation."""

    replica_id: str
    state: GroupState = "waiting"
    child: Child | None = None
    """The latest process (kept after it exited); with W > 1 torchrun, the ranks below it."""
    num_restarts: int = 0
    num_standby_restarts: int = 0
    """Restarts that ran in a warm standby rather than a cold interpreter."""
    in_standby: bool = False
    """The current process was a warm standby."""
    restart_at: float = 0.0
    """Monotonic time of the next start while ``waiting``."""
    started_ts: float = 0.0
    """Wall time just before the latest start (as in the events' ``ts``): the ranks whose
    ``start`` event is no older belong to the current incarnation."""
    committed_since_start: bool = False

    @property
    def incarnation(self) -> int:
        """1 for the first process, 2 for the first restart, ..."""
        return self.num_restarts + 1

    @property
    def running(self) -> bool:
        return self.state == "running"


class GroupHooks(Protocol):
    """What the owner of a :class:`GroupSupervisor` decides; every call comes from its ``tick``."""

    def group_variables(self, group: Group) -> dict[str, str]:
        """The variables that make a process ``group`` for its start about to happen (its
        ``incarnation`` is already counted): the environment of a cold start on top of the
        base environment, or a standby's activation."""
        ...

    def cold_argv(self, group: Group) -> list[str]:
        """The command line of a cold start of ``group``."""
        ...

    def on_line(self, group: Group) -> Callable[[str], None]:
        """Where each line of output of ``group``'s incarnation about to start goes (called on
        the child's reader thread)."""
        ...

    def started(self, group: Group) -> None:
        """``group`` has just been started (``group.in_standby``: in a warm standby)."""
        ...

    def exited(self, group: Group, exit_code: int, now: float) -> RestartDecision:
        """``group``'s process exited with ``exit_code`` (``Popen.returncode``): restart it
        after ``delay_s``, leave it done, or give up on it."""
        ...


class GroupSupervisor:
    """Keeps ``replica_ids`` running through ``hooks``, with up to ``num_standbys`` warm standbys
    that run ``standby_script`` (the script and its arguments: W = 1 only). The ``reaper``
    (whose ``started`` must include :meth:`children`) stops processes; ``write_line`` shows a
    standby's own output before it becomes a group."""

    def __init__(
        self,
        replica_ids: Sequence[str],
        hooks: GroupHooks,
        *,
        reaper: Reaper,
        base_env: Callable[[], Mapping[str, str]],
        standby_script: Sequence[str],
        num_standbys: int,
        standby_reserve: bool,
        write_line: Callable[[str], None],
        settings: SpawnSettings = DEFAULT_SPAWN,
    ) -> None:
        self.groups = {rid: Group(rid) for rid in replica_ids}
        self._hooks = hooks
        self._reaper = reaper
        self._base_env = base_env
        self._settings = settings
        self._latest_start = time.monotonic()
        self.standbys = StandbyPool(
            standby_script,
            num_standbys=num_standbys,
            reserve=standby_reserve,
            env=base_env,
            write_line=write_line,
            discard=lambda standby: reaper.kill([standby]),
            settings=settings,
        )

    # -- the owner's loop

    def tick(self, now: float) -> None:
        """Handle every exit, start every group whose start is due, look after the standbys."""
        self.reap(now)
        for group in self.groups.values():
            if group.state == "waiting" and now >= group.restart_at:
                self._start(group, now)
        starting_up = any(g.running and not g.committed_since_start for g in self.groups.values())
        self.standbys.watch(quiet=not starting_up or now - self._latest_start >= STANDBY_QUIET_S)

    def reap(self, now: float) -> None:
        """Hand every group process that exited to ``hooks.exited`` and act on its decision."""
        for group in self.groups.values():
            if not group.running:
                continue
            assert group.child is not None
            code = group.child.popen.poll()
            if code is None:
                continue
            # A group is its failure domain: ranks orphaned by a dead torchrun go with it, at once.
            self._reaper.terminate([], grace_s=0.0)
            decision = self._hooks.exited(group, code, now)
            group.state = {"done": "done", "restart": "waiting", "give_up": "down"}[decision.action]
            group.restart_at = now + decision.delay_s

    def note_event(self, event: Mapping[str, object]) -> None:
        """Fold in one of the job's events: a group that committed since its latest start (standbys
        wait for that), the size of the groups' state (standbys' reserves are sized by it)."""
        if event.get("event") == "state_size":
            size = event.get("cpu_bytes")
            if isinstance(size, int) and not isinstance(size, bool):
                self.standbys.note_state_size(size)
            return
        if event.get("event") != "commit" or not event.get("committed"):
            return
        ts, group = event.get("ts"), self.groups.get(str(event.get("replica_id")))
        if group is not None and isinstance(ts, (int, float)) and ts >= group.started_ts:
            group.committed_since_start = True

    # -- acting on one group

    def processes(self, replica_id: str) -> list[int]:
        """The pids of the group's current incarnation, its root first; [] unless it runs."""
        group = self.groups[replica_id]
        if not group.running or group.child is None or group.child.popen.poll() is not None:
            return []
        return running_below([group.child.pid], read_process_table())

    def signal(self, replica_id: str, sig: signal.Signals) -> bool:
        """Send ``sig`` to every process of the group's current incarnation (a W > 1 group is
        torchrun plus ranks in sessions of their own, so no process group covers them); False
        when it does not run."""
        pids = self.processes(replica_id)  # listed while the root lives: no pid can have been reused
        send_signal(pids, sig)
        return bool(pids)

    def kill(self, replica_ids: Sequence[str]) -> None:
        """SIGKILL the groups' current incarnations and wait (bounded) until they are gone; their
        exits reach ``hooks.exited`` at the next :meth:`reap`."""
        self._reaper.kill([g.child for rid in replica_ids if (g := self.groups[rid]).running and g.child is not None])

    def postpone_restarts(self, at: float) -> None:
        """Every group waiting for its restart restarts at ``at`` (monotonic) instead."""
        for group in self.groups.values():
            if group.state == "waiting":
                group.restart_at = at

    def cancel_restarts(self) -> None:
        """No more starts: a group waiting for one stays down (its job is over without it)."""
        for group in self.groups.values():
            if group.state == "waiting":
                group.state = "down"

    def children(self) -> list[Child]:
        """Every process this supervisor started that it still holds: groups' and standbys'."""
        return [g.child for g in self.groups.values() if g.child is not None] + self.standbys.standbys

    # -- starting

    def _start(self, group: Group, now: float) -> None:
        if group.child is not None:
            group.num_restarts += 1
        group.started_ts, group.committed_since_start = time.time(), False
        self._latest_start = now
        group.state = "running"
        variables = self._hooks.group_variables(group)
        on_line = self._hooks.on_line(group)
        standby = self.standbys.take(variables, on_line) if group.num_restarts else None
        group.in_standby = standby is not None
        if standby is not None:
            group.child = standby
            group.num_standby_restarts += 1
        else:
            group.child = Child(
                self._hooks.cold_argv(group), {**self._base_env(), **variables}, on_line, settings=self._settings
            )
        self._hooks.started(group)
