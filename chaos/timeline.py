"""The committed steps of a run, as typed records, out of the groups' raw JSON events.

Every check and figure of the harness is a question about when which group committed which
step; this module answers "what are the commits" once, so the invariants, the figures and the
report read the same list. Pure: it takes event dicts (``replicaft/telemetry/events.py`` schema) in the
order each rank wrote them, and does no I/O.

An *incarnation* is one process lifetime of a rank: a ``start`` event opens a new one. A
restarted group keeps its replica id (and its event file), so incarnations are how a
restart is told apart from a step going backwards inside one process.

An *epoch* is a stretch of the job between two moments when every group was killed at once
(``kill_all_groups``, ``corrupt_checkpoint``): the job then resumes from a checkpoint, below
its old frontier, and redoes the steps since. That is a sanctioned rollback, so the checks
compare steps within an epoch, and across epochs only through the resume. Every process
dies at an epoch's start, so an event's epoch is simply which of those moments precede it.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

Event = Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Commit:
    """One ``commit`` event with ``committed: true``: ``step`` is the step count after it."""

    ts: float
    group: str
    rank: int
    step: int
    quorum_id: int
    incarnation: int
    """1 for the rank's first process, 2 after its first restart, ... (0: no ``start`` seen)."""
    num_contributors: int
    step_time_s: float
    """From asking for the step's quorum to committing (``replicaft`` measures it per attempt)."""
    quorum_wait_s: float
    """``latency_s`` of the quorum this attempt ran in: how long forming it took."""
    epoch: int = 0
    """0 until the first time every group was killed, then 1, ... (see the module docstring)."""


def stream_key(event: Event) -> tuple[str, int]:
    """The (replica id, group rank) a single event file belongs to."""
    return str(event["replica_id"]), int(event["group_rank"])


def epoch_of(ts: float, epoch_starts: Sequence[float]) -> int:
    """How many of the (sorted) moments every group was killed lie at or before ``ts``."""
    return bisect_right(epoch_starts, ts)


def commits(events: Iterable[Event], epoch_starts: Sequence[float] = ()) -> list[Commit]:
    """Every committed step, in input order, each tagged with its rank's incarnation and its epoch.

    ``events`` must keep each rank's own order (the order of its file); ranks may be
    interleaved in any way. ``epoch_starts``: sorted times every group was killed at once.
    """
    incarnation: dict[tuple[str, int], int] = {}
    quorum_wait: dict[tuple[str, int], float] = {}
    out = []
    for e in events:
        key = stream_key(e)
        if e["event"] == "start":
            incarnation[key] = incarnation.get(key, 0) + 1
            quorum_wait.pop(key, None)
        elif e["event"] == "quorum":
            quorum_wait[key] = float(e.get("latency_s", 0.0))
        elif e["event"] == "commit" and e.get("committed"):
            out.append(
                Commit(
                    ts=float(e["ts"]),
                    group=key[0],
                    rank=key[1],
                    step=int(e["step"]),
                    quorum_id=int(e["quorum_id"]),
                    incarnation=incarnation.get(key, 0),
                    num_contributors=int(e.get("num_contributors", 0)),
                    step_time_s=float(e.get("step_time_s", 0.0)),
                    quorum_wait_s=quorum_wait.get(key, 0.0),
                    epoch=epoch_of(float(e["ts"]), epoch_starts),
                )
            )
    return out


def frontier(all_commits: Sequence[Commit], until_ts: float) -> int:
    """The job's highest committed step at ``until_ts`` (0 before any commit)."""
    return max((c.step for c in all_commits if c.ts <= until_ts), default=0)


def next_commit(
    all_commits: Sequence[Commit],
    after_ts: float,
    *,
    group: str | None = None,
    exclude: str | None = None,
    above_step: int = -1,
) -> Commit | None:
    """The first commit strictly after ``after_ts`` of a step above ``above_step``, optionally
    only by ``group`` or by anyone but ``exclude``."""
    candidates = [
        c
        for c in all_commits
        if c.ts > after_ts
        and c.step > above_step
        and (group is None or c.group == group)
        and (exclude is None or c.group != exclude)
    ]
    return min(candidates, key=lambda c: c.ts, default=None)
