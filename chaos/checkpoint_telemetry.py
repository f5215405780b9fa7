"""What a run's checkpoints did, for ``summary.json`` and the report: the cadence chosen, the saves' figures. Pure.

Read from the groups' events (replicaft/telemetry/events.py): ``checkpoint_cadence`` (each interval
``checkpoint_interval="auto"`` chose, and why), ``checkpoint`` (each save's outcome and the
figures of checkpoint/telemetry.py) and ``checkpoint_anomaly`` (a save that was slow, a disk
filling up). A run without them gets zero counts and ``None`` figures, never a missing key.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from chaos.timeline import Event

CADENCE_FIELDS = ("interval_s", "cost_s", "mtbf_s", "mtbf_source", "reason")
"""The fields of a ``checkpoint_cadence`` event a reader needs to follow a decision."""


def _of(events: Sequence[Event], kind: str) -> list[Event]:
    return sorted((e for e in events if e.get("event") == kind), key=lambda e: e["ts"])


def cadence_decisions(events: Sequence[Event], started_ts: float) -> dict[str, Any]:
    """How many intervals ``auto`` chose, and the last choice (when, by whom, the figures behind it)."""
    chosen = _of(events, "checkpoint_cadence")
    last = None
    if chosen:
        e = chosen[-1]
        last = {
            "group": e["replica_id"],
            "at_s": round(e["ts"] - started_ts, 3),
            "step": e.get("step"),
            **{k: e.get(k) for k in CADENCE_FIELDS},
        }
    intervals = {round(float(e["interval_s"]), 3) for e in chosen if e.get("interval_s") is not None}
    return {"count": len(chosen), "intervals_s": sorted(intervals), "last": last}


def _median(values: Sequence[Any]) -> float | None:
    numbers = [float(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
    return round(statistics.median(numbers), 4) if numbers else None


def save_telemetry(events: Sequence[Event]) -> dict[str, Any]:
    """The saves: how many of each status, the median figures of the published ones, and every anomaly."""
    saves = _of(events, "checkpoint")
    published = [e for e in saves if e.get("ok")]
    statuses: dict[str, int] = {}
    for e in saves:
        status = str(e.get("status") or ("published" if e.get("ok") else "failed"))
        statuses[status] = statuses.get(status, 0) + 1
    return {
        "count": len(saves),
        "published": len(published),
        "statuses": dict(sorted(statuses.items())),
        "median_duration_s": _median([e.get("duration_s") for e in published]),
        "median_blocked_s": _median([e.get("blocked_s") for e in published]),
        "median_throughput_mb_s": _median([e.get("throughput_mb_s") for e in published]),
        "anomalies": [
            {
                "group": e["replica_id"],
                "checkpoint_step": e.get("checkpoint_step"),
                "kind": e.get("kind"),
                "reason": e.get("reason"),
            }
            for e in _of(events, "checkpoint_anomaly")
        ],
    }
