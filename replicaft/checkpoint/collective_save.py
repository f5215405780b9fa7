"""One save, on every rank of the writing group: the stages of a checkpoint in order.

Runs on the writer's background thread (save_thread.py), one save at a time, and every rank
of the group runs it for the same step::

    layout and estimated size (saveplan.py)
    -> group rank 0 prepares: free space, parent, temporary directory (publisher.py);
       its go/no-go reaches every rank (agreement.py)
    -> dcp.save through storage.py: each rank appends the chunks its parent's chain lacks
       to its pack, and DCP spreads the replicated tensors' writes across the ranks
    -> group rank 0 publishes, or fails the save and removes its files (publisher.py);
       the outcome reaches every rank (agreement.py)

Split from writer.py, which keeps the training thread's side: this is what a save *does*,
and it holds no state of its own between saves (the publisher holds the chains). The content
hashes of the snapshot are taken once: an increment's free-space check needs them before
the write, and the write needs them again.
"""

from __future__ import annotations

import functools
import time

import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from replicaft.checkpoint.agreement import agree_prepared, agree_result
from replicaft.checkpoint.chunks import ChunkCodec
from replicaft.checkpoint.layout import dcp_key
from replicaft.checkpoint.publisher import Publisher, SaveRequest
from replicaft.checkpoint.results import SaveResult
from replicaft.checkpoint.saveplan import increment_bytes, plan_save
from replicaft.checkpoint.storage import ChunkStorageWriter
from replicaft.state.content import buffer_hashes
from replicaft.transfer.snapshot import tensors_from_buffer


class CollectiveSave:
    """Writes one requested save as this rank of ``process_group`` (None: a group of one).

    Built with the writer (no I/O); :meth:`run` blocks for the whole save, collectives
    included, so it belongs on the writer's thread. It never raises for I/O: a failed save
    comes back as a failed :class:`SaveResult`, the same on every rank.
    """

    def __init__(
        self,
        publisher: Publisher,
        *,
        codec: ChunkCodec,
        process_group: dist.ProcessGroup | None,
        rank: int,
        world_size: int,
    ) -> None:
        self._publisher = publisher
        self._codec = codec
        self._pg = process_group
        self._rank = rank
        self._world_size = world_size

    def run(self, request: SaveRequest) -> SaveResult:
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
