"""Opening a group's checkpoints: the reader and writer of its options' directory and tiers.

One function, as trio keeps ``open_tcp_stream`` with only the helpers it uses: it maps the
checkpoint options of :class:`ManagerOptions` (retention, cadence, chain, compression, key,
object store) onto the checkpoint package's reader and writer. The persistence duties call it
at start (duties.py), the checkpoint package itself staying free of the manager's options.
It imports the checkpoint package when called, not at import: DCP pulls in DTensor and sympy,
about a second of every start-up, which a job without checkpoints (or a restarted group about
to heal) need not pay.
"""

from __future__ import annotations

import datetime
from typing import TYPE_CHECKING

import torch.distributed as dist

from replicaft.config.options import ManagerOptions
from replicaft.errors import OptionsError

if TYPE_CHECKING:
    from replicaft.checkpoint import CheckpointReader, CheckpointWriter

SAVE_TIMEOUT_S = 600.0
"""W > 1: the writer group's collectives time out after this long, and a due save waits this
long at most for the previous one (every rank must save the same steps)."""


def open_checkpoints(o: ManagerOptions) -> tuple[CheckpointReader, CheckpointWriter]:
    """The reader and writer of ``o.checkpoint_dir`` and its tiers, with the options' retention,
    cadence, chain, compression, key and object store. With W > 1, the writer's process group
    spans the group's ranks (a gloo group over the default process group the script
    initialised inside its group); OptionsError if there is none, or if a time-based interval
    is asked for (every rank must save the same steps without talking about it)."""
    process_group = None
    if o.group_world_size > 1:
        if not dist.is_initialized():
            raise OptionsError(
                f"checkpoint_dir with group_world_size={o.group_world_size} needs torch.distributed "
                "initialised inside the group (init_process_group, as FSDP scripts do)"
            )
        if o.checkpoint_interval_s:
            raise OptionsError(
                "checkpoint_interval_s cannot be used with W > 1 (the ranks must agree on every "
                "save); use checkpoint_interval_steps"
            )
        process_group = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=SAVE_TIMEOUT_S))
    # Imported here: see the module docstring.
    from replicaft.checkpoint import CheckpointReader, CheckpointWriter
    from replicaft.checkpoint.keys import load_key
    from replicaft.checkpoint.objectstore import ObjectStore

    key = load_key(
        key_file=o.checkpoint_key_file,
        key=o.checkpoint_key,
        data_directories=(o.checkpoint_dir, o.checkpoint_tier2_dir),
    )
    store = (
        ObjectStore(o.checkpoint_object_store, endpoint_url=o.checkpoint_object_store_endpoint)
        if o.checkpoint_object_store
        else None
    )
    reader = CheckpointReader(
        o.checkpoint_dir, tier2_directory=o.checkpoint_tier2_dir, encryption_key=key, object_store=store
    )
    writer = CheckpointWriter(
        o.checkpoint_dir,
        tier2_directory=o.checkpoint_tier2_dir,
        keep_last=o.checkpoint_keep_last,
        milestone_every=o.checkpoint_milestone_every,
        milestone_at_epoch_end=o.checkpoint_milestone_at_epoch_end,
        keep_geometric_from=o.checkpoint_keep_geometric_from,
        keep_best_k=o.checkpoint_keep_best_k,
        keep_best_metric=o.checkpoint_keep_best_metric,
        keep_best_mode=o.checkpoint_keep_best_mode,
        interval_steps=o.checkpoint_interval_steps,
        interval_s=o.checkpoint_interval_s,
        process_group=process_group,
        writer_id=f"{o.replica_id}/{o.group_rank}",
        wait_when_busy_s=SAVE_TIMEOUT_S if process_group is not None else None,
        chain_length=o.checkpoint_chain_length,
        compression_level=o.checkpoint_compression_level,
        encryption_key=key,
        object_store=store,
    )
    return reader, writer
