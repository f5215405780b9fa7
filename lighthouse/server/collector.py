"""The garbage collector's thresholds for a long-lived server process (the lighthouse).

CPython frees almost everything a quorum round allocates by reference counting; its cyclic
collector only finds cycles. But it also promotes every container that outlives two young
collections into the oldest generation, and collects that generation (the whole heap) once a
quarter of it is new. At 1,024 members a round keeps ~1,024 waits, requests and stream
operations alive for tens of milliseconds, long enough to be promoted, so full collections
of a heap holding 1,024 sessions came every few rounds: their cost grew with members times
rounds, the lighthouse's one cost found growing faster than its members (issue 24; py-spy
put a fifth of the lighthouse's samples at 1,024 members in the collector, against 6% at 256,
and the benchmark's quorum p50 at 1,024 went from 76 ms to 70 ms without full collections).

So a server process collects its oldest generation only after :data:`FULL_COLLECTION_AFTER`
middle-generation collections instead of 10 (young collections are unchanged, and so is the
quarter-of-the-heap rule): about one full collection per hundred rounds at 1,024 members.
What it costs is memory held by cycles that reached the oldest generation (a closed
session's), for a few minutes longer. Set by the process's entry point, never by the
library: embedding a :class:`LighthouseServer` must not change its host's collector.
"""

from __future__ import annotations

import gc

FULL_COLLECTION_AFTER = 1000
"""Middle-generation collections between two full ones (CPython's default: 10)."""


def tune_for_server() -> None:
    """Make full collections rare in this process; call once, from ``main``."""
    young, middle, _ = gc.get_threshold()
    gc.set_threshold(young, middle, FULL_COLLECTION_AFTER)
