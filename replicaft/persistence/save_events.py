"""The events a finished save or upload is reported by: ``checkpoint``, its anomalies, ``checkpoint_upload``.

The checkpoint writer and its uploader work on their own threads and hand back plain results
(checkpoint/results.py, checkpoint/objecttier.py); the persistence duties collect them on the
training thread at each step boundary (duties.py) and pass each one here. A result becomes
one event with the save's figures (checkpoint/telemetry.py adds the history-based ones and
says which figures are anomalies: each of those is logged and emitted as well), and an
upload that reached the object store marks that tier present in the catalog.

Kept apart from duties.py, which decides when to save and hands snapshots to the writer:
this is the reporting schema (DESIGN.md), the one place its fields are spelled.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from replicaft.checkpoint.results import SaveResult
from replicaft.checkpoint.telemetry import CheckpointTelemetry

if TYPE_CHECKING:
    from replicaft.checkpoint.catalog import Catalog
    from replicaft.checkpoint.objecttier import UploadResult

logger = logging.getLogger(__name__)

Emit = Callable[..., None]


def report_save(
    r: SaveResult, blocked_s: float | None, telemetry: CheckpointTelemetry, emit: Emit, replica_id: str
) -> None:
    """Emit the ``checkpoint`` event of a finished save and one ``checkpoint_anomaly`` per anomaly
    the telemetry finds in it (logged too). ``blocked_s``: what the save cost the training thread."""
    figures, anomalies = telemetry.finished(r, blocked_s)
    emit(
        "checkpoint",
        checkpoint_step=r.step,
        ok=r.ok,
        status=r.status,
        reason=r.reason,
        path=str(r.path) if r.path else None,
        num_bytes=r.num_bytes,
        kind=r.kind,
        **figures,
    )
    if r.catalog_error is not None:
        emit("catalog_update_failed", checkpoint_step=r.step, error=r.catalog_error)
    for a in anomalies:
        logger.warning("[%s] checkpoint anomaly (%s): %s", replica_id, a.kind, a.reason)
        emit(
            "checkpoint_anomaly",
            checkpoint_step=r.step,
            kind=a.kind,
            reason=a.reason,
            value=a.value,
            threshold=a.threshold,
        )


def report_upload(u: UploadResult, catalog: Catalog | None, telemetry: CheckpointTelemetry, emit: Emit) -> None:
    """Emit the ``checkpoint_upload`` event of a finished upload; one that succeeded is recorded
    in the catalog (the object tier holds that checkpoint) and in the telemetry."""
    if u.ok and catalog is not None:
        catalog.set_tier([u.name], "object", present=True)
    if u.ok:
        telemetry.uploaded(u.step)
    emit(
        "checkpoint_upload",
        checkpoint_step=u.step,
        name=u.name,
        ok=u.ok,
        reason=u.reason,
        num_bytes=u.num_bytes,
        seconds=u.seconds,
        tier="object",
    )
