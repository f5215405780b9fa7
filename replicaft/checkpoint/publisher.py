"""Group rank 0's part of one save: the temporary directory before ``dcp.save``, the publish after.

Before every rank's ``dcp.save``: remove leftovers (once), pick the parent (chain.py), check
free space for what the save writes (the whole state for a base, the new chunks for an
increment: collective_save.py counts them) and create ``DIR/step-N-L.tmp-<token>``; the answer
is a :class:`Prepared`, which agreement.py hands to the other ranks. After it:
``state.msgpack``, check that the index lists every tensor, SHA-256 + fsync every file,
``manifest.json`` last, rename to ``DIR/step-N-L`` (durable.py), then the housekeeping
(housekeeping.py). Or, when a rank's write failed: say why, with the disk's state, and
remove the partial files.

Invariant: until the rename nothing a reader looks at has changed, so a crash at any point
leaves the previous checkpoint intact and at worst a ``*.tmp-*`` directory. Only rank 0
runs this module, so only one process ever names, renames or deletes checkpoints.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
import os
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp

from replicaft.checkpoint.agreement import Prepared
from replicaft.checkpoint.catalog_entry import code_version, installed_version
from replicaft.checkpoint.chain import ChainDecision, decide_chain
from replicaft.checkpoint.chainfiles import find_parent, known_chunks
from replicaft.checkpoint.chunks import ChunkCodec, seal_blob
from replicaft.checkpoint.durable import (
    discard,
    file_entry,
    new_token,
    publish,
    remove_partial,
    write_durably,
)
from replicaft.checkpoint.entries import judge, read_small
from replicaft.checkpoint.housekeeping import Housekeeper
from replicaft.checkpoint.index import ChunkRef, decode_index
from replicaft.checkpoint.labels import CODE_VERSION_KEY
from replicaft.checkpoint.layout import (
    MANIFEST_FILE,
    STATE_FILE,
    TENSORS_FILE,
    checkpoint_dirname,
    dcp_key,
    lineage_label,
    tmp_dirname,
)
from replicaft.checkpoint.manifest import FORMAT_VERSION, CheckpointManifest, StateLayout
from replicaft.checkpoint.places import Place
from replicaft.checkpoint.policy import enough_space
from replicaft.checkpoint.reader import check, scan_checkpoints
from replicaft.checkpoint.results import SaveResult
from replicaft.checkpoint.reuse import ReuseKey, reusable
from replicaft.errors import CheckpointCorrupt
from replicaft.state.flat import DIGEST_SCHEME, Flat, digest
from replicaft.transfer.snapshot import Snapshot

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class SaveRequest:
    """One save as the training thread asked for it (CheckpointWriter.save_async)."""

    snapshot: Snapshot
    step: int
    metadata: dict[str, Any]
    """The caller's JSON values, stored in ``manifest.json`` beside the writer's own."""
    lineage: str


def disk_free_bytes(directory: Path) -> int:
    return shutil.disk_usage(directory).free


def describe_error(error: BaseException) -> str:
    """One line for a save failure; DCP's CheckpointException is unwrapped to each rank's error."""
    if isinstance(error, dcp.CheckpointException):
        parts = []
        for rank, failure in sorted(error.failures.items()):
            cause = failure[0] if isinstance(failure, tuple) else failure  # (exception, traceback)
            parts.append(f"rank {rank}: {type(cause).__name__}: {cause}")
        return "; ".join(parts)
    return f"{type(error).__name__}: {error}"


class Publisher:
    """Group rank 0's stages of a save, run on the writer's background thread (they block on
    the disk). Built by :class:`CheckpointWriter` from its arguments, with no I/O."""

    def __init__(
        self,
        directory: Path,
        *,
        codec: ChunkCodec,
        chain_length: int,
        free_space_margin: float,
        free_bytes: Callable[[Path], int],
        housekeeper: Housekeeper,
        group_world_size: int,
        writer_id: str,
    ) -> None:
        self.directory = directory
        self.codec = codec
        self.chain_length = chain_length
        self.free_space_margin = free_space_margin
        self.free_bytes = free_bytes
        self.housekeeper = housekeeper
        self.group_world_size = group_world_size
        self.writer_id = writer_id
        self._last_chunks: tuple[str, tuple[int, int, int], dict[ReuseKey, ChunkRef]] | None = None
        """The name of the last checkpoint this writer published, its index file's identity
        (inode, size, mtime) and the chunks that index refers to (reuse.py): the next increment's
        parent, whose index need not be read again while the file is the one written."""

    def known_chunks(self, parent: str | None) -> dict[ReuseKey, ChunkRef]:
        """Every chunk the parent's index refers to (chainfiles.known_chunks), from memory when
        the parent is the checkpoint this writer published last and its index file is
        untouched since (~4 ms of each increment)."""
        if parent is not None and self._last_chunks is not None and self._last_chunks[0] == parent:
            with contextlib.suppress(OSError):
                if _identity(self.directory / parent / TENSORS_FILE) == self._last_chunks[1]:
                    return self._last_chunks[2]
        return known_chunks(self.directory, parent, sealed=self.codec.key is not None)

    def choose_chain(self, request: SaveRequest) -> ChainDecision | Prepared:
        """Clean leftovers once and decide base or increment (chain.py): the parent an
        increment's size is counted against before :meth:`prepare` checks it.

        Never raises: with W > 1 the other ranks wait for an answer, so any error comes back
        as the "failed" refusal that :meth:`prepare` then hands on.
        """
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            self.housekeeper.remove_leftovers_once(self.directory)
            return decide_chain(
                find_parent(self.directory, request.lineage), chain_length=self.chain_length, key_id=self.codec.key_id
            )
        except Exception as e:  # not only OSError: with W > 1 the other ranks wait for an answer
            return self._cannot_prepare(request.step, e)

    def prepare(self, request: SaveRequest, chain: ChainDecision | Prepared, estimated: int) -> Prepared:
        """Check free space for ``estimated`` bytes (the full estimate for a base, the new
        chunks for an increment: saveplan.py) and create the temporary directory; ``chain`` is
        :meth:`choose_chain`'s answer, a refusal of which is returned as it is.

        Never raises: with W > 1 the other ranks wait for an answer, so any error becomes a
        "failed" refusal and a full disk a "refused" one.
        """
        if isinstance(chain, Prepared):
            return chain
        step = request.step
        try:
            free = self.free_bytes(self.directory)
            space = enough_space(free, estimated, self.free_space_margin)
            if not space.ok:
                reason = (
                    f"not enough free space in {self.directory}: checkpoint of step {step} {space.reason}; "
                    f"training continues without it; free space there or lower "
                    f"keep_last={self.housekeeper.retention.keep_last}"
                )
                self._log(logging.ERROR, step, "checkpoint refused: %s", reason)
                return Prepared(None, SaveResult(step, "refused", reason, num_bytes=estimated))
            self._log(logging.DEBUG, step, "checkpoint is a %s of ~%d bytes: %s", chain.kind, estimated, chain.reason)
            tmp = self.directory / tmp_dirname(checkpoint_dirname(step, request.lineage), new_token())
            tmp.mkdir()
        except Exception as e:  # not only OSError: with W > 1 the other ranks wait for an answer
            return self._cannot_prepare(step, e)
        return Prepared(tmp, None, chain.parent, chain.chain_position, checkpoint_dirname(step, request.lineage))

    def _cannot_prepare(self, step: int, error: Exception) -> Prepared:
        reason = f"cannot prepare {self.directory} for the checkpoint of step {step}: {type(error).__name__}: {error}"
        self._log(logging.ERROR, step, "checkpoint failed: %s", reason)
        return Prepared(None, SaveResult(step, "failed", reason))

    def publish(
        self,
        request: SaveRequest,
        layout: StateLayout,
        tensors: list[torch.Tensor],
        hashes: Sequence[Sequence[bytes]],
        prepared: Prepared,
        started: float,
    ) -> SaveResult:
        """After every rank's ``dcp.save`` returned: seal, verify, rename, then tier 2 and retention.

        ``hashes`` are ``tensors``' content hashes (replicaft/state/content.py), for the digest.

        Raises OSError or CheckpointCorrupt (the index lacks a tensor) before the rename;
        the caller turns that into :meth:`fail`.
        """
        step = request.step
        tmp = prepared.tmp
        assert tmp is not None
        name = checkpoint_dirname(step, request.lineage)
        where = f"{tmp.name}/{TENSORS_FILE}"
        raw_index = read_small(tmp / TENSORS_FILE, where)
        index, pieces = decode_index(raw_index, where)
        bound = dataclasses.replace(layout, index_sha256=hashlib.sha256(raw_index).hexdigest())
        write_durably(tmp / STATE_FILE, seal_blob(self.codec, bound.encode(), Place.state(name)))
        saved = index.state_dict_metadata
        expected = [
            dcp_key(t.name, rank if t.own else None)
            for t in layout.tensors
            for rank in range(layout.own_ranks if t.own else 1)
        ]
        missing = [key for key in expected if key not in saved]
        if missing:
            raise CheckpointCorrupt(f"{tmp.name}: the tensor index lacks {len(missing)} tensors, e.g. {missing[:3]}")
        files = tuple(file_entry(p) for p in sorted(tmp.iterdir()) if p.is_file())
        state_digest = digest(Flat(layout.skeleton, tensors, [t.name for t in layout.tensors]), hashes)
        requires = tuple(sorted({ref.location for piece in pieces.values() for ref in piece.chunks} - {name}))
        manifest = CheckpointManifest(
            step,
            time.time(),
            files,
            {**self._base_metadata(request, state_digest), **request.metadata},
            request.lineage,
            FORMAT_VERSION,
            "increment" if requires else "base",
            requires,
            prepared.chain_position if requires else 1,
            self.codec.compression_level,
            self.codec.key_id,
        )
        write_durably(tmp / MANIFEST_FILE, manifest.encode())
        final = self.directory / checkpoint_dirname(step, request.lineage)
        if self._already_published(final, manifest, step):
            remove_partial(tmp)
            return SaveResult(
                step, "published", f"{final} already published", final, manifest.num_bytes, time.monotonic() - started
            )
        identity = _identity(tmp / TENSORS_FILE)
        publish(tmp, final)
        self._last_chunks = (
            final.name,
            identity,
            reusable(pieces, sealed=self.codec.key is not None),
        )
        seconds = time.monotonic() - started
        self._log(
            logging.INFO,
            step,
            "checkpoint published: %s (%s, %d bytes in %.2fs)",
            final,
            manifest.kind,
            manifest.num_bytes,
            seconds,
        )
        tier2_path, tier2_error, deleted, catalog_error = self.housekeeper.after_publish(final, manifest)
        return SaveResult(
            step,
            "published",
            f"published {final}",
            final,
            manifest.num_bytes,
            time.monotonic() - started,
            tier2_path,
            tier2_error,
            deleted,
            manifest.kind,
            catalog_error,
        )

    def fail(self, request: SaveRequest, tmp: Path, error: BaseException, estimated: int, started: float) -> SaveResult:
        """Describe the failure (with the disk's state), remove the partial files."""
        reason = f"writing the checkpoint of step {request.step} into {tmp} failed: {describe_error(error)}"
        try:
            free = disk_free_bytes(self.directory)
        except OSError:
            free = None
        if free is not None and free < estimated:
            # torch.save's zip writer turns ENOSPC into "unexpected pos" RuntimeErrors, so the
            # disk's state is the clearest evidence of the cause.
            reason += (
                f"; {self.directory} has only {free} bytes free of the ~{estimated} needed: the disk is "
                f"full (ENOSPC); free space there or lower keep_last={self.housekeeper.retention.keep_last}"
            )
        remove_partial(tmp)
        previous = [
            name
            for name, _ in scan_checkpoints(self.directory).found
            if name.lineage == request.lineage and name.step != request.step
        ]
        self._log(
            logging.ERROR,
            request.step,
            "checkpoint failed: %s; partial files removed, last checkpoint of this history: %s",
            reason,
            str(previous[0]) if previous else "none",
        )
        return SaveResult(request.step, "failed", reason, seconds=time.monotonic() - started)

    def _already_published(self, final: Path, manifest: CheckpointManifest, step: int) -> bool:
        """Whether ``final`` already holds this very save (same lineage, step and state
        digest, intact); clears the name otherwise. Another history's checkpoint of the same
        step has another name (layout.py), so it is never taken for this save."""
        kind = judge(final).kind
        if kind == "missing":
            return False
        if kind != "dir":
            self._log(logging.WARNING, step, "removing %s, a %s where this checkpoint is to be published", final, kind)
            final.unlink()
            return False
        try:
            existing = check(final)
        except CheckpointCorrupt as e:
            self._log(logging.WARNING, step, "replacing damaged checkpoint %s (%s)", final, e)
            discard(final, step)
            return False
        if existing.metadata.get("digest_scheme") != DIGEST_SCHEME:
            self._log(
                logging.INFO,
                step,
                "replacing %s: an older release wrote it, with another kind of state digest, "
                "so it cannot be told equal to this save",
                final,
            )
            discard(final, step)
            return False
        if existing.metadata.get("digest") == manifest.metadata["digest"]:
            self._log(logging.INFO, step, "checkpoint %s already published and intact; kept it", final)
            return True
        self._log(
            logging.WARNING,
            step,
            "replacing %s: it holds another state of step %d (digest %s, this save's %s) "
            "from a trajectory of lineage %s that no run continues",
            final,
            step,
            existing.metadata.get("digest"),
            manifest.metadata["digest"],
            lineage_label(manifest.lineage),
        )
        discard(final, step)
        return False

    def _base_metadata(self, request: SaveRequest, state_digest: str) -> dict[str, Any]:
        return {
            "quorum_id": request.snapshot.manifest.quorum_id,
            "replica_id": request.snapshot.manifest.replica_id,
            "group_world_size": self.group_world_size,
            "replicaft_version": installed_version(),
            "torch_version": torch.__version__,
            "digest": state_digest,
            "digest_scheme": DIGEST_SCHEME,
            CODE_VERSION_KEY: code_version(),
        }

    def _log(self, level: int, step: int, msg: str, *args: Any) -> None:
        logger.log(level, "[%s step=%d] " + msg, self.writer_id, step, *args)


def _identity(path: Path) -> tuple[int, int, int]:
    st = os.stat(path)
    return st.st_ino, st.st_size, st.st_mtime_ns
