"""The donor's side of a heal: this rank's state, published for healers without holding up its step.

At a quorum with healers, :meth:`SnapshotPublisher.prepare` (on the quorum thread) starts a
background copy of the state (transfer.snapshot.BackgroundCapture): tensors under 1 MiB at
once, the large ones on a thread while the step's forward and backward run.
:meth:`SnapshotPublisher.settle`, which the training thread calls after the vote and before
anything writes the state, waits for what is left of the copy; a second thread then
computes the chunk checksums over the copy and publishes it. A healer asking before that is
told "not served yet" and retries (transfer.client.wait_for_manifest), the normal race
anyway.

Before this, a donor copied and checksummed its whole state on the quorum thread, and the
step's all-reduce waits for the quorum, so all of it was on the donor's critical path.

A tensor written during the copy (a large buffer updated by forward, user code) makes that
snapshot unusable: it is dropped and logged, and that tensor is copied at once from then on;
healers retry at the next quorum, from a newer base.
"""

from __future__ import annotations

import concurrent.futures
import logging
from collections.abc import Callable

from replicaft.state import Flat
from replicaft.transfer.server import StateServer
from replicaft.transfer.snapshot import BackgroundCapture, Snapshot, checksummed

logger = logging.getLogger(__name__)


class SnapshotPublisher:
    def __init__(self, server: StateServer, replica_id: str, on_published: Callable[[int], None] | None = None) -> None:
        self._server = server
        self._replica_id = replica_id
        self._on_published = on_published
        self._capture: BackgroundCapture | None = None
        self._copy_now: frozenset[str] = frozenset()
        self._publishing: tuple[int, concurrent.futures.Future[None]] | None = None
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="replicaft-publish")

    def serves(self, step: int) -> bool:
        """``step`` is published, or on its way (copying or being checksummed)."""
        capture, publishing = self._capture, self._publishing
        return (
            step in self._server.published_steps
            or (capture is not None and capture.step == step)
            or (publishing is not None and publishing[0] == step and not publishing[1].done())
        )

    def prepare(self, flat: Flat, step: int, quorum_id: int) -> None:
        """Start copying the state of ``step`` (the committed state, not yet written again)."""
        self._capture = BackgroundCapture(flat, step=step, quorum_id=quorum_id, replica_id=self._replica_id,
                                          copy_now=self._copy_now)

    def retain(self, steps: set[int]) -> None:
        self._server.retain(steps)

    def settle(self, timeout_s: float) -> None:
        """Before anything writes the state: finish the copy, then checksum and publish it behind."""
        capture, self._capture = self._capture, None
        if capture is None:
            return
        snapshot, why = capture.finish(timeout_s)
        if snapshot is None:
            self._copy_now |= capture.changed
            logger.warning("[%s] not serving step %d to healers: %s", self._replica_id, capture.step, why)
            return
        self._publishing = (capture.step, self._pool.submit(self._publish, snapshot))

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _publish(self, snapshot: Snapshot) -> None:
        try:
            self._server.publish(checksummed(snapshot))
        except Exception:  # healers then retry at the next quorum; the donor trains on
            logger.exception("[%s] could not publish step %d for healers", self._replica_id, snapshot.manifest.step)
            return
        if self._on_published is not None:
            self._on_published(snapshot.manifest.step)
