"""The checkpoints of one run across its tiers: which exist, which to resume from, loading it.

Tiers, nearest first: the checkpoint directory (0), the tier-2 directory (1, a mounted
filesystem), the object store (2, objecttier.py). A resume considers every checkpoint of
every tier, orders them by lineage and step (lineage.py; at equal steps the nearest copy
first), and loads the first that verifies. A checkpoint only in the object store (a new
machine, or a local copy lost or damaged) is first fetched into the checkpoint directory,
verified file by file, and then loaded like a local one.

**A store that cannot be asked is not an empty one.** A resume that found nothing to load
because the object store could not be listed, or because a stored checkpoint could not be
fetched, raises :class:`~replicaft.errors.CheckpointStoreUnavailable` instead of returning
None: the caller would train from step 0 under a new lineage beside the stored history
(issue 37). With a local checkpoint to load, an unlistable store is logged and the local
one loads (the store holds uploads of local saves, so it is rarely ahead).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
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
from replicaft.errors import CheckpointCorrupt, CheckpointStoreUnavailable, ObjectStoreError

logger = logging.getLogger(__name__)

OBJECT_TIER = 2


@dataclass(frozen=True, slots=True)
class Survey:
    """What a resume can choose from: every published checkpoint of every tier, in the order a
    resume tries them (lineage.py), and why the object store's are not among them if it could
    not be listed (its checkpoints are then unknown, not absent)."""

    candidates: tuple[tuple[Candidate, Path], ...]
    store_error: ObjectStoreError | None = None


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

    def survey(self) -> Survey:
        """Every published checkpoint of every tier, in the order a resume tries them (lineage.py).

        An object-store candidate's path is where :meth:`load_latest_valid` fetches it to. Reads
        manifests and lists the store (its requests retried under its policy); never raises for
        what it finds: a store that cannot be listed is the survey's ``store_error``.
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
        store_error = None
        if self.object_store is not None:
            try:
                found.update(self._stored_candidates(self.object_store))
            except ObjectStoreError as e:
                store_error = e
        order = order_for_resume(found)
        if found:
            logger.info("resume order: %s", order.reason)
        return Survey(tuple((c, found[c]) for c in order.candidates), store_error)

    def load_latest_valid(
        self, template: Mapping[str, Any] | None = None, *, rank: int = 0, survey: Survey | None = None
    ) -> LoadedCheckpoint | None:
        """Load the newest checkpoint that verifies, from every tier; None if there is none to load.

        With several lineages (histories) present, the one written most recently is tried
        first, whole, then the others (lineage.py); the choice is logged. Call at startup
        only when no peer can donate (peers are always fresher). Damaged checkpoints are
        skipped with a warning naming the file and the reason; a StateError (template does
        not match) and a CheckpointKeyError (no key, or the wrong one) are raised, since an
        older checkpoint would not load either; CheckpointStoreUnavailable when nothing loaded
        and the object store could not be listed or read (see the module docstring). Blocks
        for as long as reading and hashing the checkpoints takes. ``survey``: the one taken
        already (:meth:`survey`), so the store is not listed twice.
        """
        survey = self.survey() if survey is None else survey
        candidates = survey.candidates
        store_failure = survey.store_error
        if store_failure is not None and candidates:
            logger.error(
                "cannot list the checkpoints in %s: %s; resuming from the local tiers only",
                self._store_url(),
                store_failure,
            )
        for i, (candidate, path) in enumerate(candidates):
            try:
                if candidate.tier == OBJECT_TIER:
                    assert self.object_store is not None
                    path = fetch_checkpoint(self.object_store, path.name, self.directory)
                loaded = load(path, template, rank=rank, key=self.encryption_key)
            except (CheckpointCorrupt, ObjectStoreError) as e:
                if isinstance(e, ObjectStoreError):
                    store_failure = e
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
        if store_failure is not None:
            raise CheckpointStoreUnavailable(
                f"no checkpoint could be loaded, and {self._store_url()} could not be "
                f"{'listed' if store_failure is survey.store_error else 'read'} ({store_failure}): a checkpoint may be "
                "there, so this does not start without one (that would begin a second history beside it)"
            ) from store_failure
        if candidates:
            logger.error(
                "none of the %d checkpoints in %s is intact; starting without one", len(candidates), self.directory
            )
        return None

    def _store_url(self) -> str:
        return self.object_store.url if self.object_store is not None else "the object store"

    def _stored_candidates(self, store: ObjectStore) -> dict[Candidate, Path]:
        """The object store's checkpoints; raises ObjectStoreError when it cannot be listed."""
        found: dict[Candidate, Path] = {}
        for stored in stored_checkpoints(store):
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
