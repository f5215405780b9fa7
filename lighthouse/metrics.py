"""Counters and a latency histogram for the lighthouse, rendered in Prometheus text format."""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

QUORUM_LATENCY_BUCKETS_S = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0)


@dataclass
class Histogram:
    buckets: tuple[float, ...]
    counts: list[int] = field(init=False)
    total: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * len(self.buckets)

    def observe(self, value: float) -> None:
        i = bisect.bisect_left(self.buckets, value)
        if i < len(self.counts):
            self.counts[i] += 1
        self.total += value
        self.count += 1


@dataclass
class Metrics:
    quorums_formed: int = 0
    quorum_ids_issued: int = 0
    members_lost: int = 0
    sessions_open: int = 0
    rejected_requests: int = 0
    duplicate_replicas_refused: int = 0
    sessions_ended_not_reading: int = 0
    quorum_latency_s: Histogram = field(default_factory=lambda: Histogram(QUORUM_LATENCY_BUCKETS_S))
    """From the first join of a round to the quorum forming."""

    def render(self) -> str:
        lines = []

        def metric(name: str, kind: str, help_text: str, value: float) -> None:
            lines.append(f"# HELP replicaft_lighthouse_{name} {help_text}")
            lines.append(f"# TYPE replicaft_lighthouse_{name} {kind}")
            lines.append(f"replicaft_lighthouse_{name} {value}")

        metric("quorums_formed_total", "counter", "Quorums formed.", self.quorums_formed)
        metric("quorum_ids_total", "counter", "Distinct quorum ids issued.", self.quorum_ids_issued)
        metric("members_lost_total", "counter", "Members declared lost.", self.members_lost)
        metric("sessions_open", "gauge", "Open manager sessions.", self.sessions_open)
        metric("rejected_requests_total", "counter", "Requests rejected as invalid or unauthenticated.", self.rejected_requests)
        metric("duplicate_replicas_refused_total", "counter",
               "Sessions refused because another live process holds the replica id.", self.duplicate_replicas_refused)
        metric("sessions_ended_not_reading_total", "counter",
               "Sessions ended because the member did not read its stream.", self.sessions_ended_not_reading)
        h = self.quorum_latency_s
        name = "replicaft_lighthouse_quorum_latency_seconds"
        lines.append(f"# HELP {name} From the first join of a round to the quorum forming.")
        lines.append(f"# TYPE {name} histogram")
        cumulative = 0
        for bound, count in zip(h.buckets, h.counts, strict=True):
            cumulative += count
            lines.append(f'{name}_bucket{{le="{bound}"}} {cumulative}')
        lines.append(f'{name}_bucket{{le="+Inf"}} {h.count}')
        lines.append(f"{name}_sum {h.total}")
        lines.append(f"{name}_count {h.count}")
        return "\n".join(lines) + "\n"
