"""The checkpoints of one run across its tiers: which exist, which to resume from, loading it.

Tiers, nearest first: the checkpoint directory (0), the tier-2 directory (1, a mounted
filesystem), the object store (2, objecttier.py). A resume considers every checkpoint of
every tier, orders them by lineage and step (lineage.py; at equal steps the nearest copy
first), and loads the first that verifies. A checkpoint only in the object store (a new
machine, or a local copy lost or damaged) is first fetched into the checkpoint directory,
verified file by file, and then loaded like a local one.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from replicaft.checkpoint.keys import EncryptionKey
from replicaft.checkpoint.layout import lineage_label, parse_dirname
from replicaft.checkpoint.lineage import Candidate, order_for_resume
from replicaft.checkpoint.objectstore import ObjectStore
from replicaft.checkpoint.objecttier import fetch_checkpoint, stored_checkpoints, stored_manifest
from replicaft.checkpoint.reader import (
    CheckpointInfo,
    LoadedCheckpoint,
    load,
    mtime,
    read_manifest,
    scan_checkpoints,
    verify,
)
from replicaft.errors import CheckpointCorrupt, ObjectStoreError

logger = logging.getLogger(__name__)

OBJECT_TIER = 2


class CheckpointReader:
    """The checkpoints of one run: ``directory``, optionally its tier-2 copy and an object store.

    Safe to use from any thread and any rank. Nothing here deletes; the only writes are
    checkpoints fetched from the object store into ``directory`` (published like a save).
    """

    def __init__(
        self,
        directory: str | Path,
        *,
        tier2_directory: str | Path | None = None,
        encryption_key: EncryptionKey | None = None,
        object_store: ObjectStore | None = None,
    ) -> None:
        self.directory = Path(directory)
        self.tier2_directory = Path(tier2_directory) if tier2_directory is not None else None
        self.encryption_key = encryption_key
        self.object_store = object_store

    def list(self, *, verify_files: bool = True, now: float | None = None) -> list[CheckpointInfo]:
        """Published checkpoints in ``directory``, newest first. Never raises for what the
        directory holds: a look-alike entry is left out (see :meth:`ignored`), a damaged
        checkpoint is listed as invalid with the reason.

        ``verify_files=False`` skips reading every byte (fast; ``valid`` is then None).
        """
        now = time.time() if now is None else now
        infos = []
        for name, path in scan_checkpoints(self.directory).found:
            try:
                manifest = read_manifest(path)
            except CheckpointCorrupt as e:
                infos.append(CheckpointInfo(name.step, path, 0, now - mtime(path, now), False, str(e), name.lineage))
                continue
            valid, reason = verify(path) if verify_files else (None, "not verified")
            infos.append(
                CheckpointInfo(
                    name.step, path, manifest.num_bytes, now - manifest.created_unix_s, valid, reason, name.lineage
                )
            )
        return infos

    def ignored(self) -> list[tuple[Path, str]]:
        """Entries of ``directory`` named like a checkpoint that are not one, with the reason."""
        return scan_checkpoints(self.directory).ignored

    @staticmethod
    def verify(path: str | Path) -> tuple[bool, str]:
        """See :func:`verify`."""
        return verify(path)

    def load(self, path: str | Path, template: Mapping[str, Any] | None = None, *, rank: int = 0) -> LoadedCheckpoint:
        """Load one given checkpoint (e.g. to go back to a milestone); see :func:`load`."""
        return load(path, template, rank=rank, key=self.encryption_key)

    def has_any(self) -> bool:
        """Cheap: is any checkpoint published in any tier? (Validity is checked when loading.)"""
        if self.list(verify_files=False):
            return True
        if self.tier2_directory is not None and scan_checkpoints(self.tier2_directory).found:
            return True
        return self.object_store is not None and bool(stored_checkpoints(self.object_store))

    def candidates(self) -> list[tuple[Candidate, Path]]:
        """Every published checkpoint of every tier, in the order a resume tries them (lineage.py).

        An object-store candidate's path is where :meth:`load_latest_valid` fetches it to.
        """
        found: dict[Candidate, Path] = {}
        for tier, directory in enumerate((self.directory, self.tier2_directory)):
            if directory is None:
                continue
            scanned = scan_checkpoints(directory)
            for path, why in scanned.ignored:
                logger.warning("%s: %s", path, why)
            for name, path in scanned.found:
                try:
                    created: float | None = read_manifest(path).created_unix_s
                except CheckpointCorrupt:
                    created = None
                label = path.name if tier == 0 else f"tier 2 {path.name}"
                found[Candidate(name.step, name.lineage, created, tier, label)] = path
        if self.object_store is not None:
            found.update(self._stored_candidates(self.object_store))
        order = order_for_resume(found)
        if found:
            logger.info("resume order: %s", order.reason)
        return [(c, found[c]) for c in order.candidates]

    def load_latest_valid(self, template: Mapping[str, Any] | None = None, *, rank: int = 0) -> LoadedCheckpoint | None:
        """Load the newest checkpoint that verifies, from ``directory`` then tier 2; None if none does.

        With several lineages (histories) present, the one written most recently is tried
        first, whole, then the others (lineage.py); the choice is logged. Call at startup
        only when no peer can donate (peers are always fresher). Damaged checkpoints are
        skipped with a warning naming the file and the reason; a StateError (template does
        not match) and a CheckpointKeyError (no key, or the wrong one) are raised, since an
        older checkpoint would not load either. Blocks for
        as long as reading and hashing the checkpoints takes.
        """
        candidates = self.candidates()
        for i, (candidate, path) in enumerate(candidates):
            try:
                if candidate.tier == OBJECT_TIER:
                    assert self.object_store is not None
                    path = fetch_checkpoint(self.object_store, path.name, self.directory)
                loaded = load(path, template, rank=rank, key=self.encryption_key)
            except (CheckpointCorrupt, ObjectStoreError) as e:
                following = (
                    f"trying step {candidates[i + 1][0].step} ({candidates[i + 1][0].label})"
                    if i + 1 < len(candidates)
                    else "no older checkpoint left"
                )
                logger.warning("%s; skipping step %d, %s", e, candidate.step, following)
                continue
            newest = max(c.step for c, _ in candidates if c.lineage == candidate.lineage)
            logger.info(
                "loaded checkpoint of step %d (lineage %s) from %s",
                candidate.step,
                lineage_label(candidate.lineage),
                path,
            )
            return loaded._replace(newest_in_lineage=candidate.step == newest)
        if candidates:
            logger.error(
                "none of the %d checkpoints in %s is intact; starting without one", len(candidates), self.directory
            )
        return None

    def _stored_candidates(self, store: ObjectStore) -> dict[Candidate, Path]:
        """The object store's checkpoints; a store that cannot be listed contributes none (logged)."""
        found: dict[Candidate, Path] = {}
        try:
            names = stored_checkpoints(store)
        except ObjectStoreError as e:
            logger.error("cannot list the checkpoints in %s: %s; resuming from the local tiers only", store.url, e)
            return found
        for stored in names:
            name = parse_dirname(stored)
            assert name is not None
            try:
                created: float | None = stored_manifest(store, stored).created_unix_s
            except (CheckpointCorrupt, ObjectStoreError):
                created = None
            found[Candidate(name.step, name.lineage, created, OBJECT_TIER, f"{store.url}/{stored}")] = (
                self.directory / stored
            )
        return found
