"""Export a checkpoint as safetensors files other tools load, and import such files for a warm start.

**Export** writes one ``<entry>.safetensors`` per top-level entry of the training state
asked for: ``model`` always (its tensor names are exactly ``module.state_dict()``'s, so
``model.load_state_dict(safetensors.torch.load_file("model.safetensors"))`` works, as does
any tool that reads safetensors), ``optimizer`` with ``--optimizer`` (names such as
``state[0].exp_avg``; ``param_groups`` as JSON in the file's metadata, for people). Each file's
metadata also carries the step and, under ``replicaft.state.skeleton`` and ``replicaft.names``, the
entry's non-tensor structure (msgpack, base64) and its tensors' order, so that an import
restores the entry exactly, tuples and all.

**Import** turns safetensors files into a checkpoint (a new lineage) that a job resumes
from like any other. A file exported here comes back whole; a foreign file (a model from
elsewhere) becomes a flat ``name -> tensor`` entry, which is what ``load_state_dict``
takes. An imported checkpoint holds only the entries it was given, so it is marked
``imported``: a resume takes those from it and keeps the job's own values for the rest
(a fresh optimizer, the data cursor at its start), and logs which are which.

Safetensors is read with ``safetensors.torch.load_file``: a header of JSON and raw
tensor bytes, no code, so importing a file of unknown origin is as safe as loading weights.
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgpack
import safetensors
import safetensors.torch
import torch

from replicaft.checkpoint.entries import open_regular
from replicaft.checkpoint.keys import EncryptionKey
from replicaft.checkpoint.reader import LoadedCheckpoint
from replicaft.errors import CheckpointCorrupt, StateError
from replicaft.state.flat import flatten, unflatten

logger = logging.getLogger(__name__)

SKELETON_KEY = "replicaft.state.skeleton"
NAMES_KEY = "replicaft.names"
ENTRY_KEY = "replicaft.entry"
STEP_KEY = "replicaft.step.driver"
IMPORTED = "imported"
IMPORT_RULE = "import reads .safetensors files"
"""Manifest metadata key marking a checkpoint made by :func:`import_safetensors`."""


def export_safetensors(loaded: LoadedCheckpoint, out: Path, entries: Sequence[str] = ("model",)) -> list[Path]:
    """Write ``<entry>.safetensors`` into ``out`` for each of ``entries``; return the paths.

    Raises StateError naming the entries the checkpoint has when one is missing.
    """
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for entry in entries:
        if entry not in loaded.state:
            raise StateError(f"{loaded.path.name} has no {entry!r} entry; it has {sorted(loaded.state)}")
        flat = flatten(loaded.state[entry])
        tensors: dict[str, torch.Tensor] = {}
        seen: set[int] = set()
        names = [_plain(name) for name in flat.names]
        for name, t in zip(names, flat.tensors, strict=True):
            # safetensors refuses tensors sharing memory (tied weights); those are written as copies.
            t = t.detach().cpu().contiguous()
            ptr = t.untyped_storage().data_ptr()
            tensors[name] = t.clone() if ptr in seen and t.numel() else t
            seen.add(ptr)
        metadata = {
            "format": "pt",
            ENTRY_KEY: entry,
            STEP_KEY: str(loaded.step),
            SKELETON_KEY: base64.b64encode(msgpack.packb(flat.skeleton, use_bin_type=True)).decode(),
            NAMES_KEY: json.dumps(names),
        }
        if entry == "optimizer" and isinstance(loaded.state[entry], dict) and "param_groups" in loaded.state[entry]:
            metadata["param_groups"] = json.dumps(loaded.state[entry]["param_groups"], default=str)
        path = out / f"{entry}.safetensors"
        safetensors.torch.save_file(tensors, str(path), metadata=metadata)
        written.append(path)
    return written


def _plain(name: str) -> str:
    """A flatten() name without its root (``state.0.weight`` -> ``0.weight``, as in ``state_dict()``)."""
    return name.removeprefix("state.")


def read_safetensors(path: Path) -> tuple[str, Any]:
    """The entry name and value a safetensors file holds (see the module docstring).

    Raises CheckpointCorrupt for a file that is not valid safetensors, or whose replicaft
    skeleton does not match its tensors.
    """
    # Checked (and held open) first: safetensors' own open of a FIFO blocks forever.
    with open_regular(path, str(path), follow_links=True, rule=IMPORT_RULE):
        return _read_safetensors(path)


def _read_safetensors(path: Path) -> tuple[str, Any]:
    try:
        tensors = safetensors.torch.load_file(str(path))
        with safetensors.safe_open(str(path), framework="pt") as f:
            metadata = f.metadata() or {}
    except Exception as e:  # safetensors raises its own SafetensorError and OSError
        raise CheckpointCorrupt(f"{path} is not a safetensors file ({type(e).__name__}: {e})") from e
    entry = metadata.get(ENTRY_KEY) or path.name.removesuffix(".safetensors")
    skeleton = metadata.get(SKELETON_KEY)
    if skeleton is None:
        return entry, tensors
    try:
        decoded = msgpack.unpackb(base64.b64decode(skeleton, validate=True), raw=False, strict_map_key=False)
        names = json.loads(metadata[NAMES_KEY])
        return entry, unflatten(decoded, [tensors[n] for n in names])
    except (ValueError, KeyError, TypeError, StateError) as e:
        raise CheckpointCorrupt(
            f"{path}: its {SKELETON_KEY} does not match its tensors ({type(e).__name__}: {e})"
        ) from e


def imported_state(paths: Sequence[Path], step: int) -> dict[str, Any]:
    """The training state made of ``paths`` (one entry each) at ``step``."""
    state: dict[str, Any] = {"replicaft": {"step": step}}
    for path in paths:
        entry, value = read_safetensors(path)
        if entry in state:
            raise StateError(f"{path} holds entry {entry!r}, which another file given already holds")
        state[entry] = value
    return state


def import_safetensors(
    paths: Sequence[Path], directory: Path, *, step: int = 0, encryption_key: EncryptionKey | None = None
) -> Path:
    """Write a checkpoint of ``paths`` into ``directory`` (a new lineage); return its path."""
    from replicaft.checkpoint.writer import CheckpointWriter
    from replicaft.transfer.snapshot import Snapshot

    state = imported_state(paths, step)
    snapshot = Snapshot.capture(flatten(state), step=step, quorum_id=-1, replica_id="import")
    with CheckpointWriter(directory, encryption_key=encryption_key, writer_id="import") as writer:
        result = writer.save_async(snapshot, step, {IMPORTED: True, "imported_from": [str(p) for p in paths]}).wait(
            3600
        )
    if not result.ok or result.path is None:
        raise CheckpointCorrupt(f"writing the imported checkpoint into {directory} failed: {result.reason}")
    return result.path
