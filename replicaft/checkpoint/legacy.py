"""Reading DCP's own files without running pickle: a restricted reader for ``.metadata``.

DCP's ``FileSystemReader`` loads ``.metadata`` with ``pickle.load``, which calls whatever
the file names. A checkpoint directory may hold anything (a planted ``.metadata``, with the
manifest re-hashed to match, executed code on resume), and our documentation promises that
loading a checkpoint never runs pickle. So ``.metadata`` is read here by an unpickler that
resolves only the handful of classes DCP's metadata is made of, each of which builds a plain
record and calls nothing else; anything else in the file is an error naming the global.
Then every entry is checked: tensors only (a "bytes" entry would be handed to
``torch.load(weights_only=False)`` by DCP's planner), data in plain file names of the
checkpoint listed in its manifest, no stream transforms (we never write any).

DCP's data files are read by DCP itself, with ``torch.load(weights_only=True)``, torch's own
restricted unpickler for tensors.

Rejected alternative: ``torch.serialization.safe_globals`` around DCP's reader. It governs
``torch.load`` only; ``.metadata`` is read with plain ``pickle.load``.
"""

from __future__ import annotations

import io
import pickle
import pickletools
from collections.abc import Collection
from pathlib import Path, PosixPath
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import metadata as dcp_metadata
from torch.distributed.checkpoint.filesystem import _StorageInfo

from replicaft.checkpoint.entries import read_small
from replicaft.checkpoint.layout import DCP_METADATA_FILE
from replicaft.errors import CheckpointCorrupt
from replicaft.state.flat import DTYPES

_ALLOWED: dict[tuple[str, str], Any] = {
    ("torch.distributed.checkpoint.metadata", "Metadata"): dcp_metadata.Metadata,
    ("torch.distributed.checkpoint.metadata", "TensorStorageMetadata"): dcp_metadata.TensorStorageMetadata,
    ("torch.distributed.checkpoint.metadata", "TensorProperties"): dcp_metadata.TensorProperties,
    ("torch.distributed.checkpoint.metadata", "ChunkStorageMetadata"): dcp_metadata.ChunkStorageMetadata,
    ("torch.distributed.checkpoint.metadata", "MetadataIndex"): dcp_metadata.MetadataIndex,
    ("torch.distributed.checkpoint.metadata", "StorageMeta"): dcp_metadata.StorageMeta,
    ("torch.distributed.checkpoint.metadata", "_MEM_FORMAT_ENCODING"): dcp_metadata._MEM_FORMAT_ENCODING,
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"): _StorageInfo,
    ("torch.serialization", "_get_layout"): torch.serialization._get_layout,
    ("torch", "Size"): torch.Size,
    ("pathlib", "PosixPath"): PosixPath,
    **{("torch", name): dtype for name, dtype in DTYPES.items()},
}
"""Every global DCP's ``.metadata`` names (torch 2.x), mapped to what it may resolve to:
record classes, ``torch.Size``, dtype constants, and ``_get_layout``, which looks a layout
up by name. None of them runs code given its arguments."""


class _MetadataUnpickler(pickle.Unpickler):
    def __init__(self, data: bytes, where: str) -> None:
        super().__init__(io.BytesIO(data))
        self._where = where

    def find_class(self, module: str, name: str) -> Any:
        try:
            return _ALLOWED[(module, name)]
        except KeyError:
            raise CheckpointCorrupt(
                f"{self._where} names {module}.{name}, which DCP metadata never holds; refusing to load it "
                "(a planted file?)"
            ) from None

    def persistent_load(self, pid: Any) -> Any:
        raise CheckpointCorrupt(f"{self._where} holds a persistent reference, which DCP metadata never does")


def read_dcp_metadata(path: Path, listed_files: Collection[str]) -> dcp_metadata.Metadata:
    """The DCP metadata of version-1 or -2 checkpoint directory ``path``, read without running code.

    ``listed_files`` are the file names the manifest lists; every data file the metadata
    points at must be one of them. Raises CheckpointCorrupt naming the file and the entry.
    """
    where = f"{path.name}/{DCP_METADATA_FILE}"
    raw = read_small(path / DCP_METADATA_FILE, where)
    try:
        # The unpickler allocates a counted bytes or string opcode's declared length before
        # reading it, so a 600-byte file declaring 2 GiB took 2 GiB. pickletools reads only
        # what is there: a length past the end fails here first (ValueError; issue 19).
        for _ in pickletools.genops(raw):
            pass
        metadata = _MetadataUnpickler(raw, where).load()
    except CheckpointCorrupt:
        raise
    except Exception as e:  # a damaged pickle fails in many ways; none is a program error
        raise CheckpointCorrupt(f"{where} cannot be decoded ({type(e).__name__}: {e})") from e
    if not isinstance(metadata, dcp_metadata.Metadata) or not isinstance(
        _attribute(metadata, "state_dict_metadata", where), dict
    ):
        raise CheckpointCorrupt(f"{where} does not hold DCP metadata (found {type(metadata).__name__})")
    for key, entry in metadata.state_dict_metadata.items():
        if not isinstance(key, str) or not isinstance(entry, dcp_metadata.TensorStorageMetadata):
            raise CheckpointCorrupt(f"{where}: entry {key!r} is a {type(entry).__name__}; replicaft saves tensors only")
    storage = _attribute(metadata, "storage_data", where)
    if not isinstance(storage, dict):
        raise CheckpointCorrupt(f"{where}: storage_data is a {type(storage).__name__}, not a mapping")
    for index, info in storage.items():
        if not isinstance(index, dcp_metadata.MetadataIndex) or not isinstance(info, _StorageInfo):
            raise CheckpointCorrupt(f"{where}: storage entry {index!r} is malformed")
        fqn = _attribute(index, "fqn", where)
        relative_path = _attribute(info, "relative_path", where)
        transforms = _attribute(info, "transform_descriptors", where)
        # A str first: ``in`` a frozenset raises TypeError for an unhashable path (issue 19).
        if not isinstance(relative_path, str) or relative_path not in listed_files or transforms:
            raise CheckpointCorrupt(
                f"{where}: {fqn!r:.200} is stored in {relative_path!r:.200} with transforms "
                f"{transforms!r:.200}; data must be in a file the manifest lists, untransformed"
            )
        place = (_attribute(info, "offset", where), _attribute(info, "length", where))
        if not all(type(n) is int and 0 <= n < 1 << 62 for n in place):
            raise CheckpointCorrupt(
                f"{where}: {fqn!r:.200} is stored at offset, length {place!r:.200}; expected two byte counts"
            )
    return metadata


def _attribute(record: object, name: str, where: str) -> Any:
    """``record.name``: an unpickled record has whatever attributes its file gave it, so a
    missing one is a damaged file, not an AttributeError (issue 19)."""
    try:
        return getattr(record, name)
    except AttributeError:
        raise CheckpointCorrupt(f"{where}: a {type(record).__name__} without {name}") from None


class SafeFileSystemReader(dcp.FileSystemReader):
    """DCP's file reader with ``.metadata`` read by :func:`read_dcp_metadata`."""

    def __init__(self, path: Path, listed_files: Collection[str]) -> None:
        super().__init__(str(path))
        self._dir = path
        self._listed = frozenset(listed_files)

    def read_metadata(self, *args: Any, **kwargs: Any) -> dcp_metadata.Metadata:
        metadata = read_dcp_metadata(self._dir, self._listed)
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = dcp_metadata.StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata
