"""torchft 0.2.0's lighthouse rules, ported for the simulator (there is no Python copy to import).

From the study of its source (/work/shared/reference/torchft-study.md §2, ``src/lighthouse.rs``):

* ``quorum_compute(now, state, opt)`` (:func:`quorum_compute` below, in its order): healthy
  replicas are those whose last heartbeat is younger than ``heartbeat_timeout_ms`` (5 s); the
  fast quorum forms when every member of the previous quorum is a healthy participant; else
  ``min_replicas``, the split-brain guard (participants more than half of everything that
  heartbeats, a hung member included), and a straggler wait of ``join_timeout_ms`` (60 s, the
  CLI's default) unless every healthy replica joined.
* A quorum request runs a tick at once; the periodic tick runs every ``quorum_tick_ms`` (100 ms).
  The quorum id grows when the sorted ids change or a participant reports a failed commit; the
  participants are cleared for the next round.
* Heartbeats come from a thread of the manager, every 100 ms, while the process lives and is
  not frozen, stuck training loop or not; nothing else is noticed (a closed connection is not).
  So a heartbeat's age here is worked out from the process's state, not sent as events.
* A restarted replica has a new id (a uuid suffix); its old id keeps counting as healthy until
  its heartbeat ages out. A lost lighthouse fails every replica's quorum call, and with the
  default ``quorum_retries=0`` every replica exits (the job then restarts from a checkpoint).
* Its managers (study §3, §4.3): no notice of a lost peer (the survivors learn from their
  collective: at once when the peer's socket closes, after ``timeout`` when it is silent); the
  donor's ``should_commit`` waits for the healer's read (``disallow_checkpoint``); no preemption
  handling; no warm standby.
"""

from __future__ import annotations

from dataclasses import dataclass

from benchmarks.scale.params import Costs
from benchmarks.scale.system import Behaviour, Formed

HEARTBEAT_INTERVAL_S = 0.1


@dataclass(frozen=True, slots=True)
class TorchftOptions:
    min_replicas: int = 1
    join_timeout_s: float = 60.0
    heartbeat_timeout_s: float = 5.0
    quorum_tick_s: float = 0.1


@dataclass(slots=True)
class _Participant:
    joined: float
    step: int
    commit_failures: int


def quorum_compute(
    now: float,
    participants: dict[str, _Participant],
    healthy: set[str],
    prev: tuple[str, ...] | None,
    opt: TorchftOptions,
) -> tuple[str, ...] | None:
    """torchft's rule: the ids of the quorum to form now, or None (shrink_only is never asked here)."""
    healthy_participants = {rid: p for rid, p in participants.items() if rid in healthy}
    candidates = tuple(sorted(healthy_participants))
    if prev is not None and all(rid in healthy_participants for rid in prev):
        return candidates  # fast quorum: skips min_replicas, split brain and the join timeout
    if len(healthy_participants) < opt.min_replicas:
        return None
    if len(healthy_participants) <= len(healthy) // 2:
        return None
    all_joined = len(healthy_participants) == len(healthy)
    first = min((p.joined for p in healthy_participants.values()), default=now)
    if not all_joined and now - first < opt.join_timeout_s:
        return None
    return candidates


class TorchftLighthouse:
    name = "torchft"

    def __init__(self, costs: Costs, options: TorchftOptions | None = None) -> None:
        self.options = options or TorchftOptions()
        self.costs = costs
        self.tick_s = self.options.quorum_tick_s
        self.behaviour = Behaviour(
            notices=False,
            heal_blocks_donors=True,
            graceful_preemption=False,
            lighthouse_loss_crashes_groups=True,
            collective_timeout_s=costs.torchft_timeout_s,
            warm_restart=False,
        )
        self.calls = 0
        self._up = True
        self._ids: dict[str, str] = {}
        """The job's group id -> its current process's torchft replica id (with the uuid)."""
        self._stopped: dict[str, float | None] = {}
        """torchft id -> when its heartbeats stopped (None: still beating). Never pruned, as in torchft."""
        self._participants: dict[str, _Participant] = {}
        self._prev: tuple[str, ...] | None = None
        self._quorum_id = 0

    @property
    def up(self) -> bool:
        return self._up

    def heartbeat_interval_s(self) -> float:
        """No heartbeat events: a torchft heartbeat's age follows from its process's state."""
        return float("inf")

    def outage_s(self) -> float:
        return self.costs.job_restart_s

    def _healthy(self, now: float) -> set[str]:
        # A beating replica's last heartbeat is on average half an interval old.
        limit = self.options.heartbeat_timeout_s - HEARTBEAT_INTERVAL_S / 2
        return {tid for tid, stopped in self._stopped.items() if stopped is None or now - stopped < limit}

    def register(self, rid: str, instance: int, step: int, last_quorum_id: int, now: float) -> list[str]:
        tid = f"{rid}:{instance:08d}"
        self._ids[rid] = tid
        self._stopped[tid] = None
        return []

    def close(self, rid: str, now: float, *, graceful: bool) -> list[str]:
        self.silence(rid, now)
        return []

    def silence(self, rid: str, now: float) -> None:
        tid = self._ids.get(rid)
        if tid is not None and self._stopped.get(tid) is None:
            self._stopped[tid] = now

    def heartbeat(self, rid: str, step: int, progress: int, now: float) -> None:
        """Never called (see :meth:`heartbeat_interval_s`)."""

    def join(self, rid: str, step: int, commit_failures: int, now: float) -> Formed | None:
        self.calls += 1
        tid = self._ids[rid]
        if self._stopped.get(tid) is not None:  # a resumed process: its heartbeat thread runs again
            self._stopped[tid] = None
        self._participants[tid] = _Participant(now, step, commit_failures)
        return self._quorum_tick(now)

    def tick(self, now: float) -> tuple[list[str], Formed | None]:
        if not self._up or not self._participants:
            return [], None
        return [], self._quorum_tick(now)

    def _quorum_tick(self, now: float) -> Formed | None:
        self.calls += 1
        ids = quorum_compute(now, self._participants, self._healthy(now), self._prev, self.options)
        if ids is None:
            return None
        joined = [self._participants[tid] for tid in ids]
        changed = self._prev is None or ids != self._prev
        if changed or any(p.commit_failures > 0 for p in joined):
            self._quorum_id += 1
        self._prev = ids
        self._participants = {}
        max_step = max(p.step for p in joined)
        rids = tuple(tid.rsplit(":", 1)[0] for tid in ids)
        healers = frozenset(rid for rid, p in zip(rids, joined, strict=True) if p.step != max_step)
        return Formed(self._quorum_id, rids, max_step, healers, changed)

    def may_commit(self, rid: str, formed: Formed, step: int, now: float) -> bool:
        """torchft's ``should_commit`` asks the group's ranks only: there is no fence."""
        return True

    def lose_lighthouse(self, now: float) -> None:
        self._up = False

    def restore_lighthouse(self, now: float) -> float:
        """A restarted torchft lighthouse: quorum id 0, no previous quorum, nobody waiting."""
        self._up = True
        self._participants, self._prev, self._quorum_id = {}, None, 0
        return now
