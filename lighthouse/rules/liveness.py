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
checkpoint) shows one heartbeat interval, which 3x the step time would have called hung. What this rule cannot tell
apart is a
live process frozen longer than ``hung_factor`` times anything it did before (a multi-second
stall of its whole interpreter); it is dropped, is fenced, reconnects and heals, which costs
that group a heal and costs the survivors nothing.

Except while it heals: loading gigabytes of received state stalls a healer's interpreter
(0.40 s for 6 GB here, past a 0.39 s adaptive limit), and a healer fenced for it starts its
heal again, to be fenced again by the same stall: it never finishes. So a member that
declares in its heartbeats that it is healing (``Heartbeat.healing``, sent as soon as the flag
changes) gets the ceiling until it declares the heal over. The price: a healer that really
hangs costs the survivors up to ``heartbeat_timeout_s`` instead of its adaptive limit.

The lighthouse's own delays. Every gap is measured when the lighthouse reads a message, so a
lighthouse whose event loop falls behind (1,024 members heartbeating) sees every member fall
silent at once, and dropped 600 live members in a cascade before this was guarded against.
So the limit is extended by an allowance for the lighthouse's own lag: twice the latest its
periodic tick ran over the last few seconds (:class:`LoopLag`). Silence the lighthouse caused
is never taken for the member's.

Pure: times are arguments, so tests/lighthouse/test_liveness.py checks it with a table.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

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


def silence_limit(
    gaps: Iterable[float], num_gaps: int, interval_s: float, rules: LivenessRules, healing: bool = False
) -> Silence:
    """The silence after which a member that declared a heartbeat interval of ``interval_s``
    (0: none) and whose recent gaps were ``gaps`` is hung; ``healing``: it declared that it
    heals (the ceiling)."""
    if healing:
        return Silence(
            rules.heartbeat_timeout_s,
            f"heartbeat_timeout_s={rules.heartbeat_timeout_s:g}, while it "
            "heals (loading a heal's state may stall its interpreter)",
        )
    if interval_s <= 0:
        return Silence(
            rules.heartbeat_timeout_s,
            f"heartbeat_timeout_s={rules.heartbeat_timeout_s:g}, no heartbeat interval declared",
        )
    if num_gaps < rules.min_gaps:
        return Silence(
            rules.heartbeat_timeout_s,
            f"heartbeat_timeout_s={rules.heartbeat_timeout_s:g}, {num_gaps} of {rules.min_gaps} gaps observed",
        )
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
    silent_s: float,
    gaps: Iterable[float],
    num_gaps: int,
    interval_s: float,
    rules: LivenessRules,
    allowance_s: float = 0.0,
) -> Silence | None:
    """The limit ``silent_s`` exceeds (extended by ``allowance_s``, the lighthouse's own lag),
    or None while the member may still be alive.

    Cheap for the common case, called for every member on every tick: a silence below the
    floor needs no look at the gaps.
    """
    if silent_s <= rules.hung_min_s + allowance_s:
        return None
    return beyond_limit(silent_s, silence_limit(gaps, num_gaps, interval_s, rules), allowance_s)


def beyond_limit(silent_s: float, limit: Silence, allowance_s: float = 0.0) -> Silence | None:
    """``limit`` extended by ``allowance_s`` if ``silent_s`` exceeds it, else None. The extended
    limit's reason is written only for a member found hung: the lighthouse asks about every
    quiet member on every tick, and a string per member per tick was most of the tick's cost."""
    if silent_s <= limit.limit_s + allowance_s:
        return None
    if allowance_s > 0:
        return Silence(limit.limit_s + allowance_s, f"{limit.basis}, + {allowance_s:.2f}s for the lighthouse's own lag")
    return limit


HEARTBEAT_BUDGET_PER_S = 2000.0
"""Heartbeats a second the lighthouse plans for, all members together. Measured here: 256
members at 0.1 s (2,560 a second) kept a fifth of a core busy, and 1,024 at 0.1 s saturated
the lighthouse's event loop. So the lighthouse tells its members (in the ``registered`` and
``quorum_formed`` notices) to heartbeat no more often than ``members / budget`` seconds:
0.1 s up to 200 members, 0.5 s at 1,024, and the hung limit grows with it (a hang is
noticed in ~1.5 s at 1,024 members instead of ~0.3 s at 100)."""


def heartbeat_floor_s(num_members: int) -> float:
    """The shortest heartbeat interval the lighthouse asks of ``num_members`` members."""
    return num_members / HEARTBEAT_BUDGET_PER_S


def paced_interval(interval_s: float, num_members: int) -> float:
    """A member's heartbeat interval under the budget; 0 (none declared) stays 0, so the
    member keeps the ceiling (``heartbeat_timeout_s``) as its limit."""
    return max(interval_s, heartbeat_floor_s(num_members)) if interval_s > 0 else 0.0


LAG_WINDOW_S = 3.0
"""How long a late tick of the lighthouse keeps extending every member's limit."""


@dataclass(slots=True)
class LoopLag:
    """How late the lighthouse's periodic tick has run lately: the silence it may have caused."""

    _late: deque[tuple[float, float]] = field(default_factory=deque)
    """(when, how late) of the window's ticks that no later tick was as late as, so their
    lateness decreases from the left: the window's latest is the first. A tick runs 50 times
    a second and nearly every one is a little late; scanning them all at each tick took about a
    tenth of the lighthouse's Python time in the step-overhead benchmark (py-spy)."""

    def observe(self, now: float, due: float) -> None:
        """The tick due at ``due`` ran at ``now``."""
        if now > due:
            late = now - due
            while self._late and self._late[-1][1] <= late:
                self._late.pop()
            self._late.append((now, late))
        while self._late and self._late[0][0] < now - LAG_WINDOW_S:
            self._late.popleft()

    def allowance_s(self) -> float:
        """Twice the latest tick of the window: members' silence it may explain."""
        return 2 * self._late[0][1] if self._late else 0.0
