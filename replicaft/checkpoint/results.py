"""What a save reports: its result, a handle to wait for it, and the writer's counters.

A save never raises into the training loop; everything it has to say comes back as a
:class:`SaveResult`, through a :class:`SaveHandle` (to wait for one save, e.g. the emergency
save on SIGTERM) or :meth:`CheckpointWriter.pop_finished` (to emit events each step).
"""

from __future__ import annotations

import concurrent.futures
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

SaveStatus = Literal["published", "refused", "failed"]


@dataclass(frozen=True, slots=True)
class SaveResult:
    step: int
    status: SaveStatus
    reason: str
    """What happened, with the directory and numbers; for a failure, the error."""
    path: Path | None = None
    """The published checkpoint (None unless ``status == "published"``)."""
    num_bytes: int = 0
    """Bytes published; for a refusal, the estimate that did not fit."""
    seconds: float = 0.0
    tier2_path: Path | None = None
    tier2_error: str | None = None
    deleted_steps: tuple[int, ...] = ()
    """Steps retention removed from ``directory`` after this publish."""
    kind: str = "base"
    """"base" or "increment" (chain.py); ``num_bytes`` is what this save wrote."""
    catalog_error: str | None = None
    """What failed in the catalog after the publish (the checkpoint is published all the same)."""

    @property
    def ok(self) -> bool:
        return self.status == "published"

    def to_wire(self) -> dict[str, Any]:
        """Plain values (msgpack), for group rank 0 to tell the other ranks (no pickle)."""
        return {
            "step": self.step,
            "status": self.status,
            "reason": self.reason,
            "path": str(self.path) if self.path is not None else None,
            "num_bytes": self.num_bytes,
            "seconds": self.seconds,
            "tier2_path": str(self.tier2_path) if self.tier2_path is not None else None,
            "tier2_error": self.tier2_error,
            "deleted_steps": list(self.deleted_steps),
            "kind": self.kind,
            "catalog_error": self.catalog_error,
        }

    @classmethod
    def from_wire(cls, d: dict[str, Any]) -> SaveResult:
        return cls(
            d["step"],
            d["status"],
            d["reason"],
            Path(d["path"]) if d["path"] is not None else None,
            d["num_bytes"],
            d["seconds"],
            Path(d["tier2_path"]) if d["tier2_path"] is not None else None,
            d["tier2_error"],
            tuple(d["deleted_steps"]),
            d["kind"],
            d.get("catalog_error"),
        )


@dataclass(frozen=True, slots=True)
class WriterStatistics:
    num_published: int
    num_skipped: int
    """Saves due while the previous one was still being written (see policy.py)."""
    num_refused: int
    """Saves refused before writing: not enough free space."""
    num_failed: int
    num_tier2_failed: int
    num_pending: int
    """Saves queued or being written now."""
    last_published_step: int | None


class SaveHandle:
    """One save in flight. ``wait`` for its :class:`SaveResult`; the save never raises."""

    def __init__(self, step: int, future: concurrent.futures.Future[SaveResult]) -> None:
        self.step = step
        self._future = future

    def done(self) -> bool:
        return self._future.done()

    def wait(self, timeout_s: float) -> SaveResult:
        """Block until the save has finished (tier-2 copy and retention included).

        Raises TimeoutError after ``timeout_s``; the save carries on in the background.
        """
        try:
            return self._future.result(timeout_s)
        except concurrent.futures.TimeoutError:
            raise TimeoutError(f"checkpoint of step {self.step} still being written after {timeout_s:g}s") from None
