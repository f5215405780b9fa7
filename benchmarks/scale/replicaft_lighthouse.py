"""replicaft's lighthouse in virtual time: the real ``Membership`` behind the simulator's seam.

Nothing here decides anything. Each call builds the message a manager would send (``Register``,
``Heartbeat``, ``QuorumRequest``, ``FenceRequest``), hands it to the real state machine of
lighthouse/rules/membership.py with the virtual time, and reports what it answered, as the
gRPC server (lighthouse/server/grpc_server.py, its rounds in rounds.py) does: a join that completes the round decides at
once (``may_form_now``), the periodic tick expires silent and stuck members and decides on
deadlines, a closed session is a loss at once. The members' side of the commit lease is the
real ``MemberLease`` too (lighthouse/rules/commit_lease.py), and the step plan the real
``plan_step``. A restarted single lighthouse is a new ``Membership`` (it knows nothing); a
replicated one's new leader is its predecessor's ``successor`` restored from the last quorum,
as lighthouse/replicated/ does.
"""

from __future__ import annotations

from benchmarks.scale.params import Costs
from benchmarks.scale.system import Behaviour, Formed
from lighthouse.config.options import MembershipOptions
from lighthouse.rules.commit_lease import MemberLease
from lighthouse.rules.membership import Membership
from lighthouse.rules.plan import plan_step
from lighthouse.wire.fence import FenceRequest
from lighthouse.wire.protocol import Heartbeat, Quorum, QuorumRequest, Register

CLIENT_HEARTBEAT_S = 0.1
"""replicaft's ``heartbeat_interval_s`` default (replicaft/config/options.py)."""
TICK_S = 0.02
"""``LighthouseOptions.tick_s`` default."""
COLLECTIVE_TIMEOUT_S = 10.0
"""replicaft's ``collective_timeout_s`` default."""
QUORUM_TIMEOUT_S = 60.0


class ReplicaftLighthouse:
    name = "replicaft"

    def __init__(
        self,
        costs: Costs,
        options: MembershipOptions | None = None,
        *,
        replicated: bool = False,
        world_size: int = 8,
    ) -> None:
        self.options = options or MembershipOptions()
        self.costs = costs
        self.replicated = replicated
        self.world_size = world_size
        self.tick_s = TICK_S
        self.behaviour = Behaviour(
            notices=True,
            heal_blocks_donors=False,
            graceful_preemption=True,
            lighthouse_loss_crashes_groups=False,
            collective_timeout_s=COLLECTIVE_TIMEOUT_S,
            warm_restart=True,
        )
        if replicated:
            self.name = "replicaft_replicated"
        self.membership = Membership(self.options, incarnation=1)
        self.calls = 0
        self._up = True
        self._sessions: dict[str, int] = {}
        self._leases: dict[str, MemberLease] = {}
        self._sent: dict[str, tuple[float, float, int]] = {}
        """rid -> (when its last request was sent, the lease it asked, its step)."""
        self._previous: tuple[str, ...] | None = None

    @property
    def up(self) -> bool:
        return self._up

    def heartbeat_interval_s(self) -> float:
        """The client heartbeats at its own interval or the lighthouse's floor, the longer."""
        return max(CLIENT_HEARTBEAT_S, self.membership.heartbeat_floor_s)

    def outage_s(self) -> float:
        return self.costs.lighthouse_failover_s if self.replicated else self.costs.lighthouse_restart_s

    def register(self, rid: str, instance: int, step: int, last_quorum_id: int, now: float) -> list[str]:
        self.calls += 1
        reg = Register(
            rid,
            f"{rid}:29500",
            self.world_size,
            step,
            last_quorum_id,
            instance=f"{rid}#{instance}",
            heartbeat_interval_s=CLIENT_HEARTBEAT_S,
        )
        session, lost = self.membership.register(reg, now)
        self._sessions[rid] = session
        self._leases[rid] = MemberLease()
        return [m.replica_id for m in lost]

    def close(self, rid: str, now: float, *, graceful: bool) -> list[str]:
        self.calls += 1
        reason = "left cleanly after its last step" if graceful else "session stream closed"
        lost = self.membership.close_session(rid, self._sessions.get(rid, -1), reason, graceful=graceful)
        return [m.replica_id for m in lost]

    def silence(self, rid: str, now: float) -> None:
        """Nothing to tell: the rules notice a silence themselves, at the next tick past its limit."""

    def heartbeat(self, rid: str, step: int, progress: int, now: float) -> None:
        self.calls += 1
        self.membership.heartbeat(rid, self._sessions.get(rid, -1), Heartbeat(step, progress), now)

    def join(self, rid: str, step: int, commit_failures: int, now: float) -> Formed | None:
        self.calls += 1
        asked = self._leases[rid].ask(now, step)
        req = QuorumRequest(
            rid,
            step,
            f"{rid}:29500",
            self.world_size,
            QUORUM_TIMEOUT_S,
            commit_failures=commit_failures,
            commit_lease_s=asked,
        )
        self.membership.end_standing(req)
        if not self.membership.join(req, now):
            return None
        self._sent[rid] = (now, asked, step)
        return self._decide(now) if self.membership.may_form_now() else None

    def tick(self, now: float) -> tuple[list[str], Formed | None]:
        if not self._up:
            return [], None
        self.calls += 1
        lost = [m.replica_id for m in self.membership.expire(now)]
        return lost, self._decide(now) if self.membership.waiting_ids() else None

    def _decide(self, now: float) -> Formed | None:
        self.calls += 1
        quorum = self.membership.decide(now, now_unix_s=now)
        if quorum is None:
            return None
        for rid in quorum.replica_ids:
            sent_at, asked, step = self._sent[rid]
            self._leases[rid].granted(
                quorum.quorum_id, step, asked, quorum.standing_steps, quorum.max_commit_lease_s, sent_at
            )
        return self._formed(quorum)

    def _formed(self, quorum: Quorum) -> Formed:
        plan = plan_step(quorum, quorum.replica_ids[0])
        new_roster = quorum.replica_ids != self._previous
        self._previous = quorum.replica_ids
        return Formed(quorum.quorum_id, quorum.replica_ids, plan.max_step, frozenset(plan.healers), new_roster)

    def may_commit(self, rid: str, formed: Formed, step: int, now: float) -> bool:
        """Within its commit lease a group commits without asking; past it, it asks the fence."""
        held = self._leases[rid].held
        if held is not None and held.covers(formed.quorum_id, self._sent[rid][2], now):
            return True
        if not self._up:
            return False
        self.calls += 1
        return self.membership.fence(FenceRequest(rid, formed.quorum_id, step)).ok

    def lose_lighthouse(self, now: float) -> None:
        self._up = False

    def restore_lighthouse(self, now: float) -> float:
        old = self.membership
        if self.replicated:
            self.membership = old.successor(old.incarnation + 1)
            last = old.current.replica_ids if old.current is not None else None
            self.membership.restore(last, old.next_quorum_id, now)
        else:
            self.membership = Membership(self.options, old.incarnation + 1)
        self._up = True
        self._previous = None
        return now
