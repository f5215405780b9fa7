"""The lighthouse's metrics (lighthouse/server/metrics.py), exposed through prometheus-client.

Parsed back with prometheus-client's own parser, so the tests check what a Prometheus
server reads, not the text's layout. The served ``/metrics`` of a real lighthouse process is
scraped in test_process_metrics.py and test_lighthouse_server.py.
"""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from lighthouse.server.metrics import Metrics


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_counters_are_read_from_the_fields_at_render_time() -> None:
    metrics = Metrics(quorums_formed=3, sessions_open=2)
    metrics.members_lost += 1
    values = samples(metrics.render())
    assert values[("replicaft_lighthouse_quorums_formed_total", ())] == 3
    assert values[("replicaft_lighthouse_members_lost_total", ())] == 1
    assert values[("replicaft_lighthouse_sessions_open", ())] == 2
    metrics.quorums_formed += 1
    assert samples(metrics.render())[("replicaft_lighthouse_quorums_formed_total", ())] == 4


def test_histogram_buckets_are_cumulative() -> None:
    metrics = Metrics()
    for value in (0.0005, 0.003, 0.003, 7.0, 60.0):
        metrics.quorum_latency_s.observe(value)
    values = samples(metrics.render())
    name = "replicaft_lighthouse_quorum_latency_seconds"
    assert values[(f"{name}_bucket", (("le", "0.001"),))] == 1
    assert values[(f"{name}_bucket", (("le", "0.005"),))] == 3
    assert values[(f"{name}_bucket", (("le", "10.0"),))] == 4
    assert values[(f"{name}_bucket", (("le", "+Inf"),))] == 5
    assert values[(f"{name}_count", ())] == 5
    assert values[(f"{name}_sum", ())] == 0.0005 + 0.003 + 0.003 + 7.0 + 60.0


def test_value_on_a_bucket_bound_counts_in_that_bucket() -> None:
    metrics = Metrics()
    metrics.quorum_latency_s.observe(0.001)
    assert samples(metrics.render())[("replicaft_lighthouse_quorum_latency_seconds_bucket", (("le", "0.001"),))] == 1


def test_every_metric_has_help_and_type_and_the_names_tests_rely_on() -> None:
    families = {f.name: f for f in text_string_to_metric_families(Metrics().render())}
    assert all(f.documentation and f.type in ("counter", "gauge", "histogram") for f in families.values())
    assert {
        "replicaft_lighthouse_quorums_formed",
        "replicaft_lighthouse_quorum_ids",
        "replicaft_lighthouse_members_lost",
        "replicaft_lighthouse_rejected_requests",
        "replicaft_lighthouse_duplicate_replicas_refused",
        "replicaft_lighthouse_sessions_ended_not_reading",
        "replicaft_lighthouse_sessions_open",
        "replicaft_lighthouse_fences_answered",
        "replicaft_lighthouse_quorum_latency_seconds",
    } <= families.keys()


def test_two_lighthouses_in_one_process_keep_their_own_figures() -> None:
    a, b = Metrics(), Metrics()
    a.quorum_latency_s.observe(1.0)
    assert samples(b.render())[("replicaft_lighthouse_quorum_latency_seconds_count", ())] == 0
