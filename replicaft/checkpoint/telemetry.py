"""Checkpoint telemetry: what each save and load cost, and which saves look wrong.

Every save and load event carries the same figures (:func:`save_fields`, :func:`load_fields`):
``duration_s`` (the whole save, on the writer thread; for a load, the load), ``blocked_s``
(what the training thread waited for: the host copy, or the whole load), ``num_bytes``,
``throughput_mb_s`` (``num_bytes`` over ``duration_s``, in 10**6 bytes per second),
``tier`` (where it was written or read) and ``host_bytes`` (host memory the snapshot took).

Three things are *anomalies*, reported as ``checkpoint_anomaly`` warning events rather than
left for someone to notice on a dashboard after the disk is full:

* ``slow_save``: a save took more than ``SLOW_SAVE_FACTOR`` times the median of the previous
  saves (at least ``MIN_SAVES_FOR_MEDIAN`` of them; fewer say nothing about "normal").
* ``disk_filling``: a least-squares line through the free bytes seen after the last saves,
  projected to the next save (the last one plus the median gap between saves), leaves less
  than that save needs (the last save's size): free space trends to zero before then.
* ``tier_behind``: the object tier's uploads fall behind the saves: the oldest pending
  upload waited longer than the interval between saves, or the number of pending uploads
  grew across the last ``PENDING_GROWTH_SAVES`` saves.

:func:`detect_anomalies` is a pure function of the history (time is a field of each record,
so tests build a history and call it); :class:`CheckpointTelemetry` is the thin shell the
persistence duties call: it keeps the history, reads free space and tracks uploads.
Rejected: alerting rules only in Prometheus. The event log is what the chaos checker and the
benchmarks read, and a job without a Prometheus server must still say its disk is filling.
"""

from __future__ import annotations

import shutil
import statistics
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch

from replicaft.checkpoint.results import SaveResult

SLOW_SAVE_FACTOR = 3.0
MIN_SAVES_FOR_MEDIAN = 3
"""Two previous saves make a median of a pair; three is the fewest that outvotes one outlier."""
FREE_SPACE_FIT_SAVES = 3
"""Free-space readings the line is fitted through (at least; up to ``HISTORY_SAVES``)."""
PENDING_GROWTH_SAVES = 3
HISTORY_SAVES = 20
"""Saves kept: enough for a stable median, short enough to follow a change of regime."""

AnomalyKind = Literal["slow_save", "disk_filling", "tier_behind"]


@dataclass(frozen=True, slots=True)
class SaveRecord:
    """One published save, as the anomaly rules see it. Times are monotonic seconds."""

    step: int
    finished_at: float
    duration_s: float
    num_bytes: int
    free_bytes: int | None = None
    """Free bytes of the checkpoint directory after this save (None: not measured)."""
    uploads_pending: int = 0
    """Object-tier uploads queued or running after this save (0 without an object tier)."""
    upload_lag_s: float = 0.0
    """How long the oldest pending upload has waited since its checkpoint was published."""


@dataclass(frozen=True, slots=True)
class Anomaly:
    kind: AnomalyKind
    reason: str
    """What was seen, with the numbers behind it and what to do."""
    value: float
    threshold: float


def detect_anomalies(history: Sequence[SaveRecord]) -> tuple[Anomaly, ...]:
    """The anomalies of the newest save (``history[-1]``), judged against the saves before it.

    ``history`` is oldest first. Pure: no clock, no disk.
    """
    if not history:
        return ()
    found = [a for a in (_slow_save(history), _disk_filling(history), _tier_behind(history)) if a is not None]
    return tuple(found)


def _slow_save(history: Sequence[SaveRecord]) -> Anomaly | None:
    latest, previous = history[-1], history[:-1]
    if len(previous) < MIN_SAVES_FOR_MEDIAN:
        return None
    median = statistics.median(r.duration_s for r in previous)
    threshold = SLOW_SAVE_FACTOR * median
    if latest.duration_s <= threshold:
        return None
    return Anomaly(
        "slow_save",
        f"the save of step {latest.step} took {latest.duration_s:.3g}s, more than "
        f"{SLOW_SAVE_FACTOR:g}x the median {median:.3g}s of the {len(previous)} saves before it; "
        "is the checkpoint disk shared, failing or throttled?",
        latest.duration_s,
        threshold,
    )


def _median_gap_s(history: Sequence[SaveRecord]) -> float | None:
    gaps = [b.finished_at - a.finished_at for a, b in zip(history, history[1:], strict=False)]
    return statistics.median(gaps) if gaps else None


def _disk_filling(history: Sequence[SaveRecord]) -> Anomaly | None:
    readings = [(r.finished_at, r.free_bytes) for r in history if r.free_bytes is not None]
    gap = _median_gap_s(history)
    if len(readings) < FREE_SPACE_FIT_SAVES or gap is None:
        return None
    times = [t for t, _ in readings]
    free = [float(f) for _, f in readings]
    if max(times) == min(times):
        return None
    slope, intercept = statistics.linear_regression(times, free)
    if slope >= 0:
        return None
    latest = history[-1]
    next_save_at = latest.finished_at + gap
    projected = slope * next_save_at + intercept
    needed = float(latest.num_bytes)
    if projected >= needed:
        return None
    return Anomaly(
        "disk_filling",
        f"free space fell by {-slope * gap:.4g} bytes per save over the last "
        f"{len(readings)} saves and projects to {max(projected, 0.0):.4g} bytes at the next save "
        f"(in ~{gap:.3g}s), less than the {latest.num_bytes} bytes it needs; free space there or "
        "lower keep_last",
        projected,
        needed,
    )


def _tier_behind(history: Sequence[SaveRecord]) -> Anomaly | None:
    latest = history[-1]
    gap = _median_gap_s(history)
    if gap is not None and latest.uploads_pending and latest.upload_lag_s > gap:
        return Anomaly(
            "tier_behind",
            f"the oldest of {latest.uploads_pending} pending uploads has waited "
            f"{latest.upload_lag_s:.3g}s, longer than the {gap:.3g}s between saves; the object tier "
            "falls behind (raise the interval or the store's bandwidth)",
            latest.upload_lag_s,
            gap,
        )
    recent = [r.uploads_pending for r in history[-PENDING_GROWTH_SAVES:]]
    if len(recent) == PENDING_GROWTH_SAVES and all(a < b for a, b in zip(recent, recent[1:], strict=False)):
        return Anomaly(
            "tier_behind",
            f"pending uploads grew over the last {PENDING_GROWTH_SAVES} saves "
            f"({' -> '.join(map(str, recent))}); the object tier falls behind the saves",
            float(recent[-1]),
            float(recent[0]),
        )
    return None


def throughput_mb_s(num_bytes: int, duration_s: float) -> float:
    return round(num_bytes / duration_s / 1e6, 3) if duration_s > 0 else 0.0


def save_fields(result: SaveResult, blocked_s: float | None, host_bytes: int) -> dict[str, Any]:
    """The figures every ``checkpoint`` event carries (see the module docstring)."""
    return {
        "duration_s": round(result.seconds, 6),
        "blocked_s": round(blocked_s, 6) if blocked_s is not None else None,
        "throughput_mb_s": throughput_mb_s(result.num_bytes, result.seconds),
        "tier": "local+tier2" if result.tier2_path is not None else "local",
        "host_bytes": host_bytes,
    }


def load_fields(state: dict[str, Any], path: Path, tier2_directory: str | None, duration_s: float) -> dict[str, Any]:
    """The figures a ``resume`` event carries: a load blocks training for all of it."""
    num_bytes = _tensor_bytes(state)
    in_tier2 = tier2_directory is not None and path.parent.resolve() == Path(tier2_directory).resolve()
    return {
        "duration_s": round(duration_s, 6),
        "blocked_s": round(duration_s, 6),
        "num_bytes": num_bytes,
        "throughput_mb_s": throughput_mb_s(num_bytes, duration_s),
        "tier": "tier2" if in_tier2 else "local",
        "host_bytes": _tensor_bytes(state, device="cpu"),
    }


def _tensor_bytes(value: Any, device: str | None = None) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size() if device is None or value.device.type == device else 0
    if isinstance(value, dict):
        return sum(_tensor_bytes(v, device) for v in value.values())
    if isinstance(value, list | tuple):
        return sum(_tensor_bytes(v, device) for v in value)
    return 0


class CheckpointTelemetry:
    """The shell around :func:`detect_anomalies`, for the writer group's training thread.

    Call :meth:`started` when a save's snapshot is taken, :meth:`finished` with each result
    (it returns the event fields and the anomalies to report), :meth:`uploaded` with each
    finished upload. Reads free space once per finished save (one ``statvfs``).
    """

    def __init__(self, directory: str | None, *, has_object_tier: bool) -> None:
        self._directory = directory
        self._has_object_tier = has_object_tier
        self._history: deque[SaveRecord] = deque(maxlen=HISTORY_SAVES)
        self._host_bytes: dict[int, int] = {}
        self._unuploaded: dict[int, float] = {}
        """Published steps whose upload has not finished, with when they were published."""

    def started(self, step: int, host_bytes: int) -> None:
        self._host_bytes[step] = host_bytes

    def uploaded(self, step: int) -> None:
        self._unuploaded.pop(step, None)

    def finished(
        self, result: SaveResult, blocked_s: float | None, now: float | None = None
    ) -> tuple[dict[str, Any], tuple[Anomaly, ...]]:
        """The event fields of ``result``, and the anomalies it shows (only a published save is judged)."""
        now = time.monotonic() if now is None else now
        fields = save_fields(result, blocked_s, self._host_bytes.pop(result.step, 0))
        free = self._free_bytes()
        fields["free_bytes"] = free
        if not result.ok:
            return fields, ()
        if self._has_object_tier:
            self._unuploaded[result.step] = now
        oldest = min(self._unuploaded.values(), default=now)
        self._history.append(
            SaveRecord(result.step, now, result.seconds, result.num_bytes, free, len(self._unuploaded), now - oldest)
        )
        return fields, detect_anomalies(tuple(self._history))

    def _free_bytes(self) -> int | None:
        if self._directory is None:
            return None
        try:
            return shutil.disk_usage(self._directory).free
        except OSError:
            return None
