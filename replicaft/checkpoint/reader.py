"""Reading one checkpoint: find, verify every byte, load.

A checkpoint on disk may be incomplete (a writer killed before publishing leaves only a
``*.tmp-*`` directory, which is never read) or damaged after publishing (a flipped bit, a
truncated copy, a deleted pack). ``check_chain`` catches the second kind by checking every
file of the checkpoint and of its chain against their ``manifest.json`` before a single byte
is loaded, and ``load`` checks every chunk against its id as it decodes it; which checkpoint
to try first, and falling back past damaged ones, is ``tiers.py``'s.

Loading uses ``torch.distributed.checkpoint.load`` without a process group (``no_dist``)
through storage.py's reader (or, for the previous release's format, DCP's file reader with
legacy.py's restricted ``.metadata`` reader): a checkpoint written by a group of W ranks
loads into any other W. Replicated tensors are read whole; a template's DTensor (FSDP state)
is filled with just this rank's part of the saved global tensor; a plain tensor each rank of
a sharded group saved its own value of (``StateLayout.own_ranks``) is read from that rank's
copy (``rank``), or rank 0's when the checkpoint had fewer ranks. Template tensors of the
right name, dtype and shape are filled in place, DCP's usual contract, so a model on the GPU
is restored without a host copy of it; tensors the template lacks (a fresh optimizer's
moments) are allocated on the CPU.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import StorageReader

from replicaft.checkpoint.chunks import ChunkCodec, open_blob
from replicaft.checkpoint.durable import READ_BYTES
from replicaft.checkpoint.entries import MAX_SMALL_FILE_BYTES, judge, open_regular, read_small, scan
from replicaft.checkpoint.keys import KEY_ENV, KEY_FILE_ENV, EncryptionKey
from replicaft.checkpoint.layout import (
    DCP_METADATA_FILE,
    LEGACY_LINEAGE,
    MANIFEST_FILE,
    STATE_FILE,
    TENSORS_FILE,
    CheckpointName,
    checkpoint_dirname,
    dcp_key,
    lineage_label,
    parse_dirname,
)
from replicaft.checkpoint.legacy import SafeFileSystemReader
from replicaft.checkpoint.manifest import UNPLACED_SEALS_VERSIONS, CheckpointManifest, StateLayout
from replicaft.checkpoint.places import Place
from replicaft.checkpoint.storage import ChunkStorageReader
from replicaft.errors import CheckpointCorrupt, CheckpointKeyError, StateError
from replicaft.state.flat import DTYPES, Sharding, flatten, unflatten

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
    imported: bool = False
    """Made by ``replicaft-ckpt import`` (export.py): it holds only some entries of a state."""


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
            raise CheckpointCorrupt(
                f"{where} is missing: the save never finished publishing, or the file was deleted"
            ) from None
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
    for required in (STATE_FILE, DCP_METADATA_FILE if manifest.holds_dcp_files else TENSORS_FILE):
        if required not in listed:
            raise CheckpointCorrupt(f"{path.name}/{MANIFEST_FILE} does not list {required}")
    for entry in manifest.files:
        where = f"{path.name}/{entry.name}"
        size, got = _sha256(path / entry.name, where)
        if size != entry.num_bytes:
            raise CheckpointCorrupt(
                f"{where} is {size} bytes, the manifest says {entry.num_bytes} (truncated or overwritten)"
            )
        if got != entry.sha256:
            raise CheckpointCorrupt(f"{where} checksum mismatch (expected {entry.sha256[:8]}…, got {got[:8]}…)")
    return manifest


def check_chain(path: Path) -> CheckpointManifest:
    """:func:`check` checkpoint ``path`` and every checkpoint of its chain (the earlier ones,
    beside it, whose chunks it refers to); return its manifest. Raises CheckpointCorrupt
    naming the damaged link: an increment is restorable only with its whole chain."""
    manifest = check(path)
    for name in manifest.requires:
        try:
            check(path.parent / name)
        except CheckpointCorrupt as e:
            raise CheckpointCorrupt(f"{path.name} builds on {name}, which is not intact: {e}") from e
    return manifest


def verify(path: str | Path) -> tuple[bool, str]:
    """``(True, summary)`` if checkpoint directory ``path`` (and its chain) is complete and
    intact, else ``(False, reason)``. Needs no key: it checks the bytes as stored."""
    path = Path(path)
    try:
        manifest = check_chain(path)
    except CheckpointCorrupt as e:
        return False, str(e)
    chain = f", built on {len(manifest.requires)} earlier checkpoint(s), all intact" if manifest.requires else ""
    return True, f"{path.name}: {len(manifest.files)} files, {manifest.num_bytes} bytes, all checksums match{chain}"


def codec_for(manifest: CheckpointManifest, key: EncryptionKey | None, where: str) -> ChunkCodec:
    """The codec to read a checkpoint with; raises CheckpointKeyError (never CheckpointCorrupt)
    when it is encrypted and ``key`` is missing or another one."""
    if manifest.key_id is None:
        return ChunkCodec()
    if key is None:
        raise CheckpointKeyError(
            f"{where} is encrypted (key id {manifest.key_id}) and no key was given; set {KEY_FILE_ENV} (or "
            f"{KEY_ENV}) to the key it was written with. It is not damaged, and older checkpoints need the same key"
        )
    if key.key_id != manifest.key_id:
        raise CheckpointKeyError(
            f"{where} was encrypted under key id {manifest.key_id}, but the key given has id {key.key_id}: the wrong "
            f"key. Give the key it was written with ({KEY_FILE_ENV} or {KEY_ENV}); the checkpoint is not damaged"
        )
    unplaced = manifest.version in UNPLACED_SEALS_VERSIONS
    if unplaced:
        logger.warning(
            "%s is of format version %d: its sealed pieces are authenticated but not bound to their "
            "places (places.py); the next save writes a base of format version 4",
            where,
            manifest.version,
        )
    return ChunkCodec(key=key, unplaced_seals=unplaced)


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


def _storage_reader(path: Path, manifest: CheckpointManifest, codec: ChunkCodec) -> StorageReader:
    if manifest.holds_dcp_files:
        return SafeFileSystemReader(path, [f.name for f in manifest.files])
    chain = {path.name, *manifest.requires}

    def locate(location: str) -> Path:
        if location not in chain:
            raise CheckpointCorrupt(
                f"{path.name}/{TENSORS_FILE} refers to {location}, which is not in its chain {sorted(chain)}"
            )
        return path.parent / location

    return ChunkStorageReader(path, codec=codec, locate=locate)


class TemplateMismatch(StateError):
    """A template tensor's dtype or shape differs from the saved one: the model changed, and
    an older checkpoint would not match either, so this is raised rather than skipped."""


def load(
    path: str | Path, template: Mapping[str, Any] | None = None, *, rank: int = 0, key: EncryptionKey | None = None
) -> LoadedCheckpoint:
    """Verify, then load checkpoint directory ``path``.

    Tensors of ``template`` whose name, dtype and shape match the checkpoint are filled in
    place and returned; the rest are allocated on the CPU. Raises CheckpointCorrupt for any
    failure to read or decode the checkpoint (DCP's own ``CheckpointException``, a
    ``BaseException``, included), and StateError when a template tensor has another dtype
    or shape than the saved one (the model changed since the save), and CheckpointKeyError
    when it is encrypted and ``key`` is missing or wrong. Never runs pickle.
    """
    path = Path(path)
    manifest = check_chain(path)
    codec = codec_for(manifest, key, path.name)
    try:
        where = f"{path.name}/{STATE_FILE}"
        raw = open_blob(
            codec,
            read_small(path / STATE_FILE, where),
            encrypted=manifest.key_id is not None,
            max_bytes=MAX_SMALL_FILE_BYTES,
            where=where,
            place=Place.state(checkpoint_dirname(manifest.step, manifest.lineage)),
        )
        layout = StateLayout.decode(raw, where)
        to_load, tensors = _targets(path, layout, _template_tensors(template), rank)
        dcp.load(to_load, storage_reader=_storage_reader(path, manifest, codec), no_dist=True)
        _check_index(path, manifest, layout)  # after the chunks, whose refusals name the tensors
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
    return LoadedCheckpoint(
        manifest.step, state, path, manifest.lineage, imported=manifest.metadata.get("imported") is True
    )


def _check_index(path: Path, manifest: CheckpointManifest, layout: StateLayout) -> None:
    """Refuse a ``tensors.msgpack`` other than the one the state was saved with (StateLayout.index_sha256)."""
    sealed = manifest.key_id is not None and manifest.version not in UNPLACED_SEALS_VERSIONS
    if layout.index_sha256 is None and not sealed:
        return  # written before states named their index, or plain: nothing binds it
    listed = next((f.sha256 for f in manifest.files if f.name == TENSORS_FILE), None)
    if layout.index_sha256 != listed:
        said = f"{layout.index_sha256[:16]}…" if layout.index_sha256 is not None else "none"
        raise CheckpointCorrupt(
            f"{path.name}/{TENSORS_FILE}: refused: the state of step {manifest.step} was saved with the index of "
            f"SHA-256 {said}, this one is {str(listed)[:16]}… (an index copied in from another checkpoint)"
        )


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


def mtime(path: Path, default: float) -> float:
    try:
        return path.lstat().st_mtime
    except OSError:
        return default
