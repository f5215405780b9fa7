"""The checkpoint's settings, checked once, when they are built. Pure and torch-free.

Every setting a checkpoint writer or reader takes is validated here, at start, with the
value and the fix in the message: a value that would be accepted and fail later (a negative
``keep_last`` deleting everything on the first publish, a NaN interval under which no save
is ever due and the job exits 0 without one) must not get past construction.
``replicaft.config.options.ManagerOptions`` calls :func:`check_checkpoint_options` with its
``checkpoint_*`` fields; the writer checks its own arguments with the same functions.

Torch-free, like ``layout.py``, so the manager's options can import it without pulling in
DCP (the package ``__init__`` loads the rest lazily).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from replicaft.errors import OptionsError

MAX_STEPS = 1 << 62
"""Far beyond any run, far below what msgpack and JSON carry exactly."""
MAX_SECONDS = 10 * 365 * 86400.0
MAX_COMPRESSION_LEVEL = 22
"""zstd's highest level."""


def check_count(name: str, value: object, *, minimum: int = 0, fix: str = "") -> int:
    """``value`` if it is an int in ``[minimum, MAX_STEPS]``; else OptionsError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise OptionsError(f"{name}={value!r} is a {type(value).__name__}; it must be a whole number{fix}")
    if not minimum <= value <= MAX_STEPS:
        raise OptionsError(f"{name}={value} is out of range; it must be between {minimum} and {MAX_STEPS}{fix}")
    return value


def check_seconds(name: str, value: object, *, fix: str = "") -> float:
    """``value`` if it is a finite number of seconds in ``[0, MAX_SECONDS]``; else OptionsError."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise OptionsError(f"{name}={value!r} is a {type(value).__name__}; it must be a number of seconds{fix}")
    if not math.isfinite(value) or not 0 <= value <= MAX_SECONDS:
        raise OptionsError(f"{name}={value} is not a finite number of seconds between 0 and {MAX_SECONDS:g}{fix}")
    return float(value)


def check_fraction(name: str, value: object, *, maximum: float = 10.0) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or not 0 <= value <= maximum
    ):
        raise OptionsError(f"{name}={value!r} must be a finite number between 0 and {maximum:g} (0.1 = 10%)")
    return float(value)


BestMode = Literal["min", "max"]
"""Whether a lower (loss) or a higher (accuracy) value of the keep-best metric is better."""


@dataclass(frozen=True, kw_only=True, slots=True)
class RetentionPolicy:
    """Which published checkpoints retention keeps (retention.py applies it). A checkpoint is
    kept when any rule keeps it; the newest, the chains of kept checkpoints and those a tier
    still needs are kept whatever the rules say."""

    keep_last: int = 3
    """Newest checkpoints kept (the newest is always kept, even with 0)."""
    milestone_every: int = 0
    """Also keep every checkpoint whose step is a multiple of this, forever (0 = none)."""
    milestone_at_epoch_end: bool = False
    """Also keep the last checkpoint of each epoch (by the ``epoch`` it was saved with), once a
    checkpoint of a later epoch exists; checkpoints saved without an epoch take no part."""
    keep_geometric_from: int = 0
    """Also keep the first checkpoint at or after each of the steps N, 2N, 4N, 8N, ...: a whole
    run's history at a cost logarithmic in its length (0 = none)."""
    keep_best_k: int = 0
    """Also keep the ``keep_best_k`` checkpoints with the best ``keep_best_metric`` (0 = none)."""
    keep_best_metric: str | None = None
    """The metric (reported with the checkpoint, ``Manager.report_metrics``) keep-best ranks by;
    checkpoints saved without it take no part."""
    keep_best_mode: BestMode = "min"

    def __post_init__(self) -> None:
        check_count("keep_last", self.keep_last, fix="; keep at least 0 recent checkpoints (the newest is always kept)")
        check_count("milestone_every", self.milestone_every, fix="; use 0 for no milestones")
        if not isinstance(self.milestone_at_epoch_end, bool):
            raise OptionsError(f"milestone_at_epoch_end={self.milestone_at_epoch_end!r} must be True or False")
        check_count("keep_geometric_from", self.keep_geometric_from, fix="; use 0 for no geometric spacing")
        check_count("keep_best_k", self.keep_best_k, fix="; use 0 to keep no best checkpoints")
        if self.keep_best_mode not in ("min", "max"):
            raise OptionsError(
                f"keep_best_mode={self.keep_best_mode!r} must be 'min' (lower is better, a loss) "
                "or 'max' (higher is better, an accuracy)"
            )
        metric = self.keep_best_metric
        if metric is not None and (not isinstance(metric, str) or not metric):
            raise OptionsError(f"keep_best_metric={metric!r} must be a metric name such as 'loss', or None")
        if self.keep_best_k and metric is None:
            raise OptionsError(
                f"keep_best_k={self.keep_best_k} needs keep_best_metric, the metric to rank "
                "checkpoints by (e.g. keep_best_metric='loss')"
            )
        if metric is not None and not self.keep_best_k:
            raise OptionsError(
                f"keep_best_metric={metric!r} is set but keep_best_k=0, so no checkpoint is kept "
                "for it; set keep_best_k >= 1 or drop the metric"
            )


def _same_place(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> bool:
    return Path(a).resolve() == Path(b).resolve()


@dataclass(frozen=True, kw_only=True, slots=True)
class CheckpointOptions:
    directory: str | None = None
    """Where checkpoints are published; None = no persistent checkpoints."""
    tier2_directory: str | None = None
    """A second directory (a mounted, more durable filesystem) receiving a verified copy."""
    interval_steps: int = 0
    """Save every N committed steps (0 = not by steps)."""
    interval_s: float = 0.0
    """Save every T seconds (0 = not by time)."""
    keep_last: int = 3
    """Newest checkpoints kept (the newest is always kept, even with 0)."""
    milestone_every: int = 0
    """Also keep every checkpoint whose step is a multiple of this, forever (0 = none)."""
    milestone_at_epoch_end: bool = False
    """Also keep the last checkpoint of each epoch (``RetentionPolicy``)."""
    keep_geometric_from: int = 0
    """Also keep checkpoints at steps N, 2N, 4N, ... (``RetentionPolicy``; 0 = none)."""
    keep_best_k: int = 0
    """Also keep the K best by ``keep_best_metric`` (``RetentionPolicy``; 0 = none)."""
    keep_best_metric: str | None = None
    keep_best_mode: BestMode = "min"
    free_space_margin: float = 0.1
    """Refuse a save unless the disk holds its estimate plus this fraction."""
    chain_length: int = 10
    """Incremental saves: a full base every this many saves (1 = every save is full; chain.py)."""
    compression_level: int = 0
    """zstd level for chunks (1-22), 0 = off (the default for the local tier: there CPU costs
    more than bytes). Applied when chunks are written, so it holds in every tier."""

    def __post_init__(self) -> None:
        check_interval_options(self.interval_steps, self.interval_s)
        _ = self.retention  # validates the retention fields
        check_fraction("free_space_margin", self.free_space_margin)
        check_count("chain_length", self.chain_length, minimum=1, fix="; 1 makes every save a full base")
        check_count("compression_level", self.compression_level, fix="; 0 (off) or a zstd level 1-22")
        if self.compression_level > MAX_COMPRESSION_LEVEL:
            raise OptionsError(
                f"compression_level={self.compression_level}; zstd levels go from 1 to "
                f"{MAX_COMPRESSION_LEVEL} (0 = off)"
            )
        for name in ("directory", "tier2_directory"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str | os.PathLike) or not str(value)):
                raise OptionsError(f"checkpoint {name}={value!r} must be a non-empty path or None")
        if self.tier2_directory is not None:
            if self.directory is None:
                raise OptionsError(
                    f"tier2_directory={self.tier2_directory!r} is set without a checkpoint directory; set both"
                )
            if _same_place(self.directory, self.tier2_directory):
                raise OptionsError(
                    f"tier2_directory is the checkpoint directory itself ({self.directory}); give another one or None"
                )

    @property
    def retention(self) -> RetentionPolicy:
        """The retention fields as one policy (checked when built)."""
        return RetentionPolicy(
            keep_last=self.keep_last,
            milestone_every=self.milestone_every,
            milestone_at_epoch_end=self.milestone_at_epoch_end,
            keep_geometric_from=self.keep_geometric_from,
            keep_best_k=self.keep_best_k,
            keep_best_metric=self.keep_best_metric,
            keep_best_mode=self.keep_best_mode,
        )


def check_interval_options(interval_steps: object, interval_s: object) -> None:
    """Raise OptionsError when an interval is negative, not finite, or of the wrong type (0 disables that trigger)."""
    check_count("interval_steps", interval_steps, fix="; use 0 to disable the step trigger")
    check_seconds("interval_s", interval_s, fix="; use 0 to disable the time trigger")


def check_checkpoint_options(
    *,
    directory: str | None,
    tier2_directory: str | None,
    interval_steps: int,
    interval_s: float,
    keep_last: int,
    milestone_every: int,
    chain_length: int = 10,
    compression_level: int = 0,
    object_store: str | None = None,
    milestone_at_epoch_end: bool = False,
    keep_geometric_from: int = 0,
    keep_best_k: int = 0,
    keep_best_metric: str | None = None,
    keep_best_mode: BestMode = "min",
) -> CheckpointOptions:
    """The checkpoint part of the manager's options, validated (``ManagerOptions`` calls this
    from ``__post_init__`` with its ``checkpoint_*`` fields). Raises OptionsError."""
    if object_store is not None:
        bucket = object_store.removeprefix("s3://").partition("/")[0]
        if not object_store.startswith("s3://") or not 3 <= len(bucket) <= 63:
            raise OptionsError(
                f"checkpoint_object_store={object_store!r} is not s3://bucket/prefix (bucket: 3-63 characters)"
            )
        if directory is None:
            raise OptionsError(
                "checkpoint_object_store is set without checkpoint_dir: checkpoints are written locally "
                "first, then uploaded; set checkpoint_dir too"
            )
    return CheckpointOptions(
        directory=directory,
        tier2_directory=tier2_directory,
        interval_steps=interval_steps,
        interval_s=interval_s,
        keep_last=keep_last,
        milestone_every=milestone_every,
        chain_length=chain_length,
        compression_level=compression_level,
        milestone_at_epoch_end=milestone_at_epoch_end,
        keep_geometric_from=keep_geometric_from,
        keep_best_k=keep_best_k,
        keep_best_metric=keep_best_metric,
        keep_best_mode=keep_best_mode,
    )
