"""A whole job in virtual time: its groups' steps, quorums and heals, around a System's rules.

Every step of the job is one quorum: the groups ask (``System.join``), the rules form it, the
participants compute for the slowest group's draw (steps.py) plus what the lighthouse's round
adds, and each asks the rules whether it may commit. A membership change adds the column
process group's rebuild; a healer fetches its state while the others train (or, under torchft's
rules, while the donors wait for it).

**Leaps.** A 2,048-group job asks 2,048 times a step; simulating days of that would take hours.
But the rules are pure functions of their inputs, and between faults the inputs repeat: the
same roster asks for the next step and gets the same answer on the fast path. So once a roster
has held for a round with nothing pending, the job leaps: it draws the step times up to the
next scheduled event (a fault, a restart, a heal's end), books those steps, and then replays the
heartbeats the lighthouse would have heard in the last ``GAP_WINDOW`` intervals, so that the real
rules resume with the cadence they would have seen. Every membership change, loss, heal start,
timeout and lighthouse restart runs through the rules call by call.

faults.py's schedule drives the failures; recovery.py has what each kind does to a group.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from benchmarks.scale.events import EventQueue
from benchmarks.scale.faults import Fault
from benchmarks.scale.group import Group
from benchmarks.scale.outcome import Ledger, Outcome
from benchmarks.scale.params import Costs, JobShape
from benchmarks.scale.steps import RoundCost, slowest_of, step_moments, sum_of_steps
from benchmarks.scale.system import Formed, System
from lighthouse.rules.liveness import GAP_WINDOW


class InFlight:
    """The step a quorum started: its members compute until ``ends`` unless one blocks it."""

    def __init__(self, formed: Formed, started: float, ends: float) -> None:
        self.formed = formed
        self.started = started
        self.ends = ends
        self.blocked_since: float | None = None


class Job:
    def __init__(
        self,
        shape: JobShape,
        costs: Costs,
        system: System,
        schedule: list[Fault],
        *,
        duration_s: float,
        round_cost: RoundCost,
        seed: int = 0,
    ) -> None:
        self.shape, self.costs, self.system = shape, costs, system
        self.duration_s = duration_s
        self.round_cost = round_cost
        self.q = EventQueue()
        self.rng = random.Random(seed)
        self.groups = {f"g{i:05d}": Group(f"g{i:05d}") for i in range(shape.groups)}
        self.rids = list(self.groups)
        self.ledger = Ledger(shape.groups, step_moments(shape.groups, shape)[0])
        self.schedule = schedule
        self.step: InFlight | None = None
        self._token = 0
        self._leap_until = -1.0
        self._pending: dict[str, float] = {}
        """Scheduled group events (restart, resume) by key: leaps stop before them."""
        self._next_fault = 0
        from benchmarks.scale.recovery import Recovery  # the fault handlers act on this job

        self.recovery = Recovery(self)

    # -- running ----------------------------------------------------------------------------

    def run(self) -> Outcome:
        for g in self.groups.values():
            self._register(g, last_quorum_id=-1)
        for g in self.groups.values():
            self.join(g)
        for f in self.schedule:
            if f.at_s < self.duration_s:
                self.q.at(f.at_s, self._fault, f)
        self.q.at(self.system.tick_s, self._tick)
        while len(self.q) and (t := self.q.next_time()) is not None and t <= self.duration_s:
            self.q.run_next()
        self.q.now = self.duration_s
        return self.ledger.close(self.system.name, self.rids, self.duration_s, self.system.calls)

    def later(self, delay_s: float, key: str, callback: Callable[..., None], *args: object, **kwargs: object) -> None:
        """Schedule a group event that leaps must not skip."""
        when = self.q.now + delay_s
        self._pending[key] = when

        def fire() -> None:
            self._pending.pop(key, None)
            callback(*args, **kwargs)

        self.q.at(when, fire)

    def _fault(self, fault: Fault) -> None:
        self._next_fault += 1
        self.ledger.fault(fault.kind)
        self.recovery.strike(fault)

    # -- the lighthouse's side --------------------------------------------------------------

    def _register(self, g: Group, *, last_quorum_id: int) -> None:
        now = self.q.now
        g.session = True
        g.epoch += 1
        g.last_msg = now
        self.on_lost(self.system.register(g.rid, g.instance, g.step, last_quorum_id, now))
        self.q.at(now + self.system.heartbeat_interval_s(), self._heartbeat, g, g.epoch)

    def reconnect(self, g: Group, *, last_quorum_id: int, commit_failures: int = 0) -> None:
        """``g`` opens a new session and asks for a quorum (after a restart, a freeze, an outage)."""
        if not self.system.up or not g.runs:
            return
        self._register(g, last_quorum_id=last_quorum_id)
        if self.step is None or g.rid not in self.step.formed.replica_ids:  # else it asks at the step's end
            self.join(g, commit_failures)

    def _heartbeat(self, g: Group, epoch: int) -> None:
        if epoch != g.epoch or not g.alive or g.frozen or not g.session:
            return
        now, interval = self.q.now, self.system.heartbeat_interval_s()
        if now < self._leap_until:
            self.q.at(self._leap_until + interval, self._heartbeat, g, epoch)
            return
        if now - g.last_msg >= interval - 1e-9 and self.system.up:
            if not g.stuck:
                g.progress += 1
            self.system.heartbeat(g.rid, g.step, g.progress, now)
            g.last_msg = now
        self.q.at(g.last_msg + interval, self._heartbeat, g, epoch)

    def _tick(self) -> None:
        now = self.q.now
        if now < self._leap_until:
            self.q.at(self._leap_until, self._tick)
            return
        lost, formed = self.system.tick(now)
        self.on_lost(lost)
        if formed is not None:
            self._formed(formed)
        self.q.at(now + self.system.tick_s, self._tick)

    def join(self, g: Group, commit_failures: int = 0) -> None:
        if not self.system.up or not g.runs or not g.session:
            return
        g.last_msg = self.q.now
        formed = self.system.join(g.rid, g.step, commit_failures, self.q.now)
        if formed is not None:
            self._formed(formed)

    def on_lost(self, rids: list[str]) -> None:
        """The lighthouse declared ``rids`` lost; under notices, survivors of their step abort."""
        for rid in rids:
            g = self.groups[rid]
            g.session = False
            g.epoch += 1
            st = self.step
            if st is not None and rid in st.formed.replica_ids and self.system.behaviour.notices:
                self.abort(g.fault or "overhead", self.q.now + self.costs.notice_s)

    # -- steps ------------------------------------------------------------------------------

    def _formed(self, f: Formed) -> None:
        now = self.q.now
        self.ledger.quorum(now, len(f.replica_ids))
        members = [self.groups[r] for r in f.replica_ids]
        for g in members:
            g.quorum_id = f.quorum_id
        for rid in f.healers:
            self.recovery.start_heal(self.groups[rid], f.max_step)
        duration = slowest_of(len(members), self.shape, self.rng) + self.round_cost.added_s(len(members), self.shape)
        if f.new_roster:
            duration += self.costs.pg_rebuild_s
        duration = self.recovery.heal_effect(members, now, duration)
        self._token += 1
        self.step = InFlight(f, now, now + duration)
        if any(not g.runs for g in members):
            self.block(now)
        else:
            self.q.at(self.step.ends, self._step_end, self._token)

    def block(self, now: float) -> None:
        """A member of the step stopped: it cannot end until the member resumes or the step aborts."""
        st = self.step
        if st is None or st.blocked_since is not None:
            return
        st.blocked_since = now
        self._token += 1
        self.q.at(now + self.system.behaviour.collective_timeout_s, self._collective_timeout, self._token)

    def unblock(self, now: float) -> None:
        st = self.step
        if st is None or st.blocked_since is None:
            return
        if any(not self.groups[r].runs for r in st.formed.replica_ids):
            return
        st.ends = max(st.ends, now) + (now - st.blocked_since)
        st.blocked_since = None
        self._token += 1
        self.q.at(st.ends, self._step_end, self._token)

    def _collective_timeout(self, token: int) -> None:
        if token == self._token and self.step is not None:
            blocker = next((self.groups[r] for r in self.step.formed.replica_ids if not self.groups[r].runs), None)
            self.abort(blocker.fault if blocker is not None else "overhead", self.q.now)

    def abort(self, kind: str, at: float) -> None:
        """The step fails for its running members; they ask again at ``at``."""
        st, self.step = self.step, None
        if st is None:
            return
        self._token += 1
        for rid in st.formed.replica_ids:
            g = self.groups[rid]
            if g.runs:
                self.ledger.charge(rid, kind)
                self.q.at(at, self._rejoin, g, g.epoch)

    def _rejoin(self, g: Group, epoch: int) -> None:
        if epoch == g.epoch:
            self.join(g, commit_failures=1)

    def _step_end(self, token: int) -> None:
        st = self.step
        if token != self._token or st is None:
            return
        self.step = None
        now = self.q.now
        committed: list[Group] = []
        for rid in st.formed.replica_ids:
            g = self.groups[rid]
            if not g.runs:
                continue
            if self.system.may_commit(rid, st.formed, g.step, now):
                g.step += 1
                committed.append(g)
                if g.heal_until <= st.started:
                    self.ledger.useful(rid, st.started, now)
            else:
                self.ledger.charge(rid, "lighthouse" if not self.system.up else "overhead")
        if committed:
            self.ledger.committed_steps = max(self.ledger.committed_steps, max(g.step for g in committed))
        if len(committed) == len(st.formed.replica_ids) and self._try_leap(st, committed):
            return
        done = {g.rid for g in committed}
        for rid in st.formed.replica_ids:
            g = self.groups[rid]
            if g.leaving:
                self.recovery.leave(g)
            elif g.runs:
                self.join(g, 0 if rid in done else 1)

    # -- leaps ------------------------------------------------------------------------------

    def _horizon(self) -> float:
        times = [self.duration_s, *self._pending.values()]
        if self._next_fault < len(self.schedule):
            times.append(self.schedule[self._next_fault].at_s)
        times += [g.heal_until for g in self.groups.values() if g.heal_until > self.q.now]
        return min(times)

    def _try_leap(self, st: InFlight, members: list[Group]) -> bool:
        """Book the steps up to the next scheduled event without asking the rules each time;
        False when the job is not steady (someone waits, heals into this step, or is stopped)."""
        now = self.q.now
        live = sum(1 for g in self.groups.values() if g.alive and g.session)
        if st.formed.new_roster or live != len(members) or not self.system.up or any(g.leaving for g in members):
            return False
        horizon, n = self._horizon(), len(members)
        added = self.round_cost.added_s(n, self.shape)
        slow = self.costs.donor_slowdown if any(g.heal_until > now for g in members) else 1.0
        # The step the next event lands in is left to the rules (sum_of_steps keeps one in hand).
        steps, took = sum_of_steps(n, self.shape, added, (horizon - now) / slow, self.rng)
        if steps < 2:
            return False
        t = now + took * slow
        for g in members:
            g.step += steps
            if g.heal_until <= now:
                self.ledger.useful(g.rid, now, t, steps)
        self.ledger.committed_steps = max(g.step for g in members)
        self._leap_until = t
        self.q.at(t, self._leap_end, [g.rid for g in members], now)
        return True

    def _leap_end(self, rids: list[str], since: float) -> None:
        now, interval = self.q.now, self.system.heartbeat_interval_s()
        beats = [now - k * interval for k in range(GAP_WINDOW, 0, -1) if now - k * interval > since]
        for rid in rids:
            g = self.groups[rid]
            if not g.runs or not g.session:
                continue
            for t in beats:
                g.progress += 1
                self.system.heartbeat(rid, g.step, g.progress, t)
        for rid in rids:
            g = self.groups[rid]
            if g.runs and g.session:
                self.join(g)
