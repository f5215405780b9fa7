"""One save, on every rank of the writing group: the stages of a checkpoint in order.

Runs on the writer's background thread (save_thread.py), one save at a time, and every rank
of the group runs it for the same step::

    layout and estimated size (saveplan.py)
    -> group rank 0 picks the parent (chain.py); an increment is sized by its new chunks, by
       rank 0 alone, or in a sharded group by each rank for its own shards and summed
       (agreement.py)
    -> group rank 0 prepares: free space, temporary directory (publisher.py);
       its go/no-go reaches every rank (agreement.py)
    -> dcp.save through storage.py: each rank appends the chunks its parent's chain lacks
       to its pack, and DCP spreads the replicated tensors' writes across the ranks
    -> group rank 0 publishes, or fails the save and removes its files (publisher.py);
       the outcome reaches every rank (agreement.py)

Split from writer.py, which keeps the training thread's side: this is what a save *does*,
and it holds no state of its own between saves (the publisher holds the chains). The content
hashes of the snapshot are taken once, and so are a sealed save's keyed chunk ids: an
increment's free-space check needs the ids before the write, and the write needs them again.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Collection, Sequence

import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from replicaft.checkpoint.agreement import agree_parent, agree_prepared, agree_result, agree_total
from replicaft.checkpoint.chain import ChainDecision
from replicaft.checkpoint.chunks import ChunkCodec
from replicaft.checkpoint.layout import dcp_key
from replicaft.checkpoint.publisher import Publisher, SaveRequest
from replicaft.checkpoint.results import SaveResult
from replicaft.checkpoint.reuse import ReuseKey
from replicaft.checkpoint.saveplan import SavePlan, increment_bytes, new_chunk_bytes, plan_save
from replicaft.checkpoint.storage import ChunkStorageWriter
from replicaft.state.content import buffer_hashes, chunk_hashes
from replicaft.transfer.snapshot import tensors_from_buffer

logger = logging.getLogger(__name__)


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
        buffer = request.snapshot.buffer.numpy().data
        spans = [(t.offset, t.num_bytes) for t in request.snapshot.manifest.tensors]
        content_hashes = functools.cache(lambda: buffer_hashes(buffer, spans, request.snapshot.content))
        chunk_ids = functools.cache(  # once: for an increment's free-space check, then the write
            lambda: (
                content_hashes()
                if self._codec.key is None
                else chunk_hashes([buffer[offset : offset + size] for offset, size in spans], self._codec.chunk_id)
            )
        )
        known = functools.cache(self._publisher.known_chunks)  # the parent's index, read once
        chain = self._publisher.choose_chain(request) if leader else None
        parent = chain.parent if isinstance(chain, ChainDecision) else None
        if plan.layout.own_ranks:  # a sharded group: every rank counts its own shards
            parent = agree_parent(self._pg, parent)
        estimated = plan.estimated_bytes
        if parent is not None:
            estimated = self._increment_estimate(plan, request, parent, chunk_ids, known)
        prepared = agree_prepared(
            self._pg, self._publisher.prepare(request, chain, estimated) if chain is not None else None
        )
        if prepared.refusal is not None:
            return prepared.refusal
        assert prepared.tmp is not None
        tensors = tensors_from_buffer(request.snapshot.buffer, request.snapshot.manifest)
        try:
            storage = ChunkStorageWriter(
                prepared.tmp,
                rank=self._rank,
                location=prepared.name,
                codec=self._codec,
                known=known(prepared.parent),
                chunk_ids=zip(tensors, chunk_ids(), strict=True),
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
                self._publisher.publish(request, plan.layout, tensors, content_hashes(), prepared, started)
                if leader
                else None
            )
        # DCP's CheckpointException derives from BaseException, so name it; the rest are
        # OSError (ENOSPC, EIO), CheckpointCorrupt, and torch's RuntimeErrors from torch.save.
        except (Exception, dcp.CheckpointException) as e:
            result = self._publisher.fail(request, prepared.tmp, e, plan.estimated_bytes, started) if leader else None
        return agree_result(self._pg, result)

    def _increment_estimate(
        self,
        plan: SavePlan,
        request: SaveRequest,
        parent: str,
        chunk_ids: Callable[[], Sequence[Sequence[bytes]]],
        known: Callable[[str], Collection[ReuseKey]],
    ) -> int:
        """What an increment on ``parent`` takes on disk: in a sharded group every rank counts
        the new chunks of its own writes and the ranks sum them; else group rank 0 counts every
        tensor alone. A count that fails counts as the full estimate."""
        try:
            num_new_bytes = new_chunk_bytes(
                plan,
                request.snapshot,
                chunk_ids(),
                known(parent),
                rank=self._rank,
                group_world_size=self._world_size,
                sealed=self._codec.key is not None,
            )
        except Exception as e:  # not only OSError: a sharded group's other ranks wait in the sum below
            logger.warning(
                "[%s step=%d] cannot count the new chunks of the increment on %s (%s: %s); its "
                "free-space check counts the whole state",
                self._publisher.writer_id,
                request.step,
                parent,
                type(e).__name__,
                e,
            )
            num_new_bytes = plan.estimated_bytes
        if plan.layout.own_ranks:
            num_new_bytes = agree_total(self._pg, num_new_bytes)
        return increment_bytes(plan, num_new_bytes)
