"""The checkpoint writer: a host snapshot in, a published, checksummed DCP checkpoint out.

Training is blocked only for the host copy (:meth:`Snapshot.capture`, taken by the caller).
Everything else runs on the writer's one background thread, in this order::

    layout and estimated size (saveplan.py)
    -> check free space, pick the parent (chain.py) -> mkdir DIR/step-N-L.tmp-<token>  (publisher.py)
    -> dcp.save through storage.py (each rank appends the chunks its parent's chain lacks to
       its pack, fsynced; the coordinator writes tensors.msgpack) -> state.msgpack
    -> verify the index lists every tensor -> SHA-256 + fsync every file -> manifest.json
    -> fsync dir -> rename to DIR/step-N-L -> fsync DIR                          (publisher.py)
    -> tier-2 copy (verified) -> catalog row (catalog.py) -> retention on both tiers (keeping
       every chain a kept checkpoint needs, and what the object tier has yet to upload), its
       verdicts noted in the catalog                                            (housekeeping.py)

This module keeps the training thread's side (when a save is due, the queue, the counters,
:meth:`CheckpointWriter.close`) and the one background thread that runs the stages in order.

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
its go/no-go and the outcome (agreement.py), so every rank's handle reports the same result.
``directory`` must be visible to all ranks at the same path. With W > 1 the *decision* to save
must also be the same on every rank: take it on group rank 0
(:meth:`CheckpointWriter.save_if_due`) and share it, rather than letting each rank consult its
own clock.

Rejected alternative: ``dcp.async_save``. It stages to host memory itself and returns a
future, but it would give us no point between "written" and "visible" to checksum, write the
manifest and rename, and it writes into the final directory name, so a crash leaves a
half-written checkpoint under the name readers look for.
"""

from __future__ import annotations

import concurrent.futures
import functools
import json
import logging
import queue
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from replicaft.checkpoint.agreement import agree_prepared, agree_result
from replicaft.checkpoint.catalog import Catalog
from replicaft.checkpoint.chunks import ChunkCodec
from replicaft.checkpoint.housekeeping import Housekeeper
from replicaft.checkpoint.keys import EncryptionKey
from replicaft.checkpoint.layout import dcp_key, is_lineage, new_lineage
from replicaft.checkpoint.objectstore import ObjectStore
from replicaft.checkpoint.objecttier import Uploader
from replicaft.checkpoint.options import BestMode, CheckpointOptions
from replicaft.checkpoint.policy import SaveDecision, should_save
from replicaft.checkpoint.publisher import Publisher, SaveRequest, disk_free_bytes
from replicaft.checkpoint.results import SaveHandle, SaveResult, WriterStatistics
from replicaft.checkpoint.saveplan import increment_bytes, plan_save
from replicaft.checkpoint.storage import ChunkStorageWriter
from replicaft.errors import OptionsError
from replicaft.process.threads import lower_thread_priority
from replicaft.state.content import buffer_hashes
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
    request: SaveRequest
    future: concurrent.futures.Future[SaveResult]


def _counted(stats: WriterStatistics, result: SaveResult) -> WriterStatistics:
    """The writer's counters once the save of ``result`` has finished."""
    return replace(
        stats,
        num_pending=stats.num_pending - 1,
        num_published=stats.num_published + (result.status == "published"),
        num_refused=stats.num_refused + (result.status == "refused"),
        num_failed=stats.num_failed + (result.status == "failed"),
        num_tier2_failed=stats.num_tier2_failed + (result.tier2_error is not None),
        last_published_step=result.step if result.ok else stats.last_published_step,
    )


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
            directory=str(directory),
            tier2_directory=str(tier2_directory) if tier2_directory is not None else None,
            interval_steps=interval_steps,
            interval_s=interval_s,
            keep_last=keep_last,
            milestone_every=milestone_every,
            milestone_at_epoch_end=milestone_at_epoch_end,
            keep_geometric_from=keep_geometric_from,
            keep_best_k=keep_best_k,
            keep_best_metric=keep_best_metric,
            keep_best_mode=keep_best_mode,
            free_space_margin=free_space_margin,
            chain_length=chain_length,
            compression_level=compression_level,
        )
        self.directory = Path(directory)
        self.tier2_directory = Path(tier2_directory) if tier2_directory is not None else None
        self.retention = options.retention
        """Which checkpoints to keep after each publish (retention.py), in every tier."""
        self.interval_steps = interval_steps
        self.interval_s = interval_s
        self._codec = ChunkCodec(compression_level=compression_level, key=encryption_key)
        self.writer_id = writer_id
        if lineage is not None and not is_lineage(lineage):
            raise OptionsError(f"lineage={lineage!r} is not a lineage id; leave it None for a new history")
        self.lineage = lineage if lineage is not None else new_lineage()
        """The history saves belong to unless ``save_async`` names another (layout.py)."""
        self._pg = process_group
        self._rank = dist.get_rank(process_group) if process_group is not None else 0
        self._world_size = dist.get_world_size(process_group) if process_group is not None else 1
        self.uploader = (
            Uploader(object_store, self.directory, retention=self.retention, writer_id=writer_id)
            if object_store is not None and self._rank == 0
            else None
        )
        """Group rank 0's background upload of each published checkpoint to the object store."""
        self.catalog = Catalog(self.directory, tier2_directory=self.tier2_directory) if self._rank == 0 else None
        """Group rank 0 registers each publish and retention's verdicts there (catalog.py)."""
        self._publisher = Publisher(
            self.directory,
            codec=self._codec,
            chain_length=chain_length,
            free_space_margin=free_space_margin,
            free_bytes=free_bytes,
            group_world_size=self._world_size,
            writer_id=writer_id,
            housekeeper=Housekeeper(
                self.directory,
                tier2_directory=self.tier2_directory,
                retention=self.retention,
                uploader=self.uploader,
                catalog=self.catalog,
                writer_id=writer_id,
            ),
        )
        """Group rank 0's stages of each save (publisher.py); the others only ask it for a parent's chunks."""
        self.wait_when_busy_s = wait_when_busy_s
        self._last_handle: SaveHandle | None = None
        self._jobs: queue.Queue[_Job | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._finished: list[SaveResult] = []
        self._baseline: tuple[int, float] | None = None
        self._stats = WriterStatistics(0, 0, 0, 0, 0, 0, None)
        self._closed = False

    @property
    def chain_length(self) -> int:
        """A full base every ``chain_length`` saves (chain.py)."""
        return self._publisher.chain_length

    @property
    def free_space_margin(self) -> float:
        """The free space a save needs beyond its estimated size, as a fraction of it (policy.py)."""
        return self._publisher.free_space_margin

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
            probe = should_save(
                step=step,
                now=now,
                last_saved_step=last_step,
                last_saved_time=last_time,
                interval_steps=self.interval_steps,
                interval_s=self.interval_s,
                save_in_progress=False,
            )
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
                logging.WARNING,
                step,
                "%s (%d skipped so far; if this repeats, raise interval_steps/interval_s or give %s more bandwidth)",
                decision.reason,
                skipped,
                self.directory,
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
            raise RuntimeError(
                f"the checkpoint writer for {self.directory} is closed; build a new one to save step {step}"
            )
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
        self._jobs.put(_Job(SaveRequest(snapshot, step, extra, lineage), future))
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
                    "checkpoint is intact)",
                    self.writer_id,
                    self.directory,
                    timeout_s,
                )
        uploaded = self.uploader.close(max(0.0, deadline - time.monotonic())) if self.uploader is not None else True
        if not uploaded:
            logger.warning(
                "[%s] uploads to %s still pending after %gs; the next writer resumes them",
                self.writer_id,
                self.uploader.store.url if self.uploader else "",
                timeout_s,
            )
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
                result = self._save(job.request)
            except Exception as e:  # a bug here must not kill the thread and stall every later save
                logger.exception("[%s step=%d] checkpoint writer error", self.writer_id, job.request.step)
                result = SaveResult(job.request.step, "failed", f"internal error: {type(e).__name__}: {e}")
            with self._lock:
                self._stats = _counted(self._stats, result)
                self._finished.append(result)
            job.future.set_result(result)

    def _save(self, request: SaveRequest) -> SaveResult:
        started = time.monotonic()
        leader = self._rank == 0
        plan = plan_save(request.snapshot, self._world_size)
        content_hashes = functools.cache(  # once: for an increment's free-space check, then the write
            lambda: buffer_hashes(
                request.snapshot.buffer.numpy().data,
                [(t.offset, t.num_bytes) for t in request.snapshot.manifest.tensors],
                request.snapshot.content,
            )
        )

        def written_by_increment(parent: str) -> int:
            known, sealed = self._publisher.known_chunks(parent), self._codec.key is not None
            return increment_bytes(
                plan, request.snapshot, content_hashes(), known, group_world_size=self._world_size, sealed=sealed
            )

        prepared = agree_prepared(
            self._pg, self._publisher.prepare(request, plan.estimated_bytes, written_by_increment) if leader else None
        )
        if prepared.refusal is not None:
            return prepared.refusal
        assert prepared.tmp is not None
        tensors = tensors_from_buffer(request.snapshot.buffer, request.snapshot.manifest)
        try:
            hashes = content_hashes()  # ids and digest: one pass
            storage = ChunkStorageWriter(
                prepared.tmp,
                rank=self._rank,
                location=prepared.name,
                codec=self._codec,
                known=self._publisher.known_chunks(prepared.parent),
                content=zip(tensors, hashes, strict=True),
            )
            dcp.save(
                {
                    dcp_key(spec.name, self._rank if spec.own else None): sh.wrap(t) if sh is not None else t
                    for spec, t, sh in zip(plan.layout.tensors, tensors, plan.shardings, strict=True)
                },
                storage_writer=storage,
                process_group=self._pg,
                no_dist=self._pg is None,
            )
            result = (
                self._publisher.publish(request, plan.layout, tensors, hashes, prepared, started) if leader else None
            )
        # DCP's CheckpointException derives from BaseException, so name it; the rest are
        # OSError (ENOSPC, EIO), CheckpointCorrupt, and torch's RuntimeErrors from torch.save.
        except (Exception, dcp.CheckpointException) as e:
            result = self._publisher.fail(request, prepared.tmp, e, plan.estimated_bytes, started) if leader else None
        return agree_result(self._pg, result)

    def _log(self, level: int, step: int, msg: str, *args: Any) -> None:
        logger.log(level, "[%s step=%d] " + msg, self.writer_id, step, *args)
