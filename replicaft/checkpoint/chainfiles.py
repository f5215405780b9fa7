"""A lineage's chains on disk: the parent a save builds on, the chunks it may reuse, what
retention must keep. The I/O around the pure rules of chain.py and retention.py."""

from __future__ import annotations

import logging
import os
from collections.abc import Collection
from pathlib import Path

from replicaft.checkpoint.chain import Parent
from replicaft.checkpoint.entries import read_small
from replicaft.checkpoint.index import ChunkRef, decode_index
from replicaft.checkpoint.labels import labels_of
from replicaft.checkpoint.layout import TENSORS_FILE, parse_dirname
from replicaft.checkpoint.manifest import FORMAT_VERSION, CheckpointManifest
from replicaft.checkpoint.reader import read_manifest, scan_checkpoints
from replicaft.checkpoint.retention import CheckpointFacts
from replicaft.checkpoint.reuse import ReuseKey, reusable
from replicaft.errors import CheckpointCorrupt

logger = logging.getLogger(__name__)


def files_present(path: Path, manifest: CheckpointManifest) -> str:
    """ "" when every file of checkpoint ``path`` and of its chain is there with its listed
    size (``stat`` only, no hashing); else what is missing."""
    chain = [(path, manifest)]
    for name in manifest.requires:
        try:
            chain.append((path.parent / name, read_manifest(path.parent / name)))
        except CheckpointCorrupt as e:
            return str(e)
    for directory, m in chain:
        for entry in m.files:
            try:
                size = os.lstat(directory / entry.name).st_size
            except OSError:
                return f"{directory.name}/{entry.name} is missing"
            if size != entry.num_bytes:
                return f"{directory.name}/{entry.name} is {size} bytes, its manifest says {entry.num_bytes}"
    return ""


def find_parent(directory: Path, lineage: str) -> Parent | None:
    """The newest published checkpoint of ``lineage`` in ``directory``, judged for building on."""
    for name, path in scan_checkpoints(directory).found:
        if name.lineage != lineage:
            continue
        try:
            manifest = read_manifest(path)
        except CheckpointCorrupt as e:
            return Parent(path.name, 1, None, False, str(e))
        if manifest.holds_dcp_files:
            return Parent(path.name, 1, None, False, "it is in the previous release's format")
        if manifest.version != FORMAT_VERSION:
            # A chain is read under its newest checkpoint's version: version 3's sealed
            # chunks carry no place (places.py), and a version-4 reader refuses them.
            why = f"it is of format version {manifest.version}, this save of {FORMAT_VERSION}"
            return Parent(path.name, 1, None, False, why)
        missing = files_present(path, manifest)
        return Parent(path.name, manifest.chain_position, manifest.key_id, not missing, missing)
    return None


def known_chunks(directory: Path, parent: str | None, *, sealed: bool) -> dict[ReuseKey, ChunkRef]:
    """Every chunk the parent's index refers to (reuse.py): what an increment need not write.

    An unreadable index gives none (the save then writes every chunk, which is always
    correct) and a warning.
    """
    if parent is None:
        return {}
    where = f"{parent}/{TENSORS_FILE}"
    try:
        _, pieces = decode_index(read_small(directory / parent / TENSORS_FILE, where), where)
    except CheckpointCorrupt as e:
        logger.warning("%s; this save writes every chunk", e)
        return {}
    return reusable(pieces, sealed=sealed)


def retention_facts(directory: Path, lineage: str, pending_upload: Collection[str] = ()) -> dict[int, CheckpointFacts]:
    """What retention needs of each checkpoint of ``lineage`` in ``directory``, by step: its
    chain, epoch and metrics (from its manifest) and whether its name is in ``pending_upload``."""
    facts: dict[int, CheckpointFacts] = {}
    for name, path in scan_checkpoints(directory).found:
        if name.lineage != lineage:
            continue
        try:
            manifest = read_manifest(path)
        except CheckpointCorrupt:
            # damaged: nothing can be built on it, and its labels are unknown; retention may delete it
            facts[name.step] = CheckpointFacts(name.step, pending_upload=path.name in pending_upload)
            continue
        facts[name.step] = facts_of(name.step, manifest, pending_upload=path.name in pending_upload)
    return facts


def facts_of(step: int, manifest: CheckpointManifest, *, pending_upload: bool = False) -> CheckpointFacts:
    """Retention's view of the checkpoint of ``step``, from its manifest."""
    labels = labels_of(manifest.metadata)
    return CheckpointFacts(
        step,
        labels.epoch,
        labels.metrics,
        tuple(n.step for r in manifest.requires if (n := parse_dirname(r)) is not None),
        pending_upload,
    )
