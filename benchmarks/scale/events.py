"""The virtual clock: a queue of timed callbacks, run in time order.

Time is a float of seconds since the job started and moves only when the next event is taken,
so a simulated hour of a 2,048-group job runs in as long as its events take to compute. Events
at the same time run in the order they were scheduled (a sequence number breaks ties), which
makes every run of one seed identical. An event is cancelled by bumping a token it checks, not
by removing it from the heap (removal is O(n); a stale event costs one comparison).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Any


class EventQueue:
    def __init__(self) -> None:
        self.now = 0.0
        self._heap: list[tuple[float, int, Callable[..., None], tuple[Any, ...]]] = []
        self._seq = 0

    def at(self, when: float, callback: Callable[..., None], *args: Any) -> None:
        """Run ``callback(*args)`` at ``when`` (not before now)."""
        self._seq += 1
        heapq.heappush(self._heap, (max(when, self.now), self._seq, callback, args))

    def next_time(self) -> float | None:
        return self._heap[0][0] if self._heap else None

    def run_next(self) -> None:
        """Take the earliest event, move the clock to it and run it."""
        when, _, callback, args = heapq.heappop(self._heap)
        self.now = when
        callback(*args)

    def __len__(self) -> int:
        return len(self._heap)
