"""What each kind of fault does to a group, and how the group comes back.

The rules decide when the lighthouse notices (a closed session at once, a silence after its
limit, a stuck loop after the progress deadline, torchft's heartbeat expiry); this module says
what the process does: it crashes and restarts (in a warm standby, or cold, or on a spare host),
freezes and resumes, hangs until its collective's watchdog kills it, leaves at a step boundary
on a preemption notice, or waits out a lighthouse loss and reconnects. A restarted process has
no state: it joins at step 0 and heals from the up-to-date groups.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from benchmarks.scale.faults import Fault
from benchmarks.scale.group import Group

if TYPE_CHECKING:
    from benchmarks.scale.job import Job

HEAL_REPLAY_STEPS = 16
"""replicaft's ``heal_replay_steps`` default: a heal longer than this many steps holds the donors."""


class Recovery:
    def __init__(self, job: Job) -> None:
        self.job = job
        self.checkpoint_interval_s = 1800.0
        """torchft's periodic checkpoint, which a lighthouse loss sends the whole job back to."""

    @property
    def now(self) -> float:
        return self.job.q.now

    def strike(self, fault: Fault) -> None:
        if fault.kind == "lighthouse":
            self._lighthouse()
            return
        for i in fault.groups:
            g = self.job.groups[self.job.rids[i]]
            if not g.alive:
                continue
            if fault.kind == "kill":
                self._crash(g, "kill")
                self._restart_after(g, self._restart_s())
            elif fault.kind in ("host", "rack"):
                self._freeze(g, fault.kind)
                g.alive = False
                self._restart_after(g, self.job.costs.host_replace_s)
            elif fault.kind == "sigstop":
                self._freeze(g, "sigstop")
                self.job.later(fault.duration_s, f"resume {g.rid}", self._resume, g, g.instance)
            elif fault.kind == "hang":
                self._hang(g)
            elif fault.kind == "preempt":
                self._preempt(g)

    # -- the kinds --------------------------------------------------------------------------

    def _restart_s(self) -> float:
        c = self.job.costs
        return c.warm_restart_s if self.job.system.behaviour.warm_restart else c.cold_restart_s

    def _crash(self, g: Group, kind: str) -> None:
        """The process exits: its sockets close, so its peers' collectives fail at once."""
        job = self.job
        g.fault = kind
        job.ledger.charge(g.rid, kind)
        in_step = job.step is not None and g.rid in job.step.formed.replica_ids
        g.alive, g.frozen, g.stuck, g.leaving = False, False, False, False
        g.epoch += 1
        if in_step:
            job.abort(kind, self.now)
        was_live = g.session
        g.session = False
        if was_live and job.system.up:
            job.on_lost(job.system.close(g.rid, self.now, graceful=False))

    def _freeze(self, g: Group, kind: str) -> None:
        """Silent: no message, no progress, its sockets stay open (SIGSTOP, a dead host)."""
        job = self.job
        g.fault = kind
        job.ledger.charge(g.rid, kind)
        g.frozen = True
        job.system.silence(g.rid, self.now)
        if job.step is not None and g.rid in job.step.formed.replica_ids:
            job.block(self.now)

    def _hang(self, g: Group) -> None:
        """Stuck in a collective, heartbeating; its watchdog kills it after its collective timeout."""
        job = self.job
        g.fault = "hang"
        job.ledger.charge(g.rid, "hang")
        g.stuck = True
        if job.step is not None and g.rid in job.step.formed.replica_ids:
            job.block(self.now)
        job.later(job.system.behaviour.collective_timeout_s, f"watchdog {g.rid}", self._watchdog, g, g.instance)

    def _watchdog(self, g: Group, instance: int) -> None:
        if g.instance == instance and g.stuck:
            self._crash(g, "hang")
            self._restart_after(g, self._restart_s())

    def _preempt(self, g: Group) -> None:
        job = self.job
        if not job.system.behaviour.graceful_preemption or not g.runs:
            self._crash(g, "preempt")
            self._restart_after(g, job.costs.host_replace_s)
            return
        g.fault = "preempt"
        job.ledger.charge(g.rid, "preempt")
        g.leaving = True
        if job.step is None or g.rid not in job.step.formed.replica_ids:
            self.leave(g)

    def leave(self, g: Group) -> None:
        """A preempted group's clean exit at a step boundary: its peers lose nothing but it."""
        job = self.job
        g.alive, g.leaving = False, False
        g.epoch += 1
        was_live, g.session = g.session, False
        if was_live and job.system.up:
            job.on_lost(job.system.close(g.rid, self.now, graceful=True))
        self._restart_after(g, job.costs.host_replace_s)

    def _resume(self, g: Group, instance: int) -> None:
        job = self.job
        if g.instance != instance or not g.frozen:
            return
        g.frozen = False
        st = job.step
        if g.session:
            g.epoch += 1
            job.q.at(self.now, job._heartbeat, g, g.epoch)
            if st is not None and g.rid in st.formed.replica_ids:
                job.unblock(self.now)
            else:
                job.join(g, commit_failures=1)
        else:  # fenced meanwhile: a new session, and a heal
            job.later(
                job.costs.reconnect_s,
                f"reconnect {g.rid}",
                job.reconnect,
                g,
                last_quorum_id=g.quorum_id,
                commit_failures=1,
            )

    def _restart_after(self, g: Group, delay_s: float) -> None:
        self.job.later(delay_s, f"restart {g.rid}", self._restart, g)

    def _restart(self, g: Group) -> None:
        g.alive, g.frozen, g.stuck, g.leaving = True, False, False, False
        g.instance += 1
        g.step, g.heal_until, g.quorum_id = 0, 0.0, -1
        self.job.reconnect(g, last_quorum_id=-1)

    # -- heals ------------------------------------------------------------------------------

    def _heal_s(self) -> float:
        job = self.job
        return job.costs.heal_s(job.shape.state_bytes_per_gpu, torchft=job.system.behaviour.heal_blocks_donors)

    def _heal_blocks(self) -> bool:
        job = self.job
        return job.system.behaviour.heal_blocks_donors or self._heal_s() > HEAL_REPLAY_STEPS * job.shape.step_s

    def start_heal(self, g: Group, max_step: int) -> None:
        """``g`` is behind ``max_step`` in a new quorum: it fetches the state, contributing zeros."""
        g.step = max_step
        g.heal_until = self.now + self._heal_s()

    def heal_effect(self, members: list[Group], now: float, duration_s: float) -> float:
        """A step's duration while some member heals: the donors serve from a snapshot and run a
        little slower, or (torchft, or a heal past the replay limit) wait for the fetch to end."""
        healing = [g.heal_until for g in members if g.heal_until > now]
        if not healing:
            return duration_s
        if self._heal_blocks():
            return max(duration_s, max(healing) - now)
        return duration_s * self.job.costs.donor_slowdown

    # -- the lighthouse ---------------------------------------------------------------------

    def _lighthouse(self) -> None:
        job = self.job
        if not job.system.up:
            return
        if job.system.behaviour.lighthouse_loss_crashes_groups:
            self._restart_job_from_checkpoint()
            return
        job.system.lose_lighthouse(self.now)
        for g in job.groups.values():
            if g.alive:
                g.fault = "lighthouse"
                job.ledger.charge(g.rid, "lighthouse")
                g.session = False
                g.epoch += 1
        job.later(job.system.outage_s(), "lighthouse", self._lighthouse_back)

    def _lighthouse_back(self) -> None:
        job = self.job
        at = job.system.restore_lighthouse(self.now)
        for g in job.groups.values():
            if g.runs:
                job.later(
                    at - self.now + job.costs.reconnect_s,
                    f"reconnect {g.rid}",
                    job.reconnect,
                    g,
                    last_quorum_id=g.quorum_id,
                    commit_failures=1,
                )

    def _restart_job_from_checkpoint(self) -> None:
        """torchft: every group's quorum call fails and it exits; no group is left to heal from,
        so the job restarts from its last periodic checkpoint and redoes the steps since."""
        job = self.job
        for g in job.groups.values():
            if g.alive or g.frozen:
                self._crash(g, "lighthouse")
        job.system.lose_lighthouse(self.now)
        since_checkpoint_s = self.now % self.checkpoint_interval_s
        redone = job.shape.groups * since_checkpoint_s / job.ledger.ideal_step_s
        job.ledger.useful_group_steps -= redone
        job.ledger.lost_group_s["lighthouse"] += redone * job.ledger.ideal_step_s
        step = max(0, job.ledger.committed_steps - int(since_checkpoint_s / job.ledger.ideal_step_s))
        job.later(job.costs.job_restart_s, "job restart", self._job_back, step)

    def _job_back(self, step: int) -> None:
        job = self.job
        job.system.restore_lighthouse(self.now)
        for g in job.groups.values():
            g.alive, g.frozen, g.stuck, g.leaving = True, False, False, False
            g.instance += 1
            g.step, g.heal_until, g.quorum_id = step, 0.0, -1
        for g in job.groups.values():
            job.reconnect(g, last_quorum_id=-1)
