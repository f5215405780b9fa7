"""deploy/grafana-dashboard.json queries only metrics the code defines, and shows the main ones.

A renamed metric would otherwise leave an empty panel that nobody notices until the night it
is needed. The defined names come from the registries themselves (replicaft/telemetry/metrics.py and
lighthouse/server/metrics.py), with the sample suffixes Prometheus adds to each type.
"""

from __future__ import annotations

import json
import re

from conftest import REPO_ROOT
from prometheus_client import CollectorRegistry

from lighthouse.server.metrics import Metrics
from replicaft.telemetry.metrics import ProcessMetrics

DASHBOARD = REPO_ROOT / "deploy" / "grafana-dashboard.json"
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"), "gauge": ("",), "info": ("_info",)}


def defined_series(registry: CollectorRegistry) -> set[str]:
    return {family.name + suffix for family in registry.collect() for suffix in SUFFIXES[family.type]}


def dashboard_queries() -> dict[str, list[str]]:
    dashboard = json.loads(DASHBOARD.read_text())
    return {
        panel["title"]: [t["expr"] for t in panel["targets"]] for panel in dashboard["panels"] if panel["type"] != "row"
    }


def test_every_panel_queries_only_defined_metrics() -> None:
    defined = defined_series(ProcessMetrics("g0", 0).registry) | defined_series(Metrics().registry)
    queries = dashboard_queries()
    assert queries
    for title, exprs in queries.items():
        assert exprs, f"panel {title!r} has no query"
        for expr in exprs:
            names = set(re.findall(r"\breplicaft_\w+", expr))
            assert names, f"panel {title!r}: {expr!r} names no replicaft metric"
            assert names <= defined, f"panel {title!r} queries {sorted(names - defined)}, which no registry defines"


def test_dashboard_shows_step_heal_quorum_checkpoint_and_lighthouse_figures() -> None:
    queried = {
        name for exprs in dashboard_queries().values() for e in exprs for name in re.findall(r"\breplicaft_\w+", e)
    }
    for needed in (
        "replicaft_step_seconds_bucket",
        "replicaft_commits_total",
        "replicaft_aborts_total",
        "replicaft_quorum_seconds_bucket",
        "replicaft_heal_bytes_total",
        "replicaft_heal_seconds_sum",
        "replicaft_checkpoint_save_seconds_bucket",
        "replicaft_checkpoint_blocked_seconds_sum",
        "replicaft_checkpoint_saved_bytes_total",
        "replicaft_checkpoint_free_bytes",
        "replicaft_checkpoint_anomalies_total",
        "replicaft_lighthouse_quorums_formed_total",
    ):
        assert needed in queried, f"no panel shows {needed}"
