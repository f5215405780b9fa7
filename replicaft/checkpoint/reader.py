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

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import torch
import torch.distributed.checkpoint as dcp

from replicaft.checkpoint.durable import file_sha256
from replicaft.checkpoint.layout import (
    DCP_METADATA_FILE,
    MANIFEST_FILE,
    STATE_FILE,
    dcp_key,
    parse_step_dirname,
)
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


class LoadedCheckpoint(NamedTuple):
    step: int
    state: dict[str, Any]
    path: Path


def _label(path: Path) -> str:
    """``step-000000400`` or ``tier2/step-000000400``: short enough for a log line."""
    return f"{path.parent.name}/{path.name}" if parse_step_dirname(path.name) is None else path.name


def read_manifest(path: Path) -> CheckpointManifest:
    """The parsed ``manifest.json`` of checkpoint directory ``path``; raises CheckpointCorrupt."""
    manifest_path = path / MANIFEST_FILE
    try:
        raw = manifest_path.read_bytes()
    except FileNotFoundError:
        raise CheckpointCorrupt(
            f"{path.name}/{MANIFEST_FILE} is missing: the save never finished publishing, or the "
            "file was deleted"
        ) from None
    except OSError as e:
        raise CheckpointCorrupt(f"{path.name}/{MANIFEST_FILE} cannot be read ({e})") from e
    return CheckpointManifest.decode(raw, f"{path.name}/{MANIFEST_FILE}")


def check(path: Path, *, expected_step: int | None = None) -> CheckpointManifest:
    """Verify checkpoint directory ``path`` file by file; return its manifest.

    Raises CheckpointCorrupt naming the first file that is missing, has the wrong size, or
    fails its SHA-256. ``expected_step`` defaults to the step in the directory's name.
    """
    if not path.is_dir():
        raise CheckpointCorrupt(f"{path} is not a directory")
    manifest = read_manifest(path)
    step = parse_step_dirname(path.name) if expected_step is None else expected_step
    if step is not None and manifest.step != step:
        raise CheckpointCorrupt(f"{path.name}/{MANIFEST_FILE} says step {manifest.step}, the directory step {step}")
    listed = {f.name for f in manifest.files}
    for required in (STATE_FILE, DCP_METADATA_FILE):
        if required not in listed:
            raise CheckpointCorrupt(f"{path.name}/{MANIFEST_FILE} does not list {required}")
    for entry in manifest.files:
        where = f"{path.name}/{entry.name}"
        try:
            size = (path / entry.name).stat().st_size
        except FileNotFoundError:
            raise CheckpointCorrupt(f"{where} is missing") from None
        if size != entry.num_bytes:
            raise CheckpointCorrupt(f"{where} is {size} bytes, the manifest says {entry.num_bytes} (truncated or overwritten)")
        try:
            _, got = file_sha256(path / entry.name)
        except OSError as e:
            raise CheckpointCorrupt(f"{where} cannot be read ({e})") from e
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


def published(directory: Path) -> list[tuple[int, Path]]:
    """``(step, path)`` of every published checkpoint in ``directory``, newest first.

    Temporary (``*.tmp-*``) directories are not included; a missing directory has none.
    """
    if not directory.is_dir():
        return []
    found = [(step, entry) for entry in directory.iterdir() if (step := parse_step_dirname(entry.name)) is not None]
    return sorted(found, reverse=True)


def load(path: str | Path, template: Mapping[str, Any] | None = None, *, rank: int = 0) -> LoadedCheckpoint:
    """Verify, then load checkpoint directory ``path``.

    Tensors of ``template`` whose name, dtype and shape match the checkpoint are filled in
    place and returned; the rest are allocated on the CPU. Raises CheckpointCorrupt when the
    checkpoint fails verification or cannot be decoded, and StateError when a template tensor
    has another dtype or shape than the saved one (the model changed since the save).
    """
    path = Path(path)
    manifest = check(path)
    layout = StateLayout.decode((path / STATE_FILE).read_bytes(), f"{path.name}/{STATE_FILE}")
    targets = _template_tensors(template)
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
            raise StateError(
                f"{path.name}: tensor {saved.name} was saved as {saved.dtype}{list(shape)} but the template "
                f"has {str(target.dtype).removeprefix('torch.')}{list(target.shape)}; load with the model and "
                "optimizer configuration the checkpoint was written with"
            )
        tensors.append(local)
        # Sharded groups saved each rank's own value of the plain tensors; a rank the
        # checkpoint had no counterpart of (loading into a larger W) takes rank 0's.
        own = (rank if rank < layout.own_ranks else 0) if saved.own else None
        to_load[dcp_key(saved.name, own)] = target
    try:
        dcp.load(to_load, storage_reader=dcp.FileSystemReader(str(path)), no_dist=True)
    except Exception as e:  # DCP wraps storage errors in several types
        raise CheckpointCorrupt(f"{path.name}: DCP could not load the tensors ({type(e).__name__}: {e})") from e
    try:
        state = unflatten(layout.skeleton, tensors)
    except StateError as e:
        raise CheckpointCorrupt(f"{path.name}/{STATE_FILE}: {e}") from e
    if not isinstance(state, dict):
        raise CheckpointCorrupt(f"{path.name}/{STATE_FILE} holds a {type(state).__name__}, not a state dict")
    return LoadedCheckpoint(manifest.step, state, path)


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
        """Published checkpoints in ``directory``, newest first.

        ``verify_files=False`` skips reading every byte (fast; ``valid`` is then None).
        """
        now = time.time() if now is None else now
        infos = []
        for step, path in published(self.directory):
            try:
                manifest = read_manifest(path)
            except CheckpointCorrupt as e:
                infos.append(CheckpointInfo(step, path, 0, now - path.stat().st_mtime, False, str(e)))
                continue
            valid, reason = verify(path) if verify_files else (None, "not verified")
            infos.append(CheckpointInfo(step, path, manifest.num_bytes, now - manifest.created_unix_s, valid, reason))
        return infos

    @staticmethod
    def verify(path: str | Path) -> tuple[bool, str]:
        """See :func:`verify`."""
        return verify(path)

    @staticmethod
    def load(path: str | Path, template: Mapping[str, Any] | None = None, *, rank: int = 0) -> LoadedCheckpoint:
        """Load one given checkpoint (e.g. to go back to a milestone); see :func:`load`."""
        return load(path, template, rank=rank)

    def load_latest_valid(self, template: Mapping[str, Any] | None = None, *, rank: int = 0) -> LoadedCheckpoint | None:
        """Load the newest checkpoint that verifies, from ``directory`` then tier 2; None if none does.

        Call at startup only when no peer can donate (peers are always fresher). Damaged
        checkpoints are skipped with a warning naming the file and the reason; a StateError
        (template does not match) is raised, since an older checkpoint would not match either.
        Blocks for as long as reading and hashing the checkpoints takes.
        """
        candidates = [(step, 0, path) for step, path in published(self.directory)]
        if self.tier2_directory is not None:
            candidates += [(step, 1, path) for step, path in published(self.tier2_directory)]
        candidates.sort(key=lambda c: (-c[0], c[1]))
        for i, (step, _, path) in enumerate(candidates):
            try:
                loaded = load(path, template, rank=rank)
            except CheckpointCorrupt as e:
                following = (
                    f"trying step {candidates[i + 1][0]} ({_label(candidates[i + 1][2])})"
                    if i + 1 < len(candidates)
                    else "no older checkpoint left"
                )
                logger.warning("%s; skipping step %d, %s", e, step, following)
                continue
            logger.info("loaded checkpoint of step %d from %s", step, path)
            return loaded
        if candidates:
            logger.error("none of the %d checkpoints in %s is intact; starting without one", len(candidates), self.directory)
        return None
