"""The lighthouse's counters and quorum-latency histogram, exposed through prometheus-client.

The counters stay plain integer fields that the server's handlers bump (``metrics.x += 1``)
on the lighthouse's one event loop, and the status page (status.py) reads as numbers: no
lock, no prometheus-client call on the hot path. A custom collector turns the fields into
metric families when ``/metrics`` is scraped, and prometheus-client writes the exposition
(escaping, ``_total`` suffixes, histogram buckets), which used to be written by hand here.

Each :class:`Metrics` has its own registry, so two lighthouses in one process (the
replicated set's tests) report their own figures, and importing this module registers nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

QUORUM_LATENCY_BUCKETS_S = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0)

_COUNTERS = (
    ("quorums_formed", "quorums_formed", "Quorums formed."),
    ("quorum_ids", "quorum_ids_issued", "Distinct quorum ids issued."),
    ("members_lost", "members_lost", "Members declared lost."),
    ("rejected_requests", "rejected_requests", "Requests rejected as invalid or unauthenticated."),
    (
        "duplicate_replicas_refused",
        "duplicate_replicas_refused",
        "Sessions refused because another live process holds the replica id.",
    ),
    (
        "sessions_ended_not_reading",
        "sessions_ended_not_reading",
        "Sessions ended because the member did not read its stream.",
    ),
    (
        "fences_answered",
        "fences_answered",
        "Fence questions answered: commits of steps that outlasted their commit lease, or asked for none.",
    ),
    ("quorums_standing", "quorums_standing", "Quorums formed standing for further steps (standing.py)."),
    ("standing_ended", "standing_ended", "Standing quorums ended early by a member asking again."),
)
"""(metric name without ``replicaft_lighthouse_`` and ``_total``, field, help)."""


@dataclass
class Metrics:
    quorums_formed: int = 0
    quorum_ids_issued: int = 0
    members_lost: int = 0
    sessions_open: int = 0
    rejected_requests: int = 0
    duplicate_replicas_refused: int = 0
    sessions_ended_not_reading: int = 0
    fences_answered: int = 0
    quorums_standing: int = 0
    standing_ended: int = 0
    registry: CollectorRegistry = field(default_factory=CollectorRegistry, repr=False, compare=False)
    quorum_latency_s: Histogram = field(init=False, repr=False, compare=False)
    """From the first join of a round to the quorum forming."""

    def __post_init__(self) -> None:
        self.quorum_latency_s = Histogram(
            "replicaft_lighthouse_quorum_latency_seconds",
            "From the first join of a round to the quorum forming.",
            buckets=QUORUM_LATENCY_BUCKETS_S,
            registry=self.registry,
        )
        self.registry.register(_FieldCollector(self))

    def render(self) -> str:
        """The Prometheus text exposition (format 0.0.4) of every lighthouse metric."""
        return generate_latest(self.registry).decode()


class _FieldCollector:
    """Reads :class:`Metrics`' integer fields at scrape time."""

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        m = self._metrics
        for name, attribute, help_text in _COUNTERS:
            yield CounterMetricFamily(f"replicaft_lighthouse_{name}", help_text, value=getattr(m, attribute))
        yield GaugeMetricFamily("replicaft_lighthouse_sessions_open", "Open manager sessions.", value=m.sessions_open)
