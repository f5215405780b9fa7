"""Exactly-once data for semi-synchronous training: each group leases its next round of samples.

In DDP a step's samples are split after its quorum (replicaft.data). In DiLoCo a group trains
a whole round (the inner steps between two syncs) before the sync that commits it, so its
samples must be decided before the round: at each committed sync every participant is handed
a *lease*, the next ``per_group`` positions of the global sample order, in participant order.
At the next committed sync the leases of the groups that contributed a pseudo-gradient are
consumed; those of groups that did not (they died, fell behind, or healed) go back to a pool
that the next leases draw from first. So across any failures every position below the cursor
is either consumed by exactly one committed sync or waiting in the pool, never both, never
twice. The rejected alternative, torchft's per-group shards, silently drops a dead group's
batches and retrains nothing in its place.

Pure: a :class:`Leases` value in, a new one out; the owner (DiLoCo) keeps it in the
replicated state, so it travels with a heal and every group computes the same next value.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

Range = tuple[int, int]
"""Positions [start, stop) of the global sample order (replicaft.data.sample_ids)."""


@dataclass(frozen=True, slots=True)
class Leases:
    cursor: int = 0
    """The first position never leased."""
    pool: tuple[Range, ...] = ()
    """Positions leased to groups whose round was not committed, to be leased again first."""
    held: Mapping[str, tuple[Range, ...]] = field(default_factory=dict)
    """Each participant's lease for the round in progress, by replica id."""

    def open_ranges(self) -> list[Range]:
        """Positions leased but not consumed yet (pool and leases held), merged."""
        return _merge([*self.pool, *(r for ranges in self.held.values() for r in ranges)])

    def to_state(self) -> dict[str, Any]:
        return {
            "cursor": self.cursor,
            "pool": [list(r) for r in self.pool],
            "held": [[rid, [list(r) for r in ranges]] for rid, ranges in self.held.items()],
        }

    @staticmethod
    def from_state(state: Mapping[str, Any]) -> Leases:
        return Leases(
            int(state["cursor"]),
            tuple((int(a), int(b)) for a, b in state["pool"]),
            {str(rid): tuple((int(a), int(b)) for a, b in ranges) for rid, ranges in state["held"]},
        )


def settle(
    leases: Leases, participants: Sequence[str], contributors: Collection[str], per_group: int
) -> tuple[Leases, tuple[Range, ...]]:
    """A sync committed: consume the contributors' leases, lease the next round to ``participants``.

    Returns the new leases and the consumed ranges (sorted, for the commit event).
    """
    if per_group < 0:
        raise ValueError(f"per_group={per_group}; a lease cannot be negative")
    consumed: list[Range] = []
    returned: list[Range] = list(leases.pool)
    for rid, ranges in leases.held.items():
        (consumed if rid in contributors else returned).extend(ranges)
    pool = _merge(returned)
    cursor = leases.cursor
    held: dict[str, tuple[Range, ...]] = {}
    for rid in participants:
        lease, pool, cursor = _take(pool, cursor, per_group)
        held[rid] = lease
    return Leases(cursor, pool, held), tuple(_merge(consumed))


def positions(lease: Sequence[Range], start: int, count: int) -> list[int]:
    """Positions ``start .. start + count`` of a lease, counted across its ranges."""
    out: list[int] = []
    skip = start
    for a, b in lease:
        if skip >= b - a:
            skip -= b - a
            continue
        take = min(count - len(out), b - a - skip)
        out.extend(range(a + skip, a + skip + take))
        skip = 0
        if len(out) == count:
            break
    return out


def _take(pool: tuple[Range, ...], cursor: int, n: int) -> tuple[tuple[Range, ...], tuple[Range, ...], int]:
    lease: list[Range] = []
    rest = list(pool)
    while n > 0 and rest:
        a, b = rest.pop(0)
        take = min(n, b - a)
        lease.append((a, a + take))
        if a + take < b:
            rest.insert(0, (a + take, b))
        n -= take
    if n > 0:
        lease.append((cursor, cursor + n))
        cursor += n
    return tuple(_merge(lease)), tuple(rest), cursor


def _merge(ranges: Sequence[Range]) -> list[Range]:
    out: list[Range] = []
    for a, b in sorted(r for r in ranges if r[1] > r[0]):
        if out and a <= out[-1][1]:
            if a < out[-1][1]:
                raise ValueError(f"ranges overlap: {out[-1]} and {(a, b)}; a position was leased twice")
            out[-1] = (out[-1][0], b)
        else:
            out.append((a, b))
    return out
