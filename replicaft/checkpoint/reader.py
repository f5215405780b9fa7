"""Reading checkpoints back: list, verify every byte, load the newest valid one.

A checkpoint on disk may be incomplete (a writer killed before publishing leaves only a
``*.tmp-*`` directory, which is never read) or damaged after publishing (a flipped bit, a
truncated copy, a deleted shard). ``verify`` catches the second kind by checking every file
against ``manifest.json`` before a single byte is loaded; ``load_latest_valid`` walks the
checkpoints newest first and skips damaged ones with a warning naming the file and the
reason, so a run restarts from the newest state that is actually intact.

Loading uses ``torch.distributed.checkpoint.load`` without a process group (``no_dist``),
from however many shard files the writing group produced: a checkpoint written by a group of
W ranks loads into any other W. Replicated tensors are read whole; a template's DTensor
(FSDP state) is filled with just this rank's part of the saved global tensor; a plain tensor
each rank of a sharded group saved its own value of (``StateLayout.own_ranks``) is read from
that rank's copy (``rank``), or rank 0's when the checkpoint had fewer ranks. Template tensors of the right name, dtype and shape are
filled in place, DCP's usual contract, so a model on the GPU is restored without a host copy
of it; tensors the template lacks (a fresh optimizer's moments) are allocated on the CPU.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import torch
import torch.distributed.checkpoint as dcp

from replicaft.checkpoint.durable import READ_BYTES
from replicaft.checkpoint.entries import judge, open_regular, read_small, scan
from replicaft.checkpoint.layout import (
    DCP_METADATA_FILE,
    LEGACY_LINEAGE,
    MANIFEST_FILE,
    STATE_FILE,
    CheckpointName,
    dcp_key,
    lineage_label,
    parse_dirname,
)
from replicaft.checkpoint.legacy import SafeFileSystemReader
from replicaft.checkpoint.lineage import Candidate, order_for_resume
from replicaft.checkpoint.manifest import CheckpointManifest, StateLayout
from replicaft.errors import CheckpointCorrupt, StateError
from replicaft.state import DTYPES, Sharding, flatten, unflatten

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class CheckpointInfo:
    step: int
    path: Path
    num_bytes: int
    """Sum of the sizes ``manifest.json`` lists (0 when it cannot be read)."""
    age_s: float
    """Seconds since the manifest says it was written (the directory's mtime without one)."""
    valid: bool | None
    """None when listed without verification."""
    reason: str
    lineage: str = LEGACY_LINEAGE


class LoadedCheckpoint(NamedTuple):
    step: int
    state: dict[str, Any]
    path: Path
    lineage: str = LEGACY_LINEAGE
    newest_in_lineage: bool = True
    """False when newer checkpoints of the same lineage exist but did not load: a run that
    continues from here forks a new history rather than extend the one they belong to."""


@dataclass(frozen=True, slots=True)
class Scan:
    """What a checkpoint directory holds: published checkpoints, and entries named like one
    that are not (a link, a file), each with the reason it is ignored."""

    found: list[tuple[CheckpointName, Path]]
    """Newest step first."""
    ignored: list[tuple[Path, str]]


def read_manifest(path: Path) -> CheckpointManifest:
    """The parsed ``manifest.json`` of checkpoint directory ``path``; raises CheckpointCorrupt."""
    where = f"{path.name}/{MANIFEST_FILE}"
    try:
        raw = read_small(path / MANIFEST_FILE, where)
    except CheckpointCorrupt as e:
        if str(e) == f"{where} is missing":
            raise CheckpointCorrupt(f"{where} is missing: the save never finished publishing, or the file was deleted") from None
        raise
    return CheckpointManifest.decode(raw, where)


def _sha256(path: Path, where: str) -> tuple[int, str]:
    h = hashlib.sha256()
    num_bytes = 0
    with open_regular(path, where) as f:
        try:
            while chunk := f.read(READ_BYTES):
                h.update(chunk)
                num_bytes += len(chunk)
        except OSError as e:
            raise CheckpointCorrupt(f"{where} cannot be read ({e})") from e
    return num_bytes, h.hexdigest()


def check(path: Path, *, expected: CheckpointName | None = None) -> CheckpointManifest:
    """Verify checkpoint directory ``path`` file by file; return its manifest.

    Raises CheckpointCorrupt naming the first file that is missing, is not a regular file,
    has the wrong size, or fails its SHA-256. ``expected`` (step and lineage) defaults to
    what the directory's name says.
    """
    kind = judge(path).kind
    if kind != "dir":
        raise CheckpointCorrupt(f"{path} is a {kind}, not a checkpoint directory")
    manifest = read_manifest(path)
    name = parse_dirname(path.name) if expected is None else expected
    if name is not None and (manifest.step, manifest.lineage) != (name.step, name.lineage):
        raise CheckpointCorrupt(
            f"{path.name}/{MANIFEST_FILE} says step {manifest.step} of lineage {lineage_label(manifest.lineage)}, "
            f"the directory step {name.step} of lineage {lineage_label(name.lineage)}"
        )
    listed = {f.name for f in manifest.files}
    for required in (STATE_FILE, DCP_METADATA_FILE):
        if required not in listed:
            raise CheckpointCorrupt(f"{path.name}/{MANIFEST_FILE} does not list {required}")
    for entry in manifest.files:
        where = f"{path.name}/{entry.name}"
        size, got = _sha256(path / entry.name, where)
        if size != entry.num_bytes:
            raise CheckpointCorrupt(f"{where} is {size} bytes, the manifest says {entry.num_bytes} (truncated or overwritten)")
        if got != entry.sha256:
            raise CheckpointCorrupt(f"{where} checksum mismatch (expected {entry.sha256[:8]}…, got {got[:8]}…)")
    return manifest


def verify(path: str | Path) -> tuple[bool, str]:
    """``(True, summary)`` if checkpoint directory ``path`` is complete and intact, else ``(False, reason)``."""
    path = Path(path)
    try:
        manifest = check(path)
    except CheckpointCorrupt as e:
        return False, str(e)
    return True, f"{path.name}: {len(manifest.files)} files, {manifest.num_bytes} bytes, all checksums match"


def scan_checkpoints(directory: Path) -> Scan:
    """Published checkpoints of ``directory`` and the look-alikes it ignores (entries.py)."""
    found, ignored = [], []
    for entry in scan(directory):
        name = parse_dirname(entry.path.name)
        if name is None:
            continue
        if entry.is_dir:
            found.append((name, entry.path))
        else:
            ignored.append((entry.path, f"named like a checkpoint but a {entry.kind}, not a directory; ignored"))
    found.sort(key=lambda f: (f[0].step, f[0].lineage), reverse=True)
    return Scan(found, ignored)


def published(directory: Path) -> list[tuple[int, Path]]:
    """``(step, path)`` of every published checkpoint in ``directory``, newest first.

    Temporary (``*.tmp-*``) directories and look-alikes that are not directories are not
    included; a missing directory has none.
    """
    return [(name.step, path) for name, path in scan_checkpoints(directory).found]


class TemplateMismatch(StateError):
    """A template tensor's dtype or shape differs from the saved one: the model changed, and
    an older checkpoint would not match either, so this is raised rather than skipped."""


def load(path: str | Path, template: Mapping[str, Any] | None = None, *, rank: int = 0) -> LoadedCheckpoint:
    """Verify, then load checkpoint directory ``path``.

    Tensors of ``template`` whose name, dtype and shape match the checkpoint are filled in
    place and returned; the rest are allocated on the CPU. Raises CheckpointCorrupt for any
    failure to read or decode the checkpoint (DCP's own ``CheckpointException``, a
    ``BaseException``, included), and StateError when a template tensor has another dtype
    or shape than the saved one (the model changed since the save). Never runs pickle.
    """
    path = Path(path)
    manifest = check(path)
    try:
        layout = StateLayout.decode(read_small(path / STATE_FILE, f"{path.name}/{STATE_FILE}"), f"{path.name}/{STATE_FILE}")
        to_load, tensors = _targets(path, layout, _template_tensors(template), rank)
        dcp.load(to_load, storage_reader=SafeFileSystemReader(path, [f.name for f in manifest.files]), no_dist=True)
        state = unflatten(layout.skeleton, tensors)
    except TemplateMismatch:
        raise
    except CheckpointCorrupt:
        raise
    except StateError as e:
        raise CheckpointCorrupt(f"{path.name}/{STATE_FILE}: {e}") from e
    # DCP's CheckpointException derives from BaseException; everything else that reading a
    # damaged or hostile file can raise (RecursionError, MemoryError on a huge claimed size,
    # torch's RuntimeErrors) is this checkpoint being bad, not the program.
    except (Exception, dcp.CheckpointException) as e:
        raise CheckpointCorrupt(f"{path.name}: could not load the tensors ({type(e).__name__}: {e})") from e
    if not isinstance(state, dict):
        raise CheckpointCorrupt(f"{path.name}/{STATE_FILE} holds a {type(state).__name__}, not a state dict")
    return LoadedCheckpoint(manifest.step, state, path, manifest.lineage)


def _targets(
    path: Path, layout: StateLayout, targets: dict[str, tuple[torch.Tensor, Sharding | None]], rank: int
) -> tuple[dict[str, torch.Tensor], list[torch.Tensor]]:
    """The DCP keys to load into which tensors, and the tensors in the layout's order."""
    tensors, to_load = [], {}
    for saved in layout.tensors:
        dtype, shape = DTYPES[saved.dtype], torch.Size(saved.shape)
        local, sharding = targets.get(saved.name, (None, None))
        if local is None:
            local = torch.empty(shape, dtype=dtype)
        # A shard is loaded through its DTensor (same storage): DCP reads just this rank's
        # part of the global tensor, whatever W the checkpoint was saved with.
        target = sharding.wrap(local) if sharding is not None else local
        if target.dtype != dtype or target.shape != shape:
            raise TemplateMismatch(
                f"{path.name}: tensor {saved.name} was saved as {saved.dtype}{list(shape)} but the template "
                f"has {str(target.dtype).removeprefix('torch.')}{list(target.shape)}; load with the model and "
                "optimizer configuration the checkpoint was written with"
            )
        tensors.append(local)
        # Sharded groups saved each rank's own value of the plain tensors; a rank the
        # checkpoint had no counterpart of (loading into a larger W) takes rank 0's.
        own = (rank if rank < layout.own_ranks else 0) if saved.own else None
        to_load[dcp_key(saved.name, own)] = target
    return to_load, tensors


def _template_tensors(template: Mapping[str, Any] | None) -> dict[str, tuple[torch.Tensor, Sharding | None]]:
    """Each template tensor by name: the tensor (a DTensor's local shard) and its sharding."""
    if template is None:
        return {}
    flat = flatten(template)
    shardings = flat.shardings or [None] * len(flat.tensors)
    return {name: (t, sh) for name, t, sh in zip(flat.names, flat.tensors, shardings, strict=True)}


class CheckpointReader:
    """The checkpoints of one run: ``directory`` and, optionally, its tier-2 copy.

    Stateless apart from the two paths; safe to use from any thread and any rank. Nothing
    here writes or deletes.
    """

    def __init__(self, directory: str | Path, *, tier2_directory: str | Path | None = None) -> None:
        self.directory = Path(directory)
        self.tier2_directory = Path(tier2_directory) if tier2_directory is not None else None

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
                infos.append(CheckpointInfo(name.step, path, 0, now - _mtime(path, now), False, str(e), name.lineage))
                continue
            valid, reason = verify(path) if verify_files else (None, "not verified")
            infos.append(CheckpointInfo(name.step, path, manifest.num_bytes, now - manifest.created_unix_s, valid,
                                        reason, name.lineage))
        return infos

    def ignored(self) -> list[tuple[Path, str]]:
        """Entries of ``directory`` named like a checkpoint that are not one, with the reason."""
        return scan_checkpoints(self.directory).ignored

    @staticmethod
    def verify(path: str | Path) -> tuple[bool, str]:
        """See :func:`verify`."""
        return verify(path)

    @staticmethod
    def load(path: str | Path, template: Mapping[str, Any] | None = None, *, rank: int = 0) -> LoadedCheckpoint:
        """Load one given checkpoint (e.g. to go back to a milestone); see :func:`load`."""
        return load(path, template, rank=rank)

    def candidates(self) -> list[tuple[Candidate, Path]]:
        """Every published checkpoint of both tiers, in the order a resume tries them (lineage.py)."""
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
        not match) is raised, since an older checkpoint would not match either. Blocks for
        as long as reading and hashing the checkpoints takes.
        """
        candidates = self.candidates()
        for i, (candidate, path) in enumerate(candidates):
            try:
                loaded = load(path, template, rank=rank)
            except CheckpointCorrupt as e:
                following = (
                    f"trying step {candidates[i + 1][0].step} ({candidates[i + 1][0].label})"
                    if i + 1 < len(candidates)
                    else "no older checkpoint left"
                )
                logger.warning("%s; skipping step %d, %s", e, candidate.step, following)
                continue
            newest = max(c.step for c, _ in candidates if c.lineage == candidate.lineage)
            logger.info("loaded checkpoint of step %d (lineage %s) from %s", candidate.step,
                        lineage_label(candidate.lineage), path)
            return loaded._replace(newest_in_lineage=candidate.step == newest)
        if candidates:
            logger.error("none of the %d checkpoints in %s is intact; starting without one", len(candidates), self.directory)
        return None


def _mtime(path: Path, default: float) -> float:
    try:
        return path.lstat().st_mtime
    except OSError:
        return default
