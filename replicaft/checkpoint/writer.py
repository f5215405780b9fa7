"""The checkpoint writer: a host snapshot in, a published, checksummed DCP checkpoint out.

Training is blocked only for the host copy (:meth:`Snapshot.capture`, taken by the caller).
Everything else runs on the writer's one background thread, in this order::

    check free space, pick the parent (chain.py) -> mkdir DIR/step-N-L.tmp-<token>
    -> dcp.save through storage.py (each rank appends the chunks its parent's chain lacks to
       its pack, fsynced; the coordinator writes tensors.msgpack) -> state.msgpack
    -> verify the index lists every tensor -> SHA-256 + fsync every file -> manifest.json
    -> fsync dir -> rename to DIR/step-N-L -> fsync DIR -> tier-2 copy (verified)
    -> catalog row (catalog.py) -> retention on both tiers (keeping every chain a kept checkpoint
       needs, and what the object tier has yet to upload), its verdicts noted in the catalog

Invariants: a published directory is complete and never modified; until the rename, nothing
a reader looks at has changed, so a crash or SIGKILL at any point leaves the previous
checkpoint intact and at worst a ``*.tmp-*`` directory, which readers ignore and the next
writer removes. Retention runs only after a publish, so a failing disk never deletes the last
good checkpoint. A save that fails (ENOSPC, EIO, ...) or is refused (not enough free space)
is logged with the directory and numbers, reported in its :class:`SaveResult`, and its
partial files are removed; training carries on.

**Groups of W > 1 ranks.** Every rank of the writing group builds a writer with the same
``process_group`` (a group used for nothing else, e.g. ``dist.new_group(backend="gloo")``,
since saves run on a background thread concurrently with training collectives) and calls
:meth:`CheckpointWriter.save_async` for the same steps in the same order. Group rank 0 checks
space, creates the temporary directory and publishes; all ranks run ``dcp.save``, which
deduplicates the replicated tensors and spreads the writes across ranks; rank 0 broadcasts
the outcome, so every rank's handle reports the same result. ``directory`` must be visible
to all ranks at the same path. With W > 1 the *decision* to save must also be the same on
every rank: take it on group rank 0 (:meth:`CheckpointWriter.save_if_due`) and share it,
rather than letting each rank consult its own clock.

Rejected alternative: ``dcp.async_save``. It stages to host memory itself and returns a
future, but it would give us no point between "written" and "visible" to checksum, write the
manifest and rename, and it writes into the final directory name, so a crash leaves a
half-written checkpoint under the name readers look for.
"""

from __future__ import annotations

import concurrent.futures
import importlib.metadata
import json
import logging
import queue
import shutil
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import msgpack
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from replicaft.checkpoint.catalog import Catalog, code_version, entry_of
from replicaft.checkpoint.chain import decide_chain
from replicaft.checkpoint.chainfiles import find_parent, known_chunks, retention_facts
from replicaft.checkpoint.chunks import ChunkCodec, seal_blob
from replicaft.checkpoint.durable import (
    checksum_and_fsync,
    discard,
    new_token,
    publish,
    remove_leftovers,
    remove_partial,
    write_durably,
)
from replicaft.checkpoint.entries import judge, read_small
from replicaft.checkpoint.index import decode_index
from replicaft.checkpoint.keys import EncryptionKey
from replicaft.checkpoint.labels import CODE_VERSION_KEY
from replicaft.checkpoint.layout import (
    MANIFEST_FILE,
    STATE_FILE,
    TENSORS_FILE,
    checkpoint_dirname,
    dcp_key,
    is_lineage,
    lineage_label,
    new_lineage,
    tmp_dirname,
)
from replicaft.checkpoint.manifest import (
    FORMAT_VERSION,
    CheckpointManifest,
    SavedTensor,
    StateLayout,
)
from replicaft.checkpoint.objectstore import ObjectStore
from replicaft.checkpoint.objecttier import Uploader
from replicaft.checkpoint.options import BestMode, CheckpointOptions
from replicaft.checkpoint.policy import (
    SaveDecision,
    enough_space,
    estimate_checkpoint_bytes,
    should_save,
)
from replicaft.checkpoint.reader import check, scan_checkpoints
from replicaft.checkpoint.results import SaveHandle, SaveResult, WriterStatistics
from replicaft.checkpoint.retention import RetentionDecision, decide_retention
from replicaft.checkpoint.storage import ChunkStorageWriter
from replicaft.checkpoint.tier2 import copy_verified
from replicaft.errors import CheckpointCorrupt, ObjectStoreError, OptionsError
from replicaft.state import Flat, digest
from replicaft.threads import lower_thread_priority
from replicaft.transfer.snapshot import Snapshot, tensors_from_buffer

DEFAULT_CHAIN_LENGTH = 10
"""A full base every 10 saves: an increment costs what changed, a chain's damage reaches at
most 10 checkpoints, and a restore reads at most 10 directories (chain.py)."""
WRITER_NICENESS = 19
"""The writer thread's CPU niceness (Linux; the lowest priority). Training threads outrank it,
so serialising, checksumming and copying to tier 2 take the CPU time training leaves idle
instead of slowing its steps: measured on 2 cores at 1 GB, the step a save starts at was
~400 ms slower with the writer at the training's priority and ~100 ms slower at 19, and the
save took about 1.5x as long. A preemption save runs after training has stopped, so it
loses nothing by it."""

logger = logging.getLogger(__name__)

@dataclass(frozen=True, slots=True)
class _Job:
    snapshot: Snapshot
    step: int
    metadata: dict[str, Any]
    lineage: str
    future: concurrent.futures.Future[SaveResult]


@dataclass(frozen=True, slots=True)
class _Prepared:
    """Rank 0's go/no-go for one save, broadcast to the other ranks of the group."""

    tmp: Path | None
    refusal: SaveResult | None
    parent: str | None = None
    """The checkpoint whose chunks this save may reuse (chain.py); None for a base."""
    chain_position: int = 1
    name: str = ""
    """The checkpoint's final name (rank 0's lineage), which every rank's chunk references carry."""


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


class CheckpointWriter:
    """Writes persistent checkpoints of ``directory`` from host snapshots, one at a time.

    Build it anywhere (no I/O in the constructor); the background thread starts with the
    first save. Use as a context manager, or call :meth:`close`. Call ``save_async`` /
    ``save_if_due`` / ``pop_finished`` from one thread (the training thread).

    ``free_bytes`` reports the free bytes of a directory; it defaults to
    ``shutil.disk_usage`` and is a seam for filesystems that misreport it and for tests.

    ``wait_when_busy_s``: a save due while the previous one is still being written is skipped
    (policy.py says why), unless this is given: then ``save_if_due`` waits up to this long
    for the previous save first. Groups of W > 1 ranks need it: every rank must take the same
    decision, and whether "the previous save" has finished yet differs between ranks by the
    moments their threads take to return from the same collective save.
    """

    def __init__(
        self,
        directory: str | Path,
        *,
        tier2_directory: str | Path | None = None,
        keep_last: int = 3,
        milestone_every: int = 0,
        milestone_at_epoch_end: bool = False,
        keep_geometric_from: int = 0,
        keep_best_k: int = 0,
        keep_best_metric: str | None = None,
        keep_best_mode: BestMode = "min",
        interval_steps: int = 0,
        interval_s: float = 0.0,
        free_space_margin: float = 0.1,
        process_group: dist.ProcessGroup | None = None,
        writer_id: str = "-",
        free_bytes: Callable[[Path], int] = disk_free_bytes,
        wait_when_busy_s: float | None = None,
        lineage: str | None = None,
        chain_length: int = DEFAULT_CHAIN_LENGTH,
        compression_level: int = 0,
        encryption_key: EncryptionKey | None = None,
        object_store: ObjectStore | None = None,
    ) -> None:
        options = CheckpointOptions(
            directory=str(directory), tier2_directory=str(tier2_directory) if tier2_directory is not None else None,
            interval_steps=interval_steps, interval_s=interval_s, keep_last=keep_last, milestone_every=milestone_every,
            milestone_at_epoch_end=milestone_at_epoch_end, keep_geometric_from=keep_geometric_from,
            keep_best_k=keep_best_k, keep_best_metric=keep_best_metric, keep_best_mode=keep_best_mode,
            free_space_margin=free_space_margin, chain_length=chain_length, compression_level=compression_level,
        )
        self.directory = Path(directory)
        self.tier2_directory = Path(tier2_directory) if tier2_directory is not None else None
        self.retention = options.retention
        """Which checkpoints to keep after each publish (retention.py), in every tier."""
        self.interval_steps = interval_steps
        self.interval_s = interval_s
        self.free_space_margin = free_space_margin
        self.chain_length = chain_length
        self._codec = ChunkCodec(compression_level=compression_level, key=encryption_key)
        self.writer_id = writer_id
        if lineage is not None and not is_lineage(lineage):
            raise OptionsError(f"lineage={lineage!r} is not a lineage id; leave it None for a new history")
        self.lineage = lineage if lineage is not None else new_lineage()
        """The history saves belong to unless ``save_async`` names another (layout.py)."""
        self._pg = process_group
        self._rank = dist.get_rank(process_group) if process_group is not None else 0
        self._world_size = dist.get_world_size(process_group) if process_group is not None else 1
        self.uploader = (Uploader(object_store, self.directory, retention=self.retention, writer_id=writer_id)
                         if object_store is not None and self._rank == 0 else None)
        """Group rank 0's background upload of each published checkpoint to the object store."""
        self.catalog = Catalog(self.directory, tier2_directory=self.tier2_directory) if self._rank == 0 else None
        """Group rank 0 registers each publish and retention's verdicts there (catalog.py)."""
        self._free_bytes = free_bytes
        self.wait_when_busy_s = wait_when_busy_s
        self._last_handle: SaveHandle | None = None
        self._jobs: queue.Queue[_Job | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._finished: list[SaveResult] = []
        self._baseline: tuple[int, float] | None = None
        self._cleaned: set[Path] = set()
        self._stats = WriterStatistics(0, 0, 0, 0, 0, 0, None)
        self._closed = False

    # -- training thread -------------------------------------------------------------------

    def save_if_due(
        self,
        step: int,
        capture: Callable[[], Snapshot],
        *,
        metadata: Mapping[str, Any] | None = None,
        now: float | None = None,
        lineage: str | None = None,
    ) -> tuple[SaveDecision, SaveHandle | None]:
        """Start a save of the state after committed step ``step`` if an interval has elapsed.

        ``capture`` takes the host snapshot and is called only when a save starts (it is the
        only part that blocks training). See :meth:`decide`.
        """
        decision = self.decide(step, now=now)
        if decision.action != "save":
            return decision, None
        return decision, self.save_async(capture(), step, metadata, lineage=lineage)

    def decide(self, step: int, *, now: float | None = None) -> SaveDecision:
        """Whether a save of the state after committed step ``step`` starts now.

        Intervals count from the first step this is called with. A save due while the
        previous one is still being written is skipped, counted and logged (policy.py says
        why), unless ``wait_when_busy_s`` is set. On "save", the caller must follow with
        :meth:`save_async` for this step (:meth:`save_if_due` does both); ``now`` is
        ``time.monotonic()`` unless given.
        """
        now = time.monotonic() if now is None else now
        if self._baseline is None:
            self._baseline = (step, now)
            return SaveDecision("not_due", f"step {step} is the first step seen; intervals count from here")
        last_step, last_time = self._baseline
        previous = self._last_handle
        if self.wait_when_busy_s is not None and previous is not None and not previous.done():
            probe = should_save(step=step, now=now, last_saved_step=last_step, last_saved_time=last_time,
                                interval_steps=self.interval_steps, interval_s=self.interval_s, save_in_progress=False)
            if probe.action == "save":
                try:
                    previous.wait(self.wait_when_busy_s)
                except TimeoutError as e:
                    self._log(logging.ERROR, step, "%s; the save due now is skipped", e)
        decision = should_save(
            step=step,
            now=now,
            last_saved_step=last_step,
            last_saved_time=last_time,
            interval_steps=self.interval_steps,
            interval_s=self.interval_s,
            save_in_progress=self.statistics().num_pending > 0,
        )
        if decision.action == "not_due":
            return decision
        self._baseline = (step, now)
        if decision.action == "skip":
            with self._lock:
                self._stats = replace(self._stats, num_skipped=self._stats.num_skipped + 1)
                skipped = self._stats.num_skipped
            self._log(
                logging.WARNING, step, "%s (%d skipped so far; if this repeats, raise interval_steps/interval_s "
                "or give %s more bandwidth)", decision.reason, skipped, self.directory,
            )
        return decision

    def save_async(
        self, snapshot: Snapshot, step: int, metadata: Mapping[str, Any] | None = None, *, lineage: str | None = None
    ) -> SaveHandle:
        """Queue a save of ``snapshot`` as the checkpoint of ``step``; return at once.

        ``snapshot`` must not be modified afterwards. ``metadata`` (JSON values) is stored in
        ``manifest.json`` next to quorum id, world size, versions and the state digest.
        ``lineage`` is the history the state belongs to (the writer's own by default): the
        checkpoint is published as ``step-N-<lineage>``, so it never takes the place of
        another history's checkpoint of the same step.
        Saves run one at a time in call order; a save requested while another is running
        waits behind it (use ``save_if_due`` to skip instead). Raises ValueError if
        ``metadata`` is not JSON-serialisable, RuntimeError after :meth:`close`. Never
        raises for I/O: see the handle.
        """
        if self._closed:
            raise RuntimeError(f"the checkpoint writer for {self.directory} is closed; build a new one to save step {step}")
        lineage = self.lineage if lineage is None else lineage
        if not is_lineage(lineage):
            raise ValueError(f"lineage={lineage!r} for step {step} is not a lineage id")
        extra = dict(metadata or {})
        try:
            json.dumps(extra)
        except (TypeError, ValueError) as e:
            raise ValueError(f"checkpoint metadata for step {step} must hold JSON values only: {e}") from e
        future: concurrent.futures.Future[SaveResult] = concurrent.futures.Future()
        with self._lock:
            self._stats = replace(self._stats, num_pending=self._stats.num_pending + 1)
        if self._thread is None:
            self._thread = threading.Thread(target=self._work, name="replicaft-checkpoint", daemon=True)
            self._thread.start()
        self._jobs.put(_Job(snapshot, step, extra, lineage, future))
        self._last_handle = SaveHandle(step, future)
        return self._last_handle

    def pop_finished(self) -> list[SaveResult]:
        """Results of saves finished since the last call, oldest first (for events and logs)."""
        with self._lock:
            finished, self._finished = self._finished, []
        return finished

    def statistics(self) -> WriterStatistics:
        with self._lock:
            return self._stats

    def close(self, timeout_s: float = 60.0) -> bool:
        """Let queued saves and uploads finish, for at most ``timeout_s``; True if they all did.

        On a timeout the thread is left running (it is a daemon) and a warning names the
        directory: an unfinished save leaves only a temporary directory behind, an
        unfinished upload resumes with the next writer. The writer accepts no saves afterwards.
        """
        self._closed = True
        deadline = time.monotonic() + timeout_s
        saved = True
        if self._thread is not None:
            self._jobs.put(None)
            self._thread.join(timeout_s)
            saved = not self._thread.is_alive()
            if saved:
                self._thread = None
            else:
                logger.warning(
                    "[%s] checkpoint writer for %s still busy after %gs; abandoning its save (the previous "
                    "checkpoint is intact)", self.writer_id, self.directory, timeout_s,
                )
        uploaded = self.uploader.close(max(0.0, deadline - time.monotonic())) if self.uploader is not None else True
        if not uploaded:
            logger.warning("[%s] uploads to %s still pending after %gs; the next writer resumes them", self.writer_id,
                           self.uploader.store.url if self.uploader else "", timeout_s)
        return saved and uploaded

    def __enter__(self) -> CheckpointWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- writer thread ---------------------------------------------------------------------

    def _work(self) -> None:
        lower_thread_priority(WRITER_NICENESS, "the checkpoint writer")
        while (job := self._jobs.get()) is not None:
            try:
                result = self._save(job)
            except Exception as e:  # a bug here must not kill the thread and stall every later save
                logger.exception("[%s step=%d] checkpoint writer error", self.writer_id, job.step)
                result = SaveResult(job.step, "failed", f"internal error: {type(e).__name__}: {e}")
            with self._lock:
                s = self._stats
                self._stats = replace(
                    s,
                    num_pending=s.num_pending - 1,
                    num_published=s.num_published + (result.status == "published"),
                    num_refused=s.num_refused + (result.status == "refused"),
                    num_failed=s.num_failed + (result.status == "failed"),
                    num_tier2_failed=s.num_tier2_failed + (result.tier2_error is not None),
                    last_published_step=result.step if result.ok else s.last_published_step,
                )
                self._finished.append(result)
            job.future.set_result(result)

    def _save(self, job: _Job) -> SaveResult:
        started = time.monotonic()
        leader = self._rank == 0
        snapshot = job.snapshot
        shardings = snapshot.shardings or (None,) * len(snapshot.manifest.tensors)
        sharded = snapshot.shardings is not None
        own_ranks = self._world_size if sharded and self._world_size > 1 else 0
        layout = StateLayout(
            snapshot.manifest.skeleton,
            tuple(SavedTensor(t.name, t.dtype, tuple(sh.shape) if sh is not None else t.shape, bool(own_ranks) and sh is None)
                  for t, sh in zip(snapshot.manifest.tensors, shardings, strict=True)),
            own_ranks,
        )
        # Replicated tensors are written once; every rank writes its shards and own values.
        shard_factor = self._world_size if sharded else 1
        estimated = estimate_checkpoint_bytes(
            num_tensor_bytes=snapshot.manifest.total_bytes * shard_factor,
            num_tensors=len(layout.tensors),
            num_skeleton_bytes=len(layout.encode()),
        )
        prepared = self._agree_prepared(self._prepare(job, estimated) if leader else None)
        if prepared.refusal is not None:
            return prepared.refusal
        assert prepared.tmp is not None
        tensors = tensors_from_buffer(snapshot.buffer, snapshot.manifest)
        try:
            storage = ChunkStorageWriter(prepared.tmp, rank=self._rank, location=prepared.name,
                                         codec=self._codec, known=known_chunks(self.directory, prepared.parent))
            dcp.save(
                {dcp_key(spec.name, self._rank if spec.own else None): sh.wrap(t) if sh is not None else t
                 for spec, t, sh in zip(layout.tensors, tensors, shardings, strict=True)},
                storage_writer=storage,
                process_group=self._pg,
                no_dist=self._pg is None,
            )
            result = self._publish(job, layout, tensors, prepared, started) if leader else None
        # DCP's CheckpointException derives from BaseException, so name it; the rest are
        # OSError (ENOSPC, EIO), CheckpointCorrupt, and torch's RuntimeErrors from torch.save.
        except (Exception, dcp.CheckpointException) as e:
            result = self._fail(job, prepared.tmp, e, estimated, started) if leader else None
        return self._agree_result(result)

    def _prepare(self, job: _Job, estimated: int) -> _Prepared:
        """Rank 0: clean leftovers once, check free space, create the temporary directory."""
        step = job.step
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._remove_leftovers_once(self.directory)
            free = self._free_bytes(self.directory)
            space = enough_space(free, estimated, self.free_space_margin)
            if not space.ok:
                reason = (
                    f"not enough free space in {self.directory}: checkpoint of step {step} {space.reason}; "
                    f"training continues without it; free space there or lower keep_last={self.retention.keep_last}"
                )
                self._log(logging.ERROR, step, "checkpoint refused: %s", reason)
                return _Prepared(None, SaveResult(step, "refused", reason, num_bytes=estimated))
            chain = decide_chain(find_parent(self.directory, job.lineage), chain_length=self.chain_length,
                                 key_id=self._codec.key_id)
            self._log(logging.DEBUG, step, "checkpoint is a %s: %s", chain.kind, chain.reason)
            tmp = self.directory / tmp_dirname(checkpoint_dirname(step, job.lineage), new_token())
            tmp.mkdir()
        except Exception as e:  # not only OSError: with W > 1 the other ranks wait for an answer
            reason = f"cannot prepare {self.directory} for the checkpoint of step {step}: {type(e).__name__}: {e}"
            self._log(logging.ERROR, step, "checkpoint failed: %s", reason)
            return _Prepared(None, SaveResult(step, "failed", reason))
        return _Prepared(tmp, None, chain.parent, chain.chain_position, checkpoint_dirname(step, job.lineage))

    def _publish(self, job: _Job, layout: StateLayout, tensors: list[torch.Tensor], prepared: _Prepared,
                 started: float) -> SaveResult:
        """Rank 0, after every rank's ``dcp.save`` returned: seal, verify, rename, then tier 2 and retention."""
        step = job.step
        tmp = prepared.tmp
        assert tmp is not None
        write_durably(tmp / STATE_FILE, seal_blob(self._codec, layout.encode()))
        where = f"{tmp.name}/{TENSORS_FILE}"
        index, pieces = decode_index(read_small(tmp / TENSORS_FILE, where), where)
        saved = index.state_dict_metadata
        expected = [dcp_key(t.name, rank if t.own else None) for t in layout.tensors
                    for rank in range(layout.own_ranks if t.own else 1)]
        missing = [key for key in expected if key not in saved]
        if missing:
            raise CheckpointCorrupt(f"{tmp.name}: the tensor index lacks {len(missing)} tensors, e.g. {missing[:3]}")
        files = tuple(checksum_and_fsync(p) for p in sorted(tmp.iterdir()) if p.is_file())
        state_digest = digest(Flat(layout.skeleton, tensors, [t.name for t in layout.tensors]))
        name = checkpoint_dirname(step, job.lineage)
        requires = tuple(sorted({ref.location for piece in pieces.values() for ref in piece.chunks} - {name}))
        manifest = CheckpointManifest(
            step, time.time(), files, {**self._base_metadata(job, state_digest), **job.metadata}, job.lineage,
            FORMAT_VERSION, "increment" if requires else "base", requires, prepared.chain_position if requires else 1,
            self._codec.compression_level, self._codec.key_id,
        )
        write_durably(tmp / MANIFEST_FILE, manifest.encode())
        final = self.directory / checkpoint_dirname(step, job.lineage)
        if self._already_published(final, manifest, step):
            remove_partial(tmp)
            return SaveResult(step, "published", f"{final} already published", final, manifest.num_bytes, time.monotonic() - started)
        publish(tmp, final)
        seconds = time.monotonic() - started
        self._log(logging.INFO, step, "checkpoint published: %s (%s, %d bytes in %.2fs)", final, manifest.kind,
                  manifest.num_bytes, seconds)
        tier2_path, tier2_error = self._copy_to_tier2(final, manifest)
        if self.uploader is not None:
            self.uploader.submit(final)
        if self.catalog is not None:
            self.catalog.record(entry_of(final.name, manifest, tiers=("local", "tier2") if tier2_path else ("local",)))
        deleted = self._apply_retention(self.directory, step, job.lineage)
        return SaveResult(
            step, "published", f"published {final}", final, manifest.num_bytes, time.monotonic() - started,
            tier2_path, tier2_error, deleted, manifest.kind,
        )

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
        if existing.metadata.get("digest") == manifest.metadata["digest"]:
            self._log(logging.INFO, step, "checkpoint %s already published and intact; kept it", final)
            return True
        self._log(logging.WARNING, step, "replacing %s: it holds another state of step %d (digest %s, this save's %s) "
                  "from a trajectory of lineage %s that no run continues", final, step, existing.metadata.get("digest"),
                  manifest.metadata["digest"], lineage_label(manifest.lineage))
        discard(final, step)
        return False

    def _fail(self, job: _Job, tmp: Path, error: BaseException, estimated: int, started: float) -> SaveResult:
        """Rank 0: describe the failure (with the disk's state), remove the partial files."""
        reason = f"writing the checkpoint of step {job.step} into {tmp} failed: {describe_error(error)}"
        try:
            free = disk_free_bytes(self.directory)
        except OSError:
            free = None
        if free is not None and free < estimated:
            # torch.save's zip writer turns ENOSPC into "unexpected pos" RuntimeErrors, so the
            # disk's state is the clearest evidence of the cause.
            reason += (
                f"; {self.directory} has only {free} bytes free of the ~{estimated} needed: the disk is "
                f"full (ENOSPC); free space there or lower keep_last={self.retention.keep_last}"
            )
        remove_partial(tmp)
        previous = [name for name, _ in scan_checkpoints(self.directory).found
                    if name.lineage == job.lineage and name.step != job.step]
        self._log(
            logging.ERROR, job.step, "checkpoint failed: %s; partial files removed, last checkpoint of this history: %s",
            reason, str(previous[0]) if previous else "none",
        )
        return SaveResult(job.step, "failed", reason, seconds=time.monotonic() - started)

    def _copy_to_tier2(self, final: Path, manifest: CheckpointManifest) -> tuple[Path | None, str | None]:
        if self.tier2_directory is None:
            return None, None
        try:
            self.tier2_directory.mkdir(parents=True, exist_ok=True)
            self._remove_leftovers_once(self.tier2_directory)
            copy = copy_verified(final, self.tier2_directory, manifest)
        except (OSError, CheckpointCorrupt) as e:
            error = f"copying {final} to tier 2 ({self.tier2_directory}) failed: {type(e).__name__}: {e}"
            self._log(logging.ERROR, manifest.step, "%s; the tier-1 checkpoint is unaffected", error)
            return None, error
        self._apply_retention(self.tier2_directory, manifest.step, manifest.lineage)
        return copy, None

    def _apply_retention(self, directory: Path, step: int, lineage: str) -> tuple[int, ...]:
        """Delete what retention says among this history's checkpoints (another history's are
        not this writer's to judge); one failed delete is logged and does not stop the others."""
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
        if self.catalog is not None:
            self._catalog_retention(directory, lineage, decision, deleted)
        return tuple(deleted)

    def _catalog_retention(self, directory: Path, lineage: str, decision: RetentionDecision, deleted: list[int]) -> None:
        """The catalog after retention: why each checkpoint is kept, and which are gone from where."""
        assert self.catalog is not None
        gone = [checkpoint_dirname(old, lineage) for old in deleted]
        if directory != self.directory:
            self.catalog.set_tier(gone, "tier2", present=False)
            return
        self.catalog.set_roles({checkpoint_dirname(v.step, lineage): v.kept_as for v in decision.verdicts if v.keep})
        self.catalog.remove(gone)

    def _remove_leftovers_once(self, directory: Path) -> None:
        """Remove ``*.tmp-*`` left by crashed saves, before this writer's first save there;
        the first time in ``directory``, queue the uploads an earlier uploader did not finish."""
        if directory in self._cleaned:
            return
        self._cleaned.add(directory)
        if self.uploader is not None and directory == self.directory:
            try:
                self.uploader.resume_pending()
            except ObjectStoreError as e:
                logger.error("[%s] cannot list %s to resume unfinished uploads: %s", self.writer_id,
                             self.uploader.store.url, e)
        for name in remove_leftovers(directory):
            logger.info("[%s] removed %s/%s, left by an interrupted save or delete", self.writer_id, directory, name)

    def _base_metadata(self, job: _Job, state_digest: str) -> dict[str, Any]:
        try:
            version = importlib.metadata.version("replicaft")
        except importlib.metadata.PackageNotFoundError:
            version = "unknown"
        return {
            "quorum_id": job.snapshot.manifest.quorum_id,
            "replica_id": job.snapshot.manifest.replica_id,
            "group_world_size": self._world_size,
            "replicaft_version": version,
            "torch_version": torch.__version__,
            "digest": state_digest,
            CODE_VERSION_KEY: code_version(),
        }

    def _agree_prepared(self, prepared: _Prepared | None) -> _Prepared:
        """Group rank 0's go/no-go on every rank (rank 0 passes it, the others None)."""
        if self._pg is None:
            assert prepared is not None
            return prepared
        wire = None
        if prepared is not None:
            refusal = prepared.refusal.to_wire() if prepared.refusal is not None else None
            wire = {"tmp": str(prepared.tmp) if prepared.tmp is not None else None, "refusal": refusal}
            wire["parent"], wire["chain_position"], wire["name"] = prepared.parent, prepared.chain_position, prepared.name
        d = self._agree(wire)
        return _Prepared(Path(d["tmp"]) if d["tmp"] is not None else None,
                         SaveResult.from_wire(d["refusal"]) if d["refusal"] is not None else None,
                         d["parent"], d["chain_position"], d["name"])

    def _agree_result(self, result: SaveResult | None) -> SaveResult:
        """Group rank 0's result on every rank (rank 0 passes it, the others None)."""
        if self._pg is None:
            assert result is not None
            return result
        return SaveResult.from_wire(self._agree(result.to_wire() if result is not None else None))

    def _agree(self, value: dict[str, Any] | None) -> dict[str, Any]:
        """Broadcast rank 0's ``value`` in the group as msgpack bytes (never pickle)."""
        assert self._pg is not None
        src = dist.get_global_rank(self._pg, 0)
        payload = msgpack.packb(value, use_bin_type=True) if value is not None else b""
        size = torch.tensor([len(payload)], dtype=torch.int64)
        dist.broadcast(size, src=src, group=self._pg)
        data = torch.frombuffer(bytearray(payload), dtype=torch.uint8) if value is not None else torch.empty(int(size), dtype=torch.uint8)
        dist.broadcast(data, src=src, group=self._pg)
        return msgpack.unpackb(data.numpy().tobytes(), raw=False)

    def _log(self, level: int, step: int, msg: str, *args: Any) -> None:
        logger.log(level, "[%s step=%d] " + msg, self.writer_id, step, *args)

