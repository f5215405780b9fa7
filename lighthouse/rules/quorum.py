"""The quorum rule: given who is alive and who is waiting, form a quorum now or say why not.

``decide_quorum`` is a pure function of a :class:`QuorumView`, the time and the options, so
every rule is tested by building a view and moving ``now`` (tests/lighthouse/test_quorum.py).

The rules, in order (torchft's, study §2.3, with its faults fixed):

1. Candidates are the waiting members, sorted by replica id. With ``shrink_only`` (asked by
   any waiter) new joiners are left out.
2. ``min_replicas`` is a floor on every path, the fast one included: a quorum smaller than the
   user's floor would commit steps the user declared unsafe.
3. Majority guard: the candidates must be more than half of the *healthy* members. Healthy
   means a live session, fresh heartbeats and a training loop that progresses; a member
   that is hung while heartbeating is dropped by the progress deadline (membership.py) and
   so stops counting. torchft counts any heartbeating process, so two groups with one hung
   can never form a quorum again; here the survivor forms one after the deadline. Newcomers
   (processes never in a quorum, e.g. a restarted group still building its model) count
   only once they wait: they hold no committed state a minority could diverge from, and
   counting them stalled the survivor of a two-group job for the newcomer's whole start-up.
4. Fast path: when every surviving member of the previous quorum is waiting, form at once,
   admitting every joiner already waiting at that moment (the step boundary).
5. Slow path: when every healthy member is waiting, form at once; otherwise wait for
   stragglers until ``join_timeout_s`` after the first member of the previous quorum asked
   (the first waiter, when none of them has): a group waiting since before that step ended
   does not shorten the wait for the ones still finishing it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Waiting:
    """A member blocked in the Quorum long poll."""

    since: float
    shrink_only: bool = False


@dataclass(frozen=True, slots=True)
class QuorumView:
    """What the rule needs to know, and nothing else."""

    healthy: frozenset[str]
    """Members with a live session that heartbeat and progress (or wait in a long poll)."""
    waiting: Mapping[str, Waiting]
    previous: tuple[str, ...] | None
    """Members of the last quorum formed in this lighthouse incarnation, if any."""
    newcomers: frozenset[str] = frozenset()
    """Healthy members never in a quorum: the majority guard counts them once they wait."""


@dataclass(frozen=True, slots=True)
class QuorumRules:
    min_replicas: int
    join_timeout_s: float


@dataclass(frozen=True, slots=True)
class QuorumDecision:
    participants: tuple[str, ...] | None
    """Sorted replica ids of the quorum to form now, or None to keep waiting."""
    reason: str
    path: str = "none"
    """"fast", "slow" or "none": which rule decided (shown on the status page)."""

    @property
    def formed(self) -> bool:
        return self.participants is not None


def decide_quorum(view: QuorumView, now: float, rules: QuorumRules) -> QuorumDecision:
    """Decide whether a quorum forms at ``now``; never blocks, never does I/O."""
    waiting = {rid: w for rid, w in view.waiting.items() if rid in view.healthy}
    shrink_only = any(w.shrink_only for w in waiting.values())
    candidates = sorted(waiting)
    if shrink_only and view.previous is not None:
        previous = set(view.previous)
        candidates = [rid for rid in candidates if rid in previous]

    counts = (
        f"[{len(candidates)} waiting of {len(view.healthy)} healthy]"
        f"[min_replicas={rules.min_replicas}][shrink_only={shrink_only}]"
    )
    if not candidates:
        return QuorumDecision(None, f"no member is waiting {counts}")
    if len(candidates) < rules.min_replicas:
        return QuorumDecision(None, f"{len(candidates)} waiting is below min_replicas={rules.min_replicas} {counts}")
    voters = view.healthy - (view.newcomers - waiting.keys())
    if len(candidates) <= len(voters) // 2:
        return QuorumDecision(
            None,
            f"{len(candidates)} waiting is not a majority of {len(voters)} healthy "
            f"members{' (newcomers not waiting aside)' if len(voters) < len(view.healthy) else ''} {counts}",
        )

    if view.previous is not None:
        survivors = [rid for rid in view.previous if rid in view.healthy]
        if survivors and all(rid in waiting for rid in survivors):
            return QuorumDecision(
                tuple(candidates), f"every surviving member of the last quorum joined {counts}", "fast"
            )

    stragglers = sorted(view.healthy - set(waiting))
    if shrink_only and view.previous is not None:
        # Only members that could be candidates are worth waiting for. With no previous
        # quorum (first round, restarted lighthouse) nobody is excluded, so nobody is skipped.
        stragglers = [rid for rid in stragglers if rid in view.previous]
    if not stragglers:
        return QuorumDecision(tuple(candidates), f"every healthy member joined {counts}", "slow")
    # The join timeout runs from the first member of the last quorum to ask: a group that asked
    # earlier (one restarted mid-step, one left out of the last quorum) must not start the clock
    # on stragglers still finishing that step, or a step longer than the timeout leaves one out
    # of every quorum (benchmarks/scale/left_out.py reproduced it: 0.51 of the work kept at 3 groups).
    previous = set(view.previous or ())
    clocked = [rid for rid in candidates if rid in previous] or candidates
    first = min(waiting[rid].since for rid in clocked)
    waited_s = now - first
    if waited_s >= rules.join_timeout_s:
        return QuorumDecision(
            tuple(candidates),
            f"join timeout {rules.join_timeout_s:g}s passed without {_names(stragglers)} {counts}",
            "slow",
        )
    return QuorumDecision(
        None,
        f"waiting for {_names(stragglers)} to join ({waited_s:.2f}s of join_timeout "
        f"{rules.join_timeout_s:g}s) {counts}",
    )


SHOWN_NAMES = 5


def _names(ids: list[str]) -> str:
    """The first few ids and a count: a reason is rebuilt on every join, so it must stay cheap
    when hundreds of members are missing (and short enough to read on the status page)."""
    if len(ids) <= SHOWN_NAMES:
        return str(ids)
    return f"{ids[:SHOWN_NAMES]} and {len(ids) - SHOWN_NAMES} more"
