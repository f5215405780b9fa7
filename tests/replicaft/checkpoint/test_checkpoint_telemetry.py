"""Checkpoint anomalies (replicaft/checkpoint/telemetry.py): table tests over save histories."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from replicaft.checkpoint.results import SaveResult
from replicaft.checkpoint.telemetry import (
    CheckpointTelemetry,
    SaveRecord,
    detect_anomalies,
    load_fields,
    save_fields,
)

GB = 10**9


def saves(
    durations: list[float],
    *,
    every_s: float = 60.0,
    num_bytes: int = GB,
    free: list[int] | None = None,
    pending: list[int] | None = None,
    lag: list[float] | None = None,
) -> list[SaveRecord]:
    n = len(durations)
    return [
        SaveRecord(
            step=100 * (i + 1),
            finished_at=every_s * (i + 1),
            duration_s=durations[i],
            num_bytes=num_bytes,
            free_bytes=free[i] if free else None,
            uploads_pending=pending[i] if pending else 0,
            upload_lag_s=lag[i] if lag else 0.0,
        )
        for i in range(n)
    ]


CASES = [
    # (name, history, expected anomaly kinds)
    ("no saves", [], []),
    ("steady saves", saves([10, 11, 9, 10]), []),
    ("slow save after three", saves([10, 11, 9, 31]), ["slow_save"]),
    ("exactly 3x the median is not slow", saves([10, 10, 10, 30]), []),
    ("slow save after only two is not judged", saves([10, 10, 100]), []),
    ("one old outlier does not hide a slow save", saves([10, 500, 10, 10, 40]), ["slow_save"]),
    ("free space steady", saves([10] * 4, free=[50 * GB] * 4), []),
    ("free space falling but far from zero", saves([10] * 4, free=[50 * GB, 49 * GB, 48 * GB, 47 * GB]), []),
    (
        "free space hits zero before the next save",
        saves([10] * 3, free=[5 * GB, 3 * GB, GB + GB // 2]),
        ["disk_filling"],
    ),
    ("two free readings are not a trend", saves([10] * 2, free=[3 * GB, GB]), []),
    ("free space growing", saves([10] * 3, free=[GB, 2 * GB, 3 * GB]), []),
    ("uploads keep up", saves([10] * 4, pending=[1, 1, 1, 1], lag=[0, 0, 0, 0]), []),
    ("pending uploads grow", saves([10] * 4, pending=[1, 1, 2, 3], lag=[0, 0, 30, 50]), ["tier_behind"]),
    ("upload lag beyond the interval", saves([10] * 3, pending=[1, 2, 2], lag=[0, 30, 61]), ["tier_behind"]),
    ("upload lag within the interval", saves([10] * 3, pending=[1, 2, 2], lag=[0, 30, 59]), []),
    (
        "everything at once",
        saves([10, 10, 10, 40], free=[9 * GB, 6 * GB, 4 * GB, 2 * GB], pending=[0, 1, 2, 3]),
        ["slow_save", "disk_filling", "tier_behind"],
    ),
]


@pytest.mark.parametrize(("history", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_anomalies_of_the_newest_save(history: list[SaveRecord], expected: list[str]) -> None:
    found = detect_anomalies(history)
    assert [a.kind for a in found] == expected, [a.reason for a in found]
    for a in found:
        assert f"{history[-1].step}" in a.reason or a.kind != "slow_save"


def test_slow_save_reason_names_the_median_and_the_factor() -> None:
    (anomaly,) = detect_anomalies(saves([10, 11, 9, 31]))
    assert "31s" in anomaly.reason and "median 10s" in anomaly.reason and "3x" in anomaly.reason
    assert (anomaly.value, anomaly.threshold) == (31, 30)


def test_save_fields_report_throughput_tier_and_host_bytes() -> None:
    result = SaveResult(
        7, "published", "ok", Path("/c/step-7"), num_bytes=200 * 10**6, seconds=2.0, tier2_path=Path("/t2/step-7")
    )
    fields = save_fields(result, blocked_s=0.25, host_bytes=123)
    assert fields == {
        "duration_s": 2.0,
        "blocked_s": 0.25,
        "throughput_mb_s": 100.0,
        "tier": "local+tier2",
        "host_bytes": 123,
    }


def test_load_fields_count_the_loaded_tensors(tmp_path: Path) -> None:
    state = {
        "model": {"w": torch.zeros(250, dtype=torch.float32)},
        "step": 3,
        "opt": [torch.zeros(250, dtype=torch.uint8)],
    }
    fields = load_fields(state, tmp_path / "t2" / "step-3", str(tmp_path / "t2"), duration_s=0.5)
    assert fields["num_bytes"] == 1250 and fields["host_bytes"] == 1250 and fields["tier"] == "tier2"
    assert fields["throughput_mb_s"] == 0.003 and fields["blocked_s"] == 0.5


def test_telemetry_shell_reports_a_slow_save_and_tracks_uploads(tmp_path: Path) -> None:
    telemetry = CheckpointTelemetry(str(tmp_path), has_object_tier=True)
    for i, seconds in enumerate([1.0, 1.0, 1.0, 5.0]):
        step = 10 * (i + 1)
        telemetry.started(step, host_bytes=4096)
        fields, anomalies = telemetry.finished(
            SaveResult(step, "published", "ok", num_bytes=100, seconds=seconds), blocked_s=0.01, now=60.0 * (i + 1)
        )
        telemetry.uploaded(step)
        assert fields["host_bytes"] == 4096 and isinstance(fields["free_bytes"], int)
    assert [a.kind for a in anomalies] == ["slow_save"]


def test_telemetry_shell_sees_uploads_fall_behind(tmp_path: Path) -> None:
    telemetry = CheckpointTelemetry(str(tmp_path), has_object_tier=True)
    kinds = []
    for i in range(3):  # nothing is ever uploaded
        _, anomalies = telemetry.finished(SaveResult(i, "published", "ok", num_bytes=1, seconds=1.0), 0.0, now=10.0 * i)
        kinds.append([a.kind for a in anomalies])
    assert kinds == [[], [], ["tier_behind"]]


def test_failed_save_is_reported_but_not_judged(tmp_path: Path) -> None:
    telemetry = CheckpointTelemetry(None, has_object_tier=False)
    fields, anomalies = telemetry.finished(SaveResult(1, "failed", "ENOSPC"), None, now=1.0)
    assert anomalies == () and fields["free_bytes"] is None and fields["blocked_s"] is None


def test_persistence_reports_figures_for_published_and_refused_saves(tmp_path: Path) -> None:
    from replicaft.config.options import ManagerOptions
    from replicaft.persistence.duties import Persistence
    from replicaft.transfer.spare import SpareBuffer

    events: list[tuple[str, dict[str, Any]]] = []
    options = ManagerOptions(
        lighthouse="127.0.0.1:1", replica_id="g0", checkpoint_dir=str(tmp_path / "ckpt"), checkpoint_interval_steps=1
    )
    persistence = Persistence(options, lambda event, **fields: events.append((event, fields)), SpareBuffer())
    state = {"w": torch.zeros(1 << 20)}  # 4 MiB: copied behind the next step (BackgroundCapture)
    persistence.start()
    try:
        persistence.after_commit(1, is_writer=True, state=lambda: state, quorum_id=1)  # the interval starts here
        persistence.after_commit(2, is_writer=True, state=lambda: state, quorum_id=1)
        state["w"].add_(1.0)  # the next step writes the state before the copy was settled: refused
        persistence.settle()
        for earlier in range(3):  # three saves before it took a microsecond each: step 3's is slow
            persistence.telemetry.finished(SaveResult(earlier - 10, "published", "ok", seconds=1e-6), 0.0, now=earlier)
        persistence.after_commit(3, is_writer=True, state=lambda: state, quorum_id=1)
        persistence.settle()
    finally:
        persistence.close()
    saves = {f["checkpoint_step"]: f for e, f in events if e == "checkpoint"}
    assert saves[2]["status"] == "failed" and saves[2]["blocked_s"] >= 0 and saves[2]["host_bytes"] == 4 << 20
    assert saves[3]["status"] == "published", saves[3]
    assert saves[3]["duration_s"] > 0 and saves[3]["throughput_mb_s"] > 0 and saves[3]["tier"] == "local"
    assert saves[3]["host_bytes"] >= 4 << 20 and saves[3]["free_bytes"] > 0
    anomalies = [f for e, f in events if e == "checkpoint_anomaly"]
    assert [(f["checkpoint_step"], f["kind"]) for f in anomalies] == [(3, "slow_save")], anomalies
    starts = [f for e, f in events if e == "checkpoint_start"]
    assert [f["host_bytes"] >= 4 << 20 for f in starts] == [True, True]
