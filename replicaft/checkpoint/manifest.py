"""What a published checkpoint holds: ``manifest.json`` and ``state.msgpack``. Pure: no file I/O.

``manifest.json`` is the checkpoint's table of contents and its proof of completeness: it is
written last, inside the temporary directory, and lists every other file with its size and
SHA-256. A checkpoint is valid only if every listed file is present with that size and digest.
It is JSON so an operator can read it with ``cat``; it carries the metadata needed to judge a
checkpoint without loading it (step, quorum id, group world size, replicaft and torch versions,
the state digest that ``committed`` events report).

``state.msgpack`` holds what DCP should not: the non-tensor part of the state (step counters,
scheduler fields, the data cursor, user extras) as the msgpack skeleton of
:func:`replicaft.state.flat.flatten`, plus the name, dtype and shape of every tensor. DCP would
pickle plain Python values (and unpickle them with ``torch.load`` on load); keeping them in
msgpack means loading a checkpoint never runs pickle, and lets the reader allocate tensors a
template lacks (a fresh optimizer has no ``exp_avg`` yet).

Decoding validates every field and raises :class:`CheckpointCorrupt` naming the file and the
field, because these files come off a disk that may hold anything.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

import msgpack

from lighthouse.errors import shown
from replicaft.checkpoint.layout import LEGACY_LINEAGE, is_lineage, parse_dirname
from replicaft.errors import CheckpointCorrupt
from replicaft.state.flat import DTYPES
from replicaft.state.skeleton import SkeletonError, check_skeleton

FORMAT = "replicaft-checkpoint"
FORMAT_VERSION = 4
"""Version 2 added the lineage (layout.py). Version 3: chunked tensors (``tensors.msgpack`` and
packs in place of DCP's files, storage.py), incremental chains (``kind``, ``requires``,
chain.py) and the codec (compression level, encryption key id). Version 4: every sealed piece
of an encrypted checkpoint carries its place as associated data (places.py; version 3's
sealed pieces, which do not, are still read). Versions 1 and 2 hold DCP's
own files (``DCP_FILES_VERSIONS``), read by legacy.py. Every version this release can read is
listed in ``READABLE_VERSIONS``; a checkpoint of a newer one is refused with the version
named, never guessed at."""
READABLE_VERSIONS = (1, 2, 3, 4)
UNPLACED_SEALS_VERSIONS = (3,)
"""Versions whose sealed pieces (when encrypted) carry no place."""
DCP_FILES_VERSIONS = (1, 2)
LAYOUT_VERSION = 1
"""Version of ``state.msgpack``'s own encoding (unchanged since version 1 of the format)."""
_SHA256_HEX = re.compile(r"[0-9a-f]{64}")
_KEY_ID = re.compile(r"[0-9a-f]{16}")


@dataclass(frozen=True, slots=True)
class FileEntry:
    name: str
    """A plain file name inside the checkpoint directory (no directories, no ``..``)."""
    num_bytes: int
    sha256: str


@dataclass(frozen=True, slots=True)
class CheckpointManifest:
    step: int
    created_unix_s: float
    files: tuple[FileEntry, ...]
    metadata: dict[str, Any] = field(default_factory=dict)
    """quorum_id, replica_id, group_world_size, replicaft_version, torch_version, digest,
    plus whatever the caller passed to ``save_async``; JSON values only."""
    lineage: str = LEGACY_LINEAGE
    """The history this checkpoint belongs to (layout.py); ``LEGACY_LINEAGE`` for version 1."""
    version: int = FORMAT_VERSION
    kind: str = "base"
    """"base" (every chunk in its own packs) or "increment" (chain.py)."""
    requires: tuple[str, ...] = ()
    """The checkpoints (directory names, same lineage, same directory) whose packs hold
    chunks this one refers to: its chain, without itself."""
    chain_position: int = 1
    compression_level: int = 0
    key_id: str | None = None
    """The id of the key its chunks and state are encrypted under (keys.py); None = plain."""

    @property
    def holds_dcp_files(self) -> bool:
        """Written by a release before chunked tensors: DCP's ``.metadata`` and data files."""
        return self.version in DCP_FILES_VERSIONS

    @property
    def num_bytes(self) -> int:
        return sum(f.num_bytes for f in self.files)

    def encode(self) -> bytes:
        return json.dumps(
            {
                "format": FORMAT,
                "version": self.version,
                "step": self.step,
                "lineage": self.lineage,
                "kind": self.kind,
                "requires": list(self.requires),
                "chain_position": self.chain_position,
                "codec": {"compression_level": self.compression_level, "key_id": self.key_id},
                "created_unix_s": self.created_unix_s,
                "files": [{"name": f.name, "num_bytes": f.num_bytes, "sha256": f.sha256} for f in self.files],
                "metadata": self.metadata,
            },
            indent=1,
            sort_keys=True,
        ).encode()

    @classmethod
    def decode(cls, raw: bytes, where: str) -> CheckpointManifest:
        """Parse ``manifest.json`` read from ``where`` (named in every error)."""
        try:
            o = json.loads(raw)
        except ValueError as e:
            # JSONDecodeError and UnicodeDecodeError, and the ValueError of an integer longer
            # than Python converts (4300 digits): all are a file no writer wrote (issue 19).
            raise CheckpointCorrupt(f"{where} is not valid JSON ({str(e)[:200]})") from e
        except RecursionError:
            # json's C scanner bounds its own recursion: 100 000 nested arrays end here.
            raise CheckpointCorrupt(f"{where} nests deeper than a manifest ever does; it is not a manifest") from None
        if not isinstance(o, dict):
            raise CheckpointCorrupt(f"{where} must hold a JSON object, got {type(o).__name__}")
        version = o.get("version")
        if o.get("format") != FORMAT or type(version) is not int or version not in READABLE_VERSIONS:
            raise CheckpointCorrupt(
                f"{where} has format {shown(o.get('format'))} version {shown(version)}; this replicaft reads "
                f"{FORMAT!r} versions {list(READABLE_VERSIONS)} (a newer replicaft wrote it?)"
            )
        lineage = LEGACY_LINEAGE if version == 1 else _field(o, "lineage", str, where)
        if version > 1 and (lineage == LEGACY_LINEAGE or not is_lineage(lineage)):
            raise CheckpointCorrupt(f"{where}: lineage {shown(lineage)} is not a lineage id")
        step = _field(o, "step", int, where)
        created = _field(o, "created_unix_s", (int, float), where)
        if not math.isfinite(created):
            # Python's json reads NaN, Infinity and 1e999; no clock says any of them.
            raise CheckpointCorrupt(f"{where}: field 'created_unix_s' = {created!r} is not a finite number")
        metadata = _field(o, "metadata", dict, where)
        files = []
        for i, entry in enumerate(_field(o, "files", list, where)):
            if not isinstance(entry, dict):
                raise CheckpointCorrupt(f"{where}: files[{i}] must be an object, got {type(entry).__name__}")
            name = _field(entry, "name", str, f"{where}: files[{i}]")
            num_bytes = _field(entry, "num_bytes", int, f"{where}: files[{i}]")
            sha256 = _field(entry, "sha256", str, f"{where}: files[{i}]")
            if not name or "/" in name or "\\" in name or name in (".", "..") or not name.isprintable():
                raise CheckpointCorrupt(f"{where}: files[{i}].name {shown(name)} is not a plain file name")
            if num_bytes < 0 or not _SHA256_HEX.fullmatch(sha256):
                raise CheckpointCorrupt(f"{where}: files[{i}] ({name}) has size {num_bytes} / sha256 {shown(sha256)}")
            files.append(FileEntry(name, num_bytes, sha256))
        if step < 0:
            raise CheckpointCorrupt(f"{where}: step {step} is negative")
        if version in DCP_FILES_VERSIONS:
            return cls(step, float(created), tuple(files), metadata, lineage, version)
        kind = _field(o, "kind", str, where)
        requires = _field(o, "requires", list, where)
        position = _field(o, "chain_position", int, where)
        codec = _field(o, "codec", dict, where)
        level, key_id = codec.get("compression_level"), codec.get("key_id")
        names = [parse_dirname(r) if isinstance(r, str) else None for r in requires]
        if kind not in ("base", "increment") or (kind == "base") != (not requires) or position < 1:
            raise CheckpointCorrupt(
                f"{where}: kind {shown(kind)} with requires {shown(requires)}, chain position {position}"
            )
        if not all(n is not None and n.lineage == lineage and n.step < step for n in names):
            raise CheckpointCorrupt(
                f"{where}: requires {shown(requires)} are not earlier checkpoints of lineage {lineage}"
            )
        if isinstance(level, bool) or not isinstance(level, int) or not 0 <= level <= 22:
            raise CheckpointCorrupt(f"{where}: codec compression_level {shown(level)} is not 0..22")
        if key_id is not None and not (isinstance(key_id, str) and _KEY_ID.fullmatch(key_id)):
            raise CheckpointCorrupt(f"{where}: codec key_id {shown(key_id)} is not a key id")
        return cls(
            step,
            float(created),
            tuple(files),
            metadata,
            lineage,
            version,
            kind,
            tuple(requires),
            position,
            level,
            key_id,
        )


@dataclass(frozen=True, slots=True)
class SavedTensor:
    name: str
    """The tensor's dotted path from :func:`replicaft.state.flat.flatten`; also its DCP key."""
    dtype: str
    shape: tuple[int, ...]
    """The global shape (a sharded tensor's, not one rank's shard)."""
    own: bool = False
    """Each rank of a sharded group saved its own value (see ``StateLayout.own_ranks``)."""


@dataclass(frozen=True, slots=True)
class StateLayout:
    skeleton: Any
    """The state with each tensor replaced by ``{"__tensor__": index}`` into ``tensors``."""
    tensors: tuple[SavedTensor, ...]
    own_ranks: int = 0
    """0: every plain (unsharded) tensor is one value for the whole group (replicated state).
    W > 0: the group's state was sharded over W ranks, and each rank saved its own value of
    every plain tensor (``SavedTensor.own``: FSDP's BatchNorm statistics differ per rank)
    under ``layout.dcp_key(name, rank)``."""
    index_sha256: str | None = None
    """The SHA-256 of the ``tensors.msgpack`` saved with this state (format version 4 on).
    Sealed with the state, it binds an encrypted checkpoint's readable index to it: an index
    copied in from another checkpoint of the chain refers only to chunks that open where they
    are (places.py), but not to this state's tensors (issue 37)."""

    def encode(self) -> bytes:
        o: dict[str, Any] = {
            "version": LAYOUT_VERSION,
            "skeleton": self.skeleton,
            "tensors": [[t.name, t.dtype, list(t.shape), *([True] if t.own else [])] for t in self.tensors],
        }
        if self.own_ranks:
            o["own_ranks"] = self.own_ranks
        if self.index_sha256 is not None:
            o["index_sha256"] = self.index_sha256
        return msgpack.packb(o, use_bin_type=True)

    @classmethod
    def decode(cls, raw: bytes, where: str) -> StateLayout:
        try:
            o = msgpack.unpackb(raw, raw=False, strict_map_key=False)
        except Exception as e:  # msgpack raises several unrelated types for bad input
            raise CheckpointCorrupt(f"{where} is not valid msgpack ({type(e).__name__}: {e})") from e
        if not isinstance(o, dict) or o.get("version") != LAYOUT_VERSION or "skeleton" not in o:
            raise CheckpointCorrupt(f"{where} is not a version {LAYOUT_VERSION} state layout")
        tensors = []
        for i, entry in enumerate(_field(o, "tensors", list, where)):
            ok = (
                isinstance(entry, list)
                and len(entry) in (3, 4)
                and isinstance(entry[0], str)
                and isinstance(entry[1], str)
                and entry[1] in DTYPES
                and isinstance(entry[2], list)
                and all(isinstance(d, int) and d >= 0 for d in entry[2])
                and (len(entry) == 3 or entry[3] is True)
            )
            if not ok:
                raise CheckpointCorrupt(f"{where}: tensors[{i}] = {shown(entry)} is not [name, dtype, shape(, own)]")
            tensors.append(SavedTensor(entry[0], entry[1], tuple(entry[2]), len(entry) == 4))
        own_ranks = o.get("own_ranks", 0)
        if isinstance(own_ranks, bool) or not isinstance(own_ranks, int) or own_ranks < 0:
            raise CheckpointCorrupt(f"{where}: own_ranks = {shown(own_ranks)} is not a rank count")
        index_sha256 = o.get("index_sha256")
        if index_sha256 is not None and not (isinstance(index_sha256, str) and _SHA256_HEX.fullmatch(index_sha256)):
            raise CheckpointCorrupt(f"{where}: index_sha256 = {shown(index_sha256)} is not a SHA-256")
        try:
            check_skeleton(o["skeleton"], len(tensors))
        except SkeletonError as e:
            # Checked here, not left to unflatten: a skeleton that nests 10 000 deep or names
            # a tensor twice is a damaged file, named as such (issue 19).
            raise CheckpointCorrupt(f"{where}: {e}") from None
        return cls(o["skeleton"], tuple(tensors), own_ranks, index_sha256)


def _field(o: dict[str, Any], name: str, kind: type | tuple[type, ...], where: str) -> Any:
    if name not in o:
        raise CheckpointCorrupt(f"{where} lacks the field {name!r}")
    value = o[name]
    if not isinstance(value, kind) or isinstance(value, bool):
        raise CheckpointCorrupt(f"{where}: field {name!r} = {shown(value)} has the wrong type")
    return value
