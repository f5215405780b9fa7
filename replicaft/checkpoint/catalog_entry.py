"""A catalog row: what the catalog (catalog.py) says of one checkpoint, made from its manifest.

Also the code version a checkpoint records (``git describe``, else the installed version),
computed once per process. Pure but for that look-up; imports neither torch nor sqlite.
"""

from __future__ import annotations

import functools
import importlib.metadata
import json
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from replicaft.checkpoint.labels import TagValue, labels_of

if TYPE_CHECKING:
    from replicaft.checkpoint.manifest import CheckpointManifest

GIT_TIMEOUT_S = 5.0
Tier = Literal["local", "tier2", "object"]


@dataclass(frozen=True, slots=True)
class CatalogEntry:
    name: str
    lineage: str
    step: int
    epoch: int | None
    experiment: str | None
    config_hash: str | None
    code_version: str | None
    roles: tuple[str, ...]
    tiers: tuple[str, ...]
    num_bytes: int
    """This checkpoint's own files (an increment's chain is not counted)."""
    format_version: int
    save_kind: str
    """"base" or "increment" (chain.py)."""
    created_unix_s: float
    tags: dict[str, str] = field(default_factory=dict)
    """Tag values as text (str as is, others as JSON: 3, true, 0.5)."""
    metrics: dict[str, float] = field(default_factory=dict)


def tag_text(value: TagValue) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def entry_of(
    name: str, manifest: CheckpointManifest, *, tiers: Iterable[Tier] = ("local",), roles: Iterable[str] = ()
) -> CatalogEntry:
    """The catalog row of checkpoint ``name`` (a directory name), from its manifest. Pure."""
    labels = labels_of(manifest.metadata)
    all_roles = set(roles) | ({"emergency"} if manifest.metadata.get("reason") == "preemption" else set())
    return CatalogEntry(
        name,
        manifest.lineage,
        manifest.step,
        labels.epoch,
        labels.experiment,
        labels.config_hash,
        labels.code_version,
        tuple(sorted(all_roles)),
        tuple(sorted(set(tiers))),
        manifest.num_bytes,
        manifest.version,
        manifest.kind,
        manifest.created_unix_s,
        {k: tag_text(v) for k, v in labels.tags.items()},
        dict(labels.metrics),
    )


@functools.cache
def code_version() -> str:
    """``git describe --always --dirty --tags`` of the working directory, else the installed
    replicaft's version: what a checkpoint's code was. Computed once per process."""
    try:
        done = subprocess.run(
            ["git", "describe", "--always", "--dirty", "--tags"],
            capture_output=True,
            text=True,
            timeout=GIT_TIMEOUT_S,
            check=False,
        )
        if done.returncode == 0 and done.stdout.strip():
            return done.stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        pass
    version = installed_version()
    return f"replicaft {version}" if version != "unknown" else version


@functools.cache
def installed_version() -> str:
    """The installed replicaft's version, or "unknown"; looked up once (a few ms a save)."""
    try:
        return importlib.metadata.version("replicaft")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"
