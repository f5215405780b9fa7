"""When a member's silence means it is hung: a limit adapted to how often it speaks.

What the lighthouse can observe. A member's session carries a quorum request every step and,
when the stream has been quiet for the client's heartbeat interval, a heartbeat; the
heartbeats come from the client's own event-loop thread, not the training loop, so a slow
step (a long forward pass) does not delay them. A SIGSTOPped process (or a frozen host)
sends nothing at all while its TCP connection stays open, so its session falls *silent*;
the survivors meanwhile wait for it in the step's all-reduce or at the next quorum. A
process that is alive but stuck in its training loop keeps heartbeating: that is the
progress deadline's case (membership.py), not this one.

The rule. A live member's longest gap between two messages is bounded by the heartbeat
interval it declared when it registered (its client heartbeats whenever the stream has been
quiet that long; faster steps only shorten the gaps), plus scheduling jitter, which the
lighthouse observes as the gaps it sees. So a member is hung once it has been silent longer
than the longest silence it showed recently plus ``hung_factor - 1`` more heartbeat
intervals (two missed heartbeats by default), and never less than ``hung_factor`` intervals:

    clamp(max(longest of its last GAP_WINDOW gaps, interval) + (hung_factor - 1) x interval,
          hung_min_s, heartbeat_timeout_s)

and a member that declared no interval, or with fewer than ``min_gaps`` observed gaps (just
registered), gets the ceiling, ``heartbeat_timeout_s``, the old fixed limit. A fixed timeout
must cover the slowest cadence and the worst jitter of every job (2 s by default, which cost
survivors 2.64 s per SIGSTOP in the demo); the adaptive limit follows each member: with the
managers' 0.1 s heartbeats it is 0.3 s on a quiet machine, 0.45 s where scheduling delayed
one heartbeat by 0.15 s. (Multiplying the longest gap instead, 3 x 0.25 s, made 0.75 s of
such a delay: jitter was paid for three times.) A slow-but-alive member is not dropped: slow steps
do not lengthen its gaps (heartbeats fill them), and a member whose gaps do grow (a loaded
machine starving its loop thread) raises its own limit within a window. Observed gaps alone
would not do: a member stepping every 50 ms shows 50 ms gaps, then a slower step (a heal, a
checkpoint) shows one heartbeat interval, which 3x the step time would have called hung. What this rule cannot tell apart is a
live process frozen longer than ``hung_factor`` times anything it did before (a multi-second
stall of its whole interpreter); it is dropped, is fenced, reconnects and heals, which costs
that group a heal and costs the survivors nothing.

Pure: times are arguments, so tests/test_liveness.py checks it with a table.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

GAP_WINDOW = 32
"""Gaps remembered per member: about 3 s of 0.1 s heartbeats, long enough to include a
periodic stall (a garbage collection, a checkpoint snapshot) in the member's own limit."""


@dataclass(frozen=True, slots=True)
class LivenessRules:
    heartbeat_timeout_s: float
    """The ceiling: silence after which any member is lost, whatever its cadence."""
    hung_factor: float = 3.0
    """Silence of the member's longest gap plus ``hung_factor - 1`` heartbeat intervals means hung."""
    hung_min_s: float = 0.25
    """The floor: no member is declared hung on a shorter silence."""
    min_gaps: int = 8
    """Gaps to observe before the adaptive limit applies; until then, the ceiling."""


@dataclass(frozen=True, slots=True)
class Silence:
    """How long a member may stay silent, and why that long (for the loss reason)."""

    limit_s: float
    basis: str


def silence_limit(gaps: Iterable[float], num_gaps: int, interval_s: float, rules: LivenessRules) -> Silence:
    """The silence after which a member that declared a heartbeat interval of ``interval_s``
    (0: none) and whose recent gaps were ``gaps`` is hung."""
    if interval_s <= 0:
        return Silence(rules.heartbeat_timeout_s, f"heartbeat_timeout_s={rules.heartbeat_timeout_s:g}, "
                                                  "no heartbeat interval declared")
    if num_gaps < rules.min_gaps:
        return Silence(rules.heartbeat_timeout_s, f"heartbeat_timeout_s={rules.heartbeat_timeout_s:g}, "
                                                  f"{num_gaps} of {rules.min_gaps} gaps observed")
    longest = max(interval_s, max(gaps))
    missed = rules.hung_factor - 1
    adaptive = longest + missed * interval_s
    rule = f"its longest gap {longest:.3f}s + {missed:g} heartbeat intervals of {interval_s:g}s"
    if adaptive >= rules.heartbeat_timeout_s:
        return Silence(rules.heartbeat_timeout_s, f"heartbeat_timeout_s={rules.heartbeat_timeout_s:g}, below {rule}")
    if adaptive <= rules.hung_min_s:
        return Silence(rules.hung_min_s, f"hung_min_s={rules.hung_min_s:g}, above {rule}")
    return Silence(adaptive, rule)


def is_silent_too_long(
    silent_s: float, gaps: Iterable[float], num_gaps: int, interval_s: float, rules: LivenessRules
) -> Silence | None:
    """The limit ``silent_s`` exceeds, or None while the member may still be alive.

    Cheap for the common case, called for every member on every tick: a silence below the
    floor needs no look at the gaps.
    """
    if silent_s <= rules.hung_min_s:
        return None
    limit = silence_limit(gaps, num_gaps, interval_s, rules)
    return limit if silent_s > limit.limit_s else None
