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

This module keeps the training thread's side (when a save is due, what is saved,
:meth:`CheckpointWriter.close`) and builds the parts: the one background thread, with the
queue and the counters, is save_thread.py; the stages of one save, run on it in order on
every rank of the group, are collective_save.py.

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

import json
import logging
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch.distributed as dist

from replicaft.checkpoint.catalog import Catalog
from replicaft.checkpoint.chunks import ChunkCodec
from replicaft.checkpoint.collective_save import CollectiveSave
from replicaft.checkpoint.housekeeping import Housekeeper
from replicaft.checkpoint.keys import EncryptionKey
from replicaft.checkpoint.layout import is_lineage, new_lineage
from replicaft.checkpoint.objectstore import ObjectStore
from replicaft.checkpoint.objecttier import Uploader
from replicaft.checkpoint.options import BestMode, CheckpointOptions
from replicaft.checkpoint.policy import SaveDecision, should_save
from replicaft.checkpoint.publisher import Publisher, SaveRequest, disk_free_bytes
from replicaft.checkpoint.results import SaveHandle, SaveResult, WriterStatistics
from replicaft.checkpoint.save_thread import SaveThread
from replicaft.errors import OptionsError
from replicaft.transfer.snapshot import Snapshot

DEFAULT_CHAIN_LENGTH = 10
"""A full base every 10 saves: an increment costs what changed, a chain's damage reaches at
most 10 checkpoints, and a restore reads at most 10 directories (chain.py)."""

logger = logging.getLogger(__name__)


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
        codec = ChunkCodec(compression_level=compression_level, key=encryption_key)
        self.writer_id = writer_id
        if lineage is not None and not is_lineage(lineage):
            raise OptionsError(f"lineage={lineage!r} is not a lineage id; leave it None for a new history")
        self.lineage = lineage if lineage is not None else new_lineage()
        """The history saves belong to unless ``save_async`` names another (layout.py)."""
        self._rank = dist.get_rank(process_group) if process_group is not None else 0
        world_size = dist.get_world_size(process_group) if process_group is not None else 1
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
            codec=codec,
            chain_length=chain_length,
            free_space_margin=free_space_margin,
            free_bytes=free_bytes,
            group_world_size=world_size,
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
        self._saves = SaveThread(
            CollectiveSave(
                self._publisher, codec=codec, process_group=process_group, rank=self._rank, world_size=world_size
            ).run,
            writer_id=writer_id,
        )
        """The background thread every save runs on, in call order (save_thread.py)."""
        self.wait_when_busy_s = wait_when_busy_s
        self._last_handle: SaveHandle | None = None
        self._baseline: tuple[int, float] | None = None
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
            skipped = self._saves.count_skip()
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
        self._last_handle = self._saves.submit(SaveRequest(snapshot, step, extra, lineage))
        return self._last_handle

    def pop_finished(self) -> list[SaveResult]:
        """Results of saves finished since the last call, oldest first (for events and logs)."""
        return self._saves.pop_finished()

    def statistics(self) -> WriterStatistics:
        return self._saves.statistics()

    def close(self, timeout_s: float = 60.0) -> bool:
        """Let queued saves and uploads finish, for at most ``timeout_s``; True if they all did.

        On a timeout the thread is left running (it is a daemon) and a warning names the
        directory: an unfinished save leaves only a temporary directory behind, an
        unfinished upload resumes with the next writer. The writer accepts no saves afterwards.
        """
        self._closed = True
        deadline = time.monotonic() + timeout_s
        saved = self._saves.close(timeout_s)
        if not saved:
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

    def _log(self, level: int, step: int, msg: str, *args: Any) -> None:
        logger.log(level, "[%s step=%d] " + msg, self.writer_id, step, *args)
