"""Prometheus metrics of one training process, derived from its structured events.

**One source of truth.** Every figure here is already in an event (events.py): the step's
time and verdict in ``commit``, the quorum's latency in ``quorum``, a heal's bytes and seconds
in ``heal_end``, a checkpoint's cost in ``checkpoint``/``resume``/``checkpoint_anomaly``. So
metrics are not measured a second time: :class:`ProcessMetrics` is an *event sink*
(``EventLog(sink=...)``) that turns each event into counter increments and observations. A
new event field shows up here by one line in :data:`ProcessMetrics` handlers, and a figure
cannot differ between the log and the dashboard. Rejected: ``Counter.inc()`` calls sprinkled
next to each ``emit`` (two places to keep in step, and the manager's code would import
prometheus-client everywhere).

**A registry per process**, not prometheus-client's global one: two managers in one process
(tests, the torchft compatibility suite) keep their own figures, and importing replicaft
registers nothing. :class:`MetricsServer` serves it over HTTP when ``metrics_port`` is set
(``REPLICAFT_METRICS_PORT``; rank r of a group serves on ``metrics_port + r``, so the ranks
torchrun starts on one host do not collide). Prometheus adds ``instance``; the
``replicaft_process_info`` gauge maps an instance to its replica id and group rank.

The metric names are what deploy/grafana-dashboard.json queries; tests/replicaft/telemetry/test_process_metrics.py
checks that every name there is defined here or in lighthouse/server/metrics.py.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

logger = logging.getLogger(__name__)

STEP_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
"""A step is milliseconds (a toy model on CPU) to a minute (a large model's global batch)."""
SAVE_BUCKETS_S = (0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0)
"""A save or load is milliseconds (kilobytes) to an hour (terabytes over a slow link)."""
MB = 1e6


class ProcessMetrics:
    """The metrics of one process; :meth:`observe` is the event sink. Thread-safe (any thread
    that emits may call it; prometheus-client's metrics lock themselves)."""

    def __init__(self, replica_id: str, group_rank: int) -> None:
        r = self.registry = CollectorRegistry()
        Gauge(
            "replicaft_process_info",
            "Always 1; names this process's replica group and rank.",
            ["replica_id", "group_rank"],
            registry=r,
        ).labels(replica_id, str(group_rank)).set(1)
        self.step = Gauge("replicaft_step", "The step this process is at (after its last commit).", registry=r)
        self.step_seconds = Histogram(
            "replicaft_step_seconds", "Wall time of a step, quorum to commit vote.", buckets=STEP_BUCKETS_S, registry=r
        )
        self.commits = Counter("replicaft_commits", "Steps committed.", registry=r)
        self.aborts = Counter("replicaft_aborts", "Steps aborted (not committed), by any cause.", registry=r)
        self.quorum_seconds = Histogram(
            "replicaft_quorum_seconds", "From a quorum request to its answer.", buckets=STEP_BUCKETS_S, registry=r
        )
        self.heals = Counter("replicaft_heals", "Heals finished, by outcome.", ["outcome"], registry=r)
        self.heal_bytes = Counter("replicaft_heal_bytes", "Bytes of state received by heals.", registry=r)
        self.heal_seconds = Histogram(
            "replicaft_heal_seconds", "Duration of a successful heal's transfer.", buckets=SAVE_BUCKETS_S, registry=r
        )
        self.saves = Counter(
            "replicaft_checkpoint_saves", "Checkpoint saves finished, by status.", ["status"], registry=r
        )
        self.save_seconds = Histogram(
            "replicaft_checkpoint_save_seconds", "Duration of a published save.", buckets=SAVE_BUCKETS_S, registry=r
        )
        self.blocked_seconds = Histogram(
            "replicaft_checkpoint_blocked_seconds",
            "Training time blocked by a save (host copy) or a load.",
            ["operation"],
            buckets=STEP_BUCKETS_S,
            registry=r,
        )
        self.saved_bytes = Counter("replicaft_checkpoint_saved_bytes", "Bytes written by published saves.", registry=r)
        self.throughput = Gauge(
            "replicaft_checkpoint_throughput_mb_per_second",
            "Throughput of the last save or load (10**6 bytes per second).",
            ["operation"],
            registry=r,
        )
        self.host_bytes = Gauge(
            "replicaft_checkpoint_host_bytes", "Host memory taken by the last checkpoint snapshot.", registry=r
        )
        self.free_bytes = Gauge(
            "replicaft_checkpoint_free_bytes", "Free bytes of the checkpoint directory after the last save.", registry=r
        )
        self.last_step = Gauge("replicaft_checkpoint_last_step", "Step of the last published checkpoint.", registry=r)
        self.uploads = Counter(
            "replicaft_checkpoint_uploads", "Uploads to the object tier, by outcome.", ["outcome"], registry=r
        )
        self.loads = Counter("replicaft_checkpoint_loads", "Checkpoints loaded (resumes from disk).", registry=r)
        self.load_seconds = Histogram(
            "replicaft_checkpoint_load_seconds", "Duration of a checkpoint load.", buckets=SAVE_BUCKETS_S, registry=r
        )
        self.anomalies = Counter(
            "replicaft_checkpoint_anomalies", "checkpoint_anomaly warnings, by kind.", ["kind"], registry=r
        )
        self._handlers: Mapping[str, Callable[[Mapping[str, Any]], None]] = {
            "commit": self._commit,
            "quorum": self._quorum,
            "heal_end": self._heal_end,
            "checkpoint": self._checkpoint,
            "checkpoint_upload": self._upload,
            "resume": self._resume,
            "checkpoint_anomaly": self._anomaly,
        }

    def observe(self, record: Mapping[str, Any]) -> None:
        """The event sink: update the metrics an event carries figures for; ignore the rest."""
        handler = self._handlers.get(record["event"])
        if handler is not None:
            handler(record)

    def _commit(self, e: Mapping[str, Any]) -> None:
        (self.commits if e.get("committed") else self.aborts).inc()
        self.step.set(e["step"])
        if e.get("step_time_s") is not None:
            self.step_seconds.observe(e["step_time_s"])

    def _quorum(self, e: Mapping[str, Any]) -> None:
        self.quorum_seconds.observe(e["latency_s"])

    def _heal_end(self, e: Mapping[str, Any]) -> None:
        self.heals.labels("ok" if e.get("ok") else "failed").inc()
        if e.get("ok"):
            self.heal_bytes.inc(e.get("num_bytes", 0))
            self.heal_seconds.observe(e.get("seconds", 0.0))

    def _checkpoint(self, e: Mapping[str, Any]) -> None:
        self.saves.labels(e.get("status", "failed")).inc()
        if e.get("free_bytes") is not None:
            self.free_bytes.set(e["free_bytes"])
        if not e.get("ok"):
            return
        self.save_seconds.observe(e.get("duration_s", 0.0))
        if e.get("blocked_s") is not None:
            self.blocked_seconds.labels("save").observe(e["blocked_s"])
        self.saved_bytes.inc(e.get("num_bytes", 0))
        self.throughput.labels("save").set(e.get("throughput_mb_s", 0.0))
        self.host_bytes.set(e.get("host_bytes", 0))
        self.last_step.set(e["checkpoint_step"])

    def _upload(self, e: Mapping[str, Any]) -> None:
        self.uploads.labels("ok" if e.get("ok") else "failed").inc()

    def _resume(self, e: Mapping[str, Any]) -> None:
        self.loads.inc()
        if e.get("duration_s") is not None:
            self.load_seconds.observe(e["duration_s"])
            self.blocked_seconds.labels("load").observe(e["blocked_s"])
            self.throughput.labels("load").set(e["throughput_mb_s"])

    def _anomaly(self, e: Mapping[str, Any]) -> None:
        self.anomalies.labels(e["kind"]).inc()


class MetricsServer:
    """Serves a registry at ``http://host:port/metrics`` on a daemon thread of prometheus-client's.

    ``start`` binds (raising OSError naming the port and the option on failure) and returns
    the URL; ``stop`` shuts the server down and joins its thread. Owned by the manager.
    """

    def __init__(self, registry: CollectorRegistry, host: str, port: int) -> None:
        self._registry = registry
        self._host = host
        self._port = port
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> str:
        try:
            self._server, self._thread = start_http_server(self._port, addr=self._host, registry=self._registry)
        except (OSError, OverflowError) as e:  # OverflowError: metrics_port + group_rank > 65535
            raise OSError(
                f"cannot serve Prometheus metrics on {self._host}:{self._port} ({e}); set "
                "REPLICAFT_METRICS_PORT (metrics_port) to a free port, rank r takes metrics_port + r, "
                "or 0 for no metrics endpoint"
            ) from e
        host = f"[{self._host}]" if ":" in self._host else self._host
        url = f"http://{host}:{self._server.server_port}/metrics"
        logger.info("serving Prometheus metrics at %s", url)
        return url

    def stop(self, timeout_s: float = 5.0) -> None:
        server, thread, self._server, self._thread = self._server, self._thread, None, None
        if server is None or thread is None:
            return
        server.shutdown()
        server.server_close()
        thread.join(timeout_s)
