"""The stripes of a heal still to fetch, shared by the connections that pull them (client.py).

A connection takes its own donor's stripes first, then a failed donor's, then the last stripe
another live donor has not been asked for yet (a fast connection takes over a slow one's
tail); a stripe that failed on a donor is never given to that donor again, and a stripe that
failed on every donor fails the heal.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from replicaft.transfer.manifest import ByteStripe


@dataclass
class StripeTask:
    stripe: ByteStripe
    excluded: set[str] = field(default_factory=set)


class StripeBoard:
    """The stripes still to fetch, shared by the donor workers."""

    def __init__(self, stripes: list[ByteStripe], donors: Sequence[str]) -> None:
        self.pending = [StripeTask(s) for s in stripes]
        self.alive = set(donors)
        self.in_flight = 0
        self.failed: str | None = None
        self.refetched = 0
        self.taken_over = 0
        """Stripes pulled from another donor than the one they were dealt to, that one being alive."""
        self.cond = threading.Condition()

    def take(self, donor: str, deadline: float, *, wait: bool = True) -> StripeTask | None:
        """A stripe for ``donor``: its own, or a dead donor's, or else the last another donor
        has not been asked for yet. None when there is none left for it, or (``wait=False``)
        none right now."""
        with self.cond:
            while True:
                if self.failed is not None or donor not in self.alive:
                    return None
                mine = [t for t in self.pending if donor not in t.excluded]
                task = next((t for t in mine if t.stripe.donor == donor or t.stripe.donor not in self.alive), None)
                if task is None and mine:
                    task = mine[-1]
                    self.taken_over += 1
                if task is not None:
                    self.pending.remove(task)
                    self.in_flight += 1
                    return task
                if not wait or (not self.pending and self.in_flight == 0):
                    return None
                if time.monotonic() >= deadline:
                    return None
                self.cond.wait(0.05)

    def release(self, task: StripeTask) -> None:
        """Give back a stripe taken but not attempted (requested ahead from a donor that failed)."""
        with self.cond:
            self.in_flight -= 1
            self.pending.append(task)
            self.cond.notify_all()

    def finish(self, task: StripeTask, ok: bool, donor: str, why: str = "") -> None:
        with self.cond:
            self.in_flight -= 1
            if not ok:
                self.alive.discard(donor)
                task.excluded.add(donor)
                self.refetched += 1
                if not (self.alive - task.excluded):
                    self.failed = f"bytes {task.stripe.start}..{task.stripe.stop} failed on every donor (last: {why})"
                else:
                    self.pending.append(task)
            self.cond.notify_all()
