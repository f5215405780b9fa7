"""The checkpoint writer's one background thread: saves run one at a time, in call order.

A save is queued by the training thread (:meth:`SaveThread.submit`) and runs on this thread,
so the training step never waits for the disk; its result comes back through the future
behind its :class:`SaveHandle` and the list :meth:`SaveThread.pop_finished` hands over, never
through attributes flipped on the writer. The counters (:class:`WriterStatistics`) are the
only state both threads touch, and they change under one lock. The thread starts with the
first save, runs at the lowest CPU priority, and is joined by :meth:`SaveThread.close`.

Split from writer.py, which keeps the training thread's side (when a save is due, what to
save): this module knows nothing of what a save does, it runs the callable it is given
(collective_save.py) and counts what it returns. One failed save must not stop the thread,
or every later save would wait forever behind it: a bug in a save is logged and reported as
a failed :class:`SaveResult`.
"""

from __future__ import annotations

import concurrent.futures
import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace

from replicaft.checkpoint.publisher import SaveRequest
from replicaft.checkpoint.results import SaveHandle, SaveResult, WriterStatistics
from replicaft.process.threads import lower_thread_priority

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


class SaveThread:
    """Runs ``save`` for each submitted request on one background thread, in call order.

    Owned by one :class:`~replicaft.checkpoint.writer.CheckpointWriter`: ``submit``,
    ``count_skip`` and ``close`` are called from its training thread; ``statistics`` and
    ``pop_finished`` from any thread.
    """

    def __init__(self, save: Callable[[SaveRequest], SaveResult], *, writer_id: str) -> None:
        self._save = save
        self.writer_id = writer_id
        self._jobs: queue.Queue[_Job | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._finished: list[SaveResult] = []
        self._stats = WriterStatistics(0, 0, 0, 0, 0, 0, None)

    def submit(self, request: SaveRequest) -> SaveHandle:
        """Queue ``request`` behind the saves before it (starting the thread with the first); return at once."""
        future: concurrent.futures.Future[SaveResult] = concurrent.futures.Future()
        with self._lock:
            self._stats = replace(self._stats, num_pending=self._stats.num_pending + 1)
        if self._thread is None:
            self._thread = threading.Thread(target=self._work, name="replicaft-checkpoint", daemon=True)
            self._thread.start()
        self._jobs.put(_Job(request, future))
        return SaveHandle(request.step, future)

    def count_skip(self) -> int:
        """Count one save skipped because the previous one was still being written; returns the total."""
        with self._lock:
            self._stats = replace(self._stats, num_skipped=self._stats.num_skipped + 1)
            return self._stats.num_skipped

    def pop_finished(self) -> list[SaveResult]:
        """Results of saves finished since the last call, oldest first."""
        with self._lock:
            finished, self._finished = self._finished, []
        return finished

    def statistics(self) -> WriterStatistics:
        with self._lock:
            return self._stats

    def close(self, timeout_s: float) -> bool:
        """Let the queued saves finish, for at most ``timeout_s``; True if they did (or none ran).

        On a timeout the thread is left running (it is a daemon); the caller says so.
        """
        if self._thread is None:
            return True
        self._jobs.put(None)
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            return False
        self._thread = None
        return True

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
