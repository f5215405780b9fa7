"""Persistent checkpoints: the state on disk for the one case peers cannot cover, every group gone.

Peers heal each other; a checkpoint on disk is read only when no peer can donate. So it is
written rarely (every N steps and/or T seconds), by one group (the quorum's replica rank 0),
asynchronously from a host snapshot, and it must never be the reason a run loses its state:

* **atomic publish** — written under ``step-N-<lineage>.tmp-<token>``, every file checksummed
  (SHA-256) and fsynced, ``manifest.json`` last, then renamed; a crash at any point leaves the
  previous checkpoint intact (``writer.py``, ``publisher.py``, ``durable.py``, ``layout.py``);
  a writer removes only temporaries whose owner died or that are hours old (``leftovers.py``);
* **lineages** — a checkpoint names the history it belongs to, so two runs in one directory
  never mix, and a resume picks the most recent history, whole (``lineage.py``);
* **incremental** — tensors are stored as content-addressed chunks (``chunks.py``,
  ``storage.py``, ``index.py``): a save writes only the chunks its parent's chain lacks, with a
  full base every ``chain_length`` saves (``chain.py``); optionally zstd-compressed and
  AES-256-GCM-encrypted per chunk (``keys.py``);
* **verified reads** — every file of a checkpoint and its chain is checked against the
  manifests, every chunk against its id; damaged checkpoints are skipped, newest first, with
  a warning naming the file (``reader.py``, ``tiers.py``); hostile directory entries are
  judged without following or blocking (``entries.py``); nothing read runs pickle (the
  previous release's format is read through a restricted unpickler, ``legacy.py``);
* **retention** — a :class:`RetentionPolicy` (``options.py``) of rules that only ever keep: the
  newest ``keep_last``, every ``milestone_every``-th step, the last checkpoint of each epoch,
  geometrically spaced steps (N, 2N, 4N, ...), the ``keep_best_k`` best by a reported metric;
  plus, whatever the rules say, the chains of kept checkpoints and those a tier still has to
  upload. It is a pure function of :class:`CheckpointFacts` (``retention.py``), applied only
  after a publish, in every tier; **policy** — when to save, skip-don't-wait, free space
  (``policy.py``, pure); **cadence** — the interval from the measured save cost and failure
  rate (``cadence.py``, ``checkpoint_interval="auto"``);
* **catalog** — every published checkpoint with its tags, metrics and retention roles in
  ``DIR/catalog.sqlite`` (:class:`Catalog`, ``catalog.py``; its rows ``catalog_entry.py``, its
  files opened without following a link ``catalog_files.py``; tags and metrics from
  ``labels.py``), a cache rebuilt from the manifests when missing or damaged, queried with
  ``replicaft-ckpt catalog|find|show|tag``;
* **tiers** — an optional verified tier-2 directory copy (``tier2.py``) and an S3-API object
  store, uploaded in the background and restored from on a new machine (``objectstore.py``,
  its resumable uploads ``multipart.py``, ``objecttier.py``); ``export.py`` writes and reads safetensors.

DCP (``torch.distributed.checkpoint``) plans what each of W ranks writes and reshards on
load, so any group size loads any checkpoint; the bytes are ours (storage.py says why); plain
values go to ``state.msgpack``, never pickle.

Wiring into the manager (``manager.state_dict()`` / ``load_state_dict`` and
:class:`replicaft.transfer.snapshot.Snapshot` are the only contact points)::

    from replicaft.checkpoint import CheckpointReader, CheckpointWriter
    from replicaft.state.flat import flatten
    from replicaft.transfer.snapshot import Snapshot

    # Startup, every rank, only when the quorum shows no peer ahead to heal from:
    loaded = CheckpointReader(ckpt_dir, tier2_directory=tier2_dir).load_latest_valid(manager.state_dict())
    if loaded is not None:                       # LoadedCheckpoint(step, state, path)
        manager.load_state_dict(loaded.state)    # tensors were already filled in place

    # Manager.start(), every rank of the group (no I/O until the first save):
    writer = CheckpointWriter(
        ckpt_dir, tier2_directory=tier2_dir, keep_last=3, milestone_every=10_000,
        keep_best_k=2, keep_best_metric="loss",   # also the two lowest-loss checkpoints
        interval_steps=1000, interval_s=1800.0,
        process_group=ckpt_pg,                   # None when W == 1; else a dedicated gloo group
        writer_id=f"{replica_id}/{group_rank}",
    )

    # After each committed step, in the group whose replica rank is 0:
    decision, handle = writer.save_if_due(
        manager.current_step(),
        capture=lambda: Snapshot.capture(flatten(manager.state_dict()), step=manager.current_step(),
                                         quorum_id=quorum_id, replica_id=replica_id),
        metadata={"loss": last_loss},            # optional, JSON values
    )
    for result in writer.pop_finished():         # SaveResult: status, reason, path, num_bytes...
        emit("checkpoint", ok=result.ok, reason=result.reason, ...)

    # SIGTERM (preemption) in the writing group: an emergency save, bounded by the grace period.
    writer.save_async(snapshot, step, {"reason": "preemption"}).wait(timeout_s=grace_s)

    # Shutdown:
    writer.close(timeout_s=60.0)

With W > 1, take the ``save_if_due`` decision on group rank 0 and have every rank call
``save_async`` for that step (see ``writer.py``). Inspect and check from a shell with
``replicaft-ckpt list DIR`` and ``replicaft-ckpt verify DIR/step-000000400``, and search the
catalog with ``replicaft-ckpt find DIR --best loss --top 3`` (``replicaft-ckpt --help``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from replicaft.checkpoint.catalog import Catalog as Catalog
    from replicaft.checkpoint.options import RetentionPolicy as RetentionPolicy
    from replicaft.checkpoint.policy import SaveDecision as SaveDecision
    from replicaft.checkpoint.policy import SpaceDecision as SpaceDecision
    from replicaft.checkpoint.policy import enough_space as enough_space
    from replicaft.checkpoint.policy import should_save as should_save
    from replicaft.checkpoint.reader import CheckpointInfo as CheckpointInfo
    from replicaft.checkpoint.reader import LoadedCheckpoint as LoadedCheckpoint
    from replicaft.checkpoint.results import SaveHandle as SaveHandle
    from replicaft.checkpoint.results import SaveResult as SaveResult
    from replicaft.checkpoint.results import WriterStatistics as WriterStatistics
    from replicaft.checkpoint.retention import CheckpointFacts as CheckpointFacts
    from replicaft.checkpoint.retention import RetentionDecision as RetentionDecision
    from replicaft.checkpoint.retention import decide_retention as decide_retention
    from replicaft.checkpoint.tiers import CheckpointReader as CheckpointReader
    from replicaft.checkpoint.writer import CheckpointWriter as CheckpointWriter

_WHERE = {
    "Catalog": "catalog",
    "RetentionPolicy": "options",
    "CheckpointFacts": "retention",
    "SaveDecision": "policy",
    "SpaceDecision": "policy",
    "enough_space": "policy",
    "should_save": "policy",
    "CheckpointInfo": "reader",
    "CheckpointReader": "tiers",
    "LoadedCheckpoint": "reader",
    "SaveHandle": "results",
    "SaveResult": "results",
    "WriterStatistics": "results",
    "RetentionDecision": "retention",
    "decide_retention": "retention",
    "CheckpointWriter": "writer",
}
"""The public names and their modules. They are imported on first use (PEP 562), because the
reader and writer pull in DCP (about a second of every start-up), which the torch-free parts
(``layout``, ``options``, ``lineage``) and a job without checkpoints need not pay."""


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'replicaft.checkpoint' has no attribute {name!r}")
    return getattr(importlib.import_module(f"replicaft.checkpoint.{module}"), name)


__all__ = [
    "Catalog",
    "CheckpointFacts",
    "CheckpointInfo",
    "CheckpointReader",
    "CheckpointWriter",
    "LoadedCheckpoint",
    "RetentionDecision",
    "RetentionPolicy",
    "SaveDecision",
    "SaveHandle",
    "SaveResult",
    "SpaceDecision",
    "WriterStatistics",
    "decide_retention",
    "enough_space",
    "should_save",
]
