"""The order gradient buckets are all-reduced in: their index order, on every group.

Collectives across replica groups are matched by the order each group issues them, not by
name: the n-th all-reduce of one group meets the n-th of every other. Launching a bucket as
soon as backward fills it issues them in the order backward happens to fill them, and that
order follows the graph: a data-dependent model (mixture-of-experts routing, a branch taken
on some batches) leaves a different bucket unfilled on each group until backward ends. Two
groups would then pair different buckets: an error when their sizes differ, a silently
wrong average when they match. So a full bucket waits for every bucket before it, as torch's
DDP Reducer does; for the usual model, whose buckets fill in index order (they are built
from the last parameter back), nothing waits.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

B = TypeVar("B")

SECOND_BACKWARD = (
    "a second backward reduced gradients in one step; run every micro-batch but the last under "
    "no_sync(), or call optimizer.zero_grad() between steps"
)
"""Why a bucket cannot be launched twice in one step (both gradient wrappers raise it)."""


def launch_in_order(buckets: Sequence[B], first: int, full: Callable[[B], bool], launch: Callable[[B], None]) -> int:
    """Launch ``buckets[first:]`` in index order up to the first that is not ``full``; returns
    the index of that bucket (``len(buckets)`` once every bucket is launched)."""
    i = first
    while i < len(buckets) and full(buckets[i]):
        launch(buckets[i])
        i += 1
    return i
