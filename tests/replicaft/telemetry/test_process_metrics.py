"""A training process's Prometheus metrics (replicaft/telemetry/metrics.py), derived from its events.

Unit tests feed events to the sink; the integration test scrapes the real HTTP endpoints of a
training process (``REPLICAFT_METRICS_PORT``) and of its lighthouse (the status page's
``/metrics``) and parses them with prometheus-client's parser, as Prometheus would.
"""

from __future__ import annotations

import os
import socket
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from conftest import spawn_python, start_lighthouse
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from support.training_events import EXAMPLE, read_events, wait_for_event

from replicaft.telemetry.events import EventLog
from replicaft.telemetry.metrics import MetricsServer, ProcessMetrics

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def samples(text: str) -> Samples:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def scrape(url: str) -> Samples:
    with urllib.request.urlopen(url, timeout=5.0) as response:
        return samples(response.read().decode())


def value(values: Samples, name: str, **labels: str) -> float:
    return values.get((name, tuple(sorted(labels.items()))), 0.0)


def event(name: str, step: int = 1, **fields: Any) -> dict[str, Any]:
    return {"ts": 0.0, "event": name, "step": step, "quorum_id": 1, "replica_id": "g0", "group_rank": 0, **fields}


def test_events_become_metrics() -> None:
    metrics = ProcessMetrics("g0", 0)
    for e in [
        event("quorum", latency_s=0.02),
        event("commit", step=5, committed=True, step_time_s=0.1),
        event("commit", step=5, committed=False, step_time_s=0.3),
        event("heal_end", ok=True, num_bytes=1000, seconds=0.5),
        event("heal_end", ok=False, error="donor gone"),
        event(
            "checkpoint",
            checkpoint_step=5,
            ok=True,
            status="published",
            num_bytes=4000,
            duration_s=2.0,
            blocked_s=0.01,
            throughput_mb_s=0.002,
            tier="local",
            host_bytes=4096,
            free_bytes=10**9,
        ),
        event(
            "checkpoint",
            checkpoint_step=6,
            ok=False,
            status="refused",
            num_bytes=4000,
            duration_s=0.0,
            blocked_s=None,
            throughput_mb_s=0.0,
            tier="local",
            host_bytes=0,
            free_bytes=10,
        ),
        event("checkpoint_anomaly", checkpoint_step=5, kind="slow_save", reason="...", value=9.0, threshold=3.0),
        event(
            "resume",
            checkpoint_step=5,
            path="/c",
            digest="d",
            duration_s=1.5,
            blocked_s=1.5,
            num_bytes=4000,
            throughput_mb_s=0.003,
            tier="local",
            host_bytes=4000,
        ),
        event("fenced", reason="ignored: no figures"),
    ]:
        metrics.observe(e)
    values = samples(metrics_text(metrics))
    assert value(values, "replicaft_process_info", replica_id="g0", group_rank="0") == 1
    assert value(values, "replicaft_commits_total") == 1 and value(values, "replicaft_aborts_total") == 1
    assert value(values, "replicaft_step") == 5 and value(values, "replicaft_step_seconds_count") == 2
    assert value(values, "replicaft_quorum_seconds_sum") == 0.02
    assert value(values, "replicaft_heals_total", outcome="ok") == 1
    assert value(values, "replicaft_heals_total", outcome="failed") == 1
    assert value(values, "replicaft_heal_bytes_total") == 1000
    assert value(values, "replicaft_checkpoint_saves_total", status="published") == 1
    assert value(values, "replicaft_checkpoint_saves_total", status="refused") == 1
    assert value(values, "replicaft_checkpoint_save_seconds_sum") == 2.0
    assert value(values, "replicaft_checkpoint_saved_bytes_total") == 4000
    assert value(values, "replicaft_checkpoint_blocked_seconds_count", operation="save") == 1
    assert value(values, "replicaft_checkpoint_blocked_seconds_sum", operation="load") == 1.5
    assert value(values, "replicaft_checkpoint_free_bytes") == 10  # the refused save's reading is the newest
    assert value(values, "replicaft_checkpoint_host_bytes") == 4096
    assert value(values, "replicaft_checkpoint_last_step") == 5
    assert value(values, "replicaft_checkpoint_anomalies_total", kind="slow_save") == 1
    assert value(values, "replicaft_checkpoint_loads_total") == 1
    assert value(values, "replicaft_checkpoint_throughput_mb_per_second", operation="load") == 0.003


def metrics_text(metrics: ProcessMetrics) -> str:
    return generate_latest(metrics.registry).decode()


def test_event_log_feeds_its_sink_without_a_directory_and_survives_a_failing_one(tmp_path: Path) -> None:
    seen: list[dict[str, Any]] = []
    EventLog(None, "g0", 0, sink=seen.append).emit("commit", step=3, quorum_id=1, committed=True)
    assert seen and seen[0]["event"] == "commit" and seen[0]["step"] == 3

    def broken(record: dict[str, Any]) -> None:
        raise ValueError("bug in a sink")

    log = EventLog(tmp_path, "g0", 0, sink=broken)
    log.emit("commit", step=4, quorum_id=1, committed=True)
    log.close()
    assert [e["step"] for e in read_events(tmp_path)] == [4]


def test_metrics_server_serves_until_stopped_and_names_the_option_when_the_port_is_taken() -> None:
    metrics = ProcessMetrics("g0", 1)
    server = MetricsServer(metrics.registry, "127.0.0.1", 0)
    url = server.start()
    try:
        assert value(scrape(url), "replicaft_process_info", replica_id="g0", group_rank="1") == 1
        taken = int(url.rsplit(":", 1)[1].split("/")[0])
        with pytest.raises(OSError, match="REPLICAFT_METRICS_PORT"):
            MetricsServer(metrics.registry, "127.0.0.1", taken).start()
    finally:
        server.stop()
    with pytest.raises(OSError):
        scrape(url)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.timeout(120)
def test_training_process_and_lighthouse_serve_metrics_that_match_the_events(tmp_path: Path) -> None:
    lighthouse = start_lighthouse("--min-replicas", "1")
    events = tmp_path / "events"
    env = dict(
        os.environ,
        REPLICAFT_LIGHTHOUSE=lighthouse.grpc_address,
        REPLICAFT_REPLICA_ID="g0",
        REPLICAFT_EVENTS_DIR=str(events),
        REPLICAFT_CHECKPOINT_DIR=str(tmp_path / "ckpt"),
        REPLICAFT_CHECKPOINT_INTERVAL_STEPS="5",
        REPLICAFT_METRICS_PORT=str(free_port()),
    )
    env.pop("REPLICAFT_FAULT_POINTS", None)
    group = spawn_python(EXAMPLE, "--steps", "100000", "--step-delay", "0.01", name="g0", env=env)
    start = wait_for_event(events, lambda e: e["event"] == "start", 60, "start")
    assert start["metrics_url"] == f"http://127.0.0.1:{env['REPLICAFT_METRICS_PORT']}/metrics"
    wait_for_event(
        events,
        lambda e: e["event"] == "checkpoint" and e["ok"] and e["checkpoint_step"] >= 10,
        60,
        "two published checkpoints",
    )

    logged = read_events(events)
    values = scrape(start["metrics_url"])  # after reading the log: the metrics count at least as much
    saves = [e for e in logged if e["event"] == "checkpoint" and e["ok"]]
    commits = [e for e in logged if e["event"] == "commit" and e["committed"]]
    assert value(values, "replicaft_commits_total") >= len(commits) >= 10
    assert value(values, "replicaft_step_seconds_count") >= len(commits)
    assert value(values, "replicaft_quorum_seconds_count") >= 1
    assert value(values, "replicaft_checkpoint_saves_total", status="published") >= len(saves) >= 2
    assert value(values, "replicaft_checkpoint_save_seconds_count") >= len(saves)
    assert value(values, "replicaft_checkpoint_saved_bytes_total") >= sum(e["num_bytes"] for e in saves) > 0
    assert value(values, "replicaft_checkpoint_host_bytes") > 0
    for save in saves:  # every save reports its figures
        assert save["duration_s"] > 0 and save["blocked_s"] >= 0 and save["throughput_mb_s"] > 0, save
        assert save["tier"] == "local" and save["host_bytes"] > 0 and save["free_bytes"] > 0, save

    assert lighthouse.status_url is not None
    served = scrape(lighthouse.status_url + "metrics")
    assert value(served, "replicaft_lighthouse_quorums_formed_total") >= 1
    assert value(served, "replicaft_lighthouse_sessions_open") == 1
    assert value(served, "replicaft_lighthouse_quorum_latency_seconds_count") >= 1
    group.kill()

    # Every group gone: the restarted one loads the newest checkpoint, and says what it cost.
    env["REPLICAFT_METRICS_PORT"] = str(free_port())
    group = spawn_python(EXAMPLE, "--steps", "100000", "--step-delay", "0.01", name="g0", env=env)
    resume = wait_for_event(events, lambda e: e["event"] == "resume", 60, "a resume from disk")
    assert resume["checkpoint_step"] >= 10 and resume["tier"] == "local", resume
    assert resume["duration_s"] > 0 and resume["blocked_s"] == resume["duration_s"], resume
    assert resume["num_bytes"] > 0 and resume["host_bytes"] > 0 and resume["throughput_mb_s"] > 0, resume
    restarted = [e for e in read_events(events) if e["event"] == "start"][-1]
    values = scrape(restarted["metrics_url"])
    assert value(values, "replicaft_checkpoint_loads_total") == 1
    assert value(values, "replicaft_checkpoint_load_seconds_count") == 1
    group.kill()
