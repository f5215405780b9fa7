"""What a checkpoint is labelled with: tags and metrics, carried in its manifest. Pure, torch-free.

A training script labels its checkpoints through the manager (``Manager.checkpoint_tags``,
``Manager.report_metrics``); the labels go into the ``metadata`` of the checkpoint's
``manifest.json`` under these keys::

    "tags":         {"experiment": "lr-sweep-3", "epoch": 4, ...}  str/int/float/bool values
    "metrics":      {"loss": 0.231, ...}                          finite numbers (a NaN or inf is not kept)
    "config_hash":  "9f1c2a..."                                   of the config the script passed
    "code_version": "v0.4.1-12-g3ab2c1d"                          added by the writer (catalog.py)

The manifest is the record; the catalog (catalog.py) and keep-best retention only read it. So
labels survive everything a checkpoint survives (a tier-2 copy, an upload, a lost catalog),
and nothing about a label needs a second file to stay true.

**Tags stay, metrics go.** Tags describe the run (experiment, config, epoch) and apply to
every checkpoint saved after they are set, until changed. Metrics describe one moment of
training (the loss at a step), so a reported value is attached to the *next* checkpoint only
and then cleared: two checkpoints never carry the same measurement, and keep-best never ranks
a checkpoint by a value from before the one it replaced. A script that reports every step
attaches the loss of the step the checkpoint holds.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

TAGS_KEY = "tags"
METRICS_KEY = "metrics"
CONFIG_HASH_KEY = "config_hash"
CODE_VERSION_KEY = "code_version"
EXPERIMENT_TAG = "experiment"
EPOCH_TAG = "epoch"

TagValue = str | int | float | bool
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Labels:
    """The labels of one published checkpoint, as read back from its manifest's metadata."""

    tags: dict[str, TagValue] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    config_hash: str | None = None
    code_version: str | None = None

    @property
    def experiment(self) -> str | None:
        value = self.tags.get(EXPERIMENT_TAG)
        return value if isinstance(value, str) else None

    @property
    def epoch(self) -> int | None:
        value = self.tags.get(EPOCH_TAG)
        return value if isinstance(value, int) and not isinstance(value, bool) else None


def config_hash(config: Mapping[str, Any]) -> str:
    """A short, stable hash of a JSON-able config (key order does not matter). A NaN or infinite
    value hashes as its name: the config is hashed, never stored, and ``vars(args)`` of a run
    given ``--loss-scale inf`` is a config like any other (refusing it stopped that run at start)."""
    try:
        canonical = json.dumps(config, sort_keys=True, separators=(",", ":"))
    except (TypeError, ValueError) as e:
        raise ValueError(f"checkpoint config must hold JSON values only (it is hashed, not stored): {e}") from e
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def check_tag(key: object, value: object) -> TagValue:
    """``value`` if ``key``/``value`` make a valid tag; else ValueError naming both."""
    if not isinstance(key, str) or not key or "=" in key:
        raise ValueError(f"checkpoint tag name {key!r} must be a non-empty string without '='")
    if key == EPOCH_TAG and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        raise ValueError(f"checkpoint tag epoch={value!r} must be a whole number >= 0")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"checkpoint tag {key}={value!r} must be finite")
    if not isinstance(value, str | int | float | bool):
        raise ValueError(
            f"checkpoint tag {key}={value!r} is a {type(value).__name__}; tags are str, int, float or bool"
        )
    return value


def check_metric(key: object, value: object) -> float:
    """``value`` as a float if it is a finite number; else ValueError naming the metric."""
    if not isinstance(key, str) or not key:
        raise ValueError(f"metric name {key!r} must be a non-empty string")
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"metric {key}={value!r} must be a finite number (a tensor: pass loss.item())")
    return float(value)


def is_non_finite(value: object) -> bool:
    """A number that is NaN or infinite: a training event (a loss that blew up), not a bad argument."""
    return isinstance(value, int | float) and not isinstance(value, bool) and not math.isfinite(value)


class CheckpointLabels:
    """The labels the next checkpoint is saved with. Training thread only (no lock)."""

    def __init__(self) -> None:
        self._tags: dict[str, TagValue] = {}
        self._config_hash: str | None = None
        self._metrics: dict[str, float] = {}

    def set_tags(self, *, config: Mapping[str, Any] | None = None, **tags: TagValue) -> None:
        """Tags for every checkpoint saved from now on (a tag set again replaces its value).
        ``config`` is stored as its hash. Raises ValueError for a bad tag or config."""
        checked = {key: check_tag(key, value) for key, value in tags.items()}
        if config is not None:
            self._config_hash = config_hash(config)
        self._tags.update(checked)

    def report_metrics(self, **metrics: float) -> list[str]:
        """Metrics for the next checkpoint (a metric reported again replaces its value). Returns
        the names of the non-finite ones (NaN, inf), which are not attached and withdraw an
        earlier value of theirs: keep-best never ranks a checkpoint by a loss that blew up, nor
        by one from before it did. Raises ValueError for a name or a value that is no number."""
        non_finite = [key for key, value in metrics.items() if is_non_finite(value)]
        checked = {key: check_metric(key, 0.0 if key in non_finite else value) for key, value in metrics.items()}
        for key in non_finite:
            del checked[key]
            self._metrics.pop(key, None)
        self._metrics.update(checked)
        return non_finite

    def take(self) -> dict[str, Any]:
        """The metadata for a save starting now; the metrics are cleared (see the module docstring)."""
        metadata: dict[str, Any] = {}
        if self._tags:
            metadata[TAGS_KEY] = dict(self._tags)
        if self._metrics:
            metadata[METRICS_KEY], self._metrics = self._metrics, {}
        if self._config_hash is not None:
            metadata[CONFIG_HASH_KEY] = self._config_hash
        return metadata


def labels_of(metadata: Mapping[str, Any]) -> Labels:
    """The labels in a manifest's metadata. A manifest may come from anywhere: a value of the
    wrong type is left out rather than trusted or raised about (labels never decide validity)."""
    tags = _valid(metadata.get(TAGS_KEY), check_tag)
    metrics = _valid(metadata.get(METRICS_KEY), check_metric)
    hashed, version = metadata.get(CONFIG_HASH_KEY), metadata.get(CODE_VERSION_KEY)
    return Labels(
        tags, metrics, hashed if isinstance(hashed, str) else None, version if isinstance(version, str) else None
    )


def _valid(raw: object, check: Callable[[object, object], T]) -> dict[str, T]:
    """The items of ``raw`` (if a dict) that ``check`` accepts, as it returns them."""
    valid: dict[str, T] = {}
    for key, value in raw.items() if isinstance(raw, dict) else ():
        try:
            valid[key] = check(key, value)
        except ValueError:
            continue
    return valid
