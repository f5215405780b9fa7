"""Prometheus rendering of the lighthouse's counters (lighthouse/metrics.py)."""

from __future__ import annotations

from lighthouse.metrics import Histogram, Metrics


def test_histogram_buckets_are_cumulative_in_rendering() -> None:
    metrics = Metrics(quorums_formed=3, members_lost=1, sessions_open=2)
    for value in (0.0005, 0.003, 0.003, 7.0, 60.0):
        metrics.quorum_latency_s.observe(value)
    lines = dict(line.rsplit(" ", 1) for line in metrics.render().splitlines() if not line.startswith("#"))
    name = "replicaft_lighthouse_quorum_latency_seconds"
    assert lines[f'{name}_bucket{{le="0.001"}}'] == "1"
    assert lines[f'{name}_bucket{{le="0.005"}}'] == "3"
    assert lines[f'{name}_bucket{{le="10.0"}}'] == "4"
    assert lines[f'{name}_bucket{{le="+Inf"}}'] == "5"
    assert lines[f"{name}_count"] == "5"
    assert float(lines[f"{name}_sum"]) == 0.0005 + 0.003 + 0.003 + 7.0 + 60.0
    assert lines["replicaft_lighthouse_quorums_formed_total"] == "3"
    assert lines["replicaft_lighthouse_sessions_open"] == "2"


def test_value_on_a_bucket_bound_counts_in_that_bucket() -> None:
    h = Histogram((1.0, 2.0))
    h.observe(1.0)
    assert h.counts == [1, 0]


def test_every_metric_has_help_and_type() -> None:
    text = Metrics().render()
    names = {line.split()[0].removesuffix("_count").removesuffix("_sum").split("_bucket")[0]
             for line in text.splitlines() if not line.startswith("#")}
    for name in names:
        assert f"# HELP {name} " in text and f"# TYPE {name} " in text
