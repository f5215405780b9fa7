"""How far a heal's fetch has got, for the healer deciding whether to wait for it (heal/healer.py).

The fetch's connections add each chunk once it verified (client.py); the healer's training
thread reads the estimate at the end of a step. The rate is the verified bytes over the time
since the pulling began (the manifest is in, the stripes are dealt), so it includes what the
healer's own work beside the receive costs it: the estimate is of this fetch on this host now.
"""

from __future__ import annotations

import threading
import time


class FetchProgress:
    """Verified bytes of a fetch out of its total; written by its connections, read anywhere."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._total = 0
        self._received = 0
        self._began: float | None = None

    def begin(self, total_bytes: int) -> None:
        """The pulling starts: ``total_bytes`` are to come."""
        with self._lock:
            self._total, self._received, self._began = total_bytes, 0, time.monotonic()

    def add(self, num_bytes: int) -> None:
        """``num_bytes`` more arrived and verified."""
        with self._lock:
            self._received += num_bytes

    @property
    def received_bytes(self) -> int:
        """Bytes verified so far, each counted once: a stripe that failed part-way is taken back."""
        with self._lock:
            return self._received

    def eta_s(self, now: float | None = None) -> float | None:
        """Seconds until the rest has arrived at the rate so far; None before a first chunk."""
        with self._lock:
            total, received, began = self._total, self._received, self._began
        if began is None or received <= 0:
            return None
        elapsed = (time.monotonic() if now is None else now) - began
        return max(0.0, (total - received) * elapsed / received)
