"""The writer's duties around a publish, on group rank 0: leftovers before, copies and retention after.

Before the first save into a directory, ``*.tmp-*`` directories left by crashed saves are
removed (and the uploads an earlier uploader left unfinished are queued again). After each
publish, in this order: the verified tier-2 copy (tier2.py) and retention there, the hand-off
to the object-store uploader (objecttier.py), the catalog row (catalog.py), and retention in
tier 1, whose verdicts are noted in the catalog.

Invariants: none of this runs before the publish, so a failing disk never deletes the last
good checkpoint; a tier-2 failure is reported and leaves tier 1 untouched; one failed delete
is logged and does not stop the others, or retention would silently stop. Retention judges
only the publishing history's checkpoints: another lineage's are not this writer's to judge.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from replicaft.checkpoint.catalog import Catalog
from replicaft.checkpoint.catalog_entry import entry_of
from replicaft.checkpoint.chainfiles import retention_facts
from replicaft.checkpoint.durable import discard, remove_leftovers
from replicaft.checkpoint.layout import checkpoint_dirname
from replicaft.checkpoint.manifest import CheckpointManifest
from replicaft.checkpoint.objecttier import Uploader
from replicaft.checkpoint.options import RetentionPolicy
from replicaft.checkpoint.reader import scan_checkpoints
from replicaft.checkpoint.retention import RetentionDecision, decide_retention
from replicaft.checkpoint.tier2 import copy_verified
from replicaft.errors import CheckpointCorrupt, ObjectStoreError

logger = logging.getLogger(__name__)


class Housekeeper:
    """Group rank 0's upkeep of ``directory`` and ``tier2_directory`` around each publish.

    Runs on the writer's background thread only; blocks for the copies and deletes. Holds no
    state but the directories it has cleaned, so it is built with the writer (no I/O).
    """

    def __init__(
        self,
        directory: Path,
        *,
        tier2_directory: Path | None,
        retention: RetentionPolicy,
        uploader: Uploader | None,
        catalog: Catalog | None,
        writer_id: str,
    ) -> None:
        self.directory = directory
        self.tier2_directory = tier2_directory
        self.retention = retention
        self.uploader = uploader
        self.catalog = catalog
        self.writer_id = writer_id
        self._cleaned: set[Path] = set()
        self._catalog_problems: list[str] = []
        """What failed in the catalog during the current :meth:`after_publish`."""

    def after_publish(
        self, final: Path, manifest: CheckpointManifest
    ) -> tuple[Path | None, str | None, tuple[int, ...], str | None]:
        """Copy, upload, catalog and retain after ``final`` was published.

        Returns the tier-2 copy (None without tier 2 or when the copy failed), the tier-2
        error (None unless it failed), the steps retention deleted from tier 1 and what
        failed in the catalog (None unless something did). Never raises for a tier-2 or a
        catalog failure (each is logged and returned): the checkpoint is published.
        """
        self._catalog_problems: list[str] = []
        tier2_path, tier2_error = self._copy_to_tier2(final, manifest)
        if self.uploader is not None:
            self.uploader.submit(final)
        decision, deleted = self._apply_retention(self.directory, manifest.step, manifest.lineage)
        if self.catalog is not None:
            catalog = self.catalog
            self._note_in_catalog(
                lambda: catalog.record(
                    entry_of(final.name, manifest, tiers=("local", "tier2") if tier2_path else ("local",)),
                    roles={
                        checkpoint_dirname(v.step, manifest.lineage): v.kept_as for v in decision.verdicts if v.keep
                    },
                    removed=[checkpoint_dirname(old, manifest.lineage) for old in deleted],
                )
            )
        return tier2_path, tier2_error, deleted, "; ".join(self._catalog_problems) or None

    def _note_in_catalog(self, change: Callable[[], str | None]) -> None:
        """Run one catalog change; what failed (the catalog logs it) is kept for the save's result.
        Whatever it raises is caught too: the catalog is a cache, and the checkpoint is published."""
        try:
            problem = change()
        except Exception as e:
            problem = f"catalog update failed: {type(e).__name__}: {e}"
            logger.warning("[%s] %s; the checkpoint is published and unaffected", self.writer_id, problem)
        if problem is not None:
            self._catalog_problems.append(problem)

    def remove_leftovers_once(self, directory: Path) -> None:
        """Remove ``*.tmp-*`` left by crashed saves, before this writer's first save there;
        the first time in ``directory``, queue the uploads an earlier uploader did not finish."""
        if directory in self._cleaned:
            return
        self._cleaned.add(directory)
        if self.uploader is not None and directory == self.directory:
            try:
                self.uploader.resume_pending()
            except ObjectStoreError as e:
                logger.error(
                    "[%s] cannot list %s to resume unfinished uploads: %s", self.writer_id, self.uploader.store.url, e
                )
        for name in remove_leftovers(directory):
            logger.info("[%s] removed %s/%s, left by an interrupted save or delete", self.writer_id, directory, name)

    def _copy_to_tier2(self, final: Path, manifest: CheckpointManifest) -> tuple[Path | None, str | None]:
        if self.tier2_directory is None:
            return None, None
        try:
            self.tier2_directory.mkdir(parents=True, exist_ok=True)
            self.remove_leftovers_once(self.tier2_directory)
            copy = copy_verified(final, self.tier2_directory, manifest)
        except (OSError, CheckpointCorrupt) as e:
            error = f"copying {final} to tier 2 ({self.tier2_directory}) failed: {type(e).__name__}: {e}"
            self._log(logging.ERROR, manifest.step, "%s; the tier-1 checkpoint is unaffected", error)
            return None, error
        _, deleted = self._apply_retention(self.tier2_directory, manifest.step, manifest.lineage)
        if self.catalog is not None:
            catalog = self.catalog
            names = [checkpoint_dirname(old, manifest.lineage) for old in deleted]
            self._note_in_catalog(lambda: catalog.set_tier(names, "tier2", present=False))
        return copy, None

    def _apply_retention(self, directory: Path, step: int, lineage: str) -> tuple[RetentionDecision, tuple[int, ...]]:
        """Delete what retention says among this history's checkpoints (another history's are
        not this writer's to judge); one failed delete is logged and does not stop the others.
        Returns the decision and the steps deleted."""
        steps = {name.step: path for name, path in scan_checkpoints(directory).found if name.lineage == lineage}
        pending = self.uploader.pending_names() if self.uploader is not None and directory == self.directory else ()
        decision = decide_retention(retention_facts(directory, lineage, pending).values(), self.retention)
        deleted = []
        for old in decision.delete:
            try:
                discard(steps[old], old)
                deleted.append(old)
            except OSError as e:
                self._log(logging.WARNING, step, "retention could not delete %s: %s", steps[old], e)
        if deleted:
            self._log(logging.INFO, step, "retention in %s: %s", directory, decision.reason)
        return decision, tuple(deleted)

    def _log(self, level: int, step: int, msg: str, *args: Any) -> None:
        logger.log(level, "[%s step=%d] " + msg, self.writer_id, step, *args)
