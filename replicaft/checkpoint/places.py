"""What a sealed piece of an encrypted checkpoint is: its *place*, the AES-GCM associated data.

A checkpoint's ``manifest.json`` and ``tensors.msgpack`` are readable and, without a key,
writable: their checksums are not keyed. Sealing each piece under the key proves its bytes
were written by a key holder, but not *where* they belong: before format version 4 (issue 37)
swapping two tensors' chunk references in the index loaded the two tensors swapped, and step
100's ``state.msgpack`` in step 200's directory resumed "step 200" with step 100's counters.

So every sealed piece names what it is, in the clear beside its ciphertext, and that name is
authenticated as associated data:

* ``state.msgpack``: the role ``state`` and the checkpoint (directory name: step and lineage);
* a chunk: the checkpoint whose pack holds it, the pack and the offset there, the tensor (its
  DCP key and, for a shard, the shard's offsets) and the chunk's byte offset in it.

The reader computes the place it is about to read a piece into (from the manifest's step and
lineage, or from the index's reference and the tensor it is filling) and refuses a piece
that names another one, naming both; a name edited to match fails the seal. Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgpack

from lighthouse.errors import shown
from replicaft.checkpoint.layout import lineage_label, parse_dirname
from replicaft.errors import CheckpointCorrupt

STATE = "state"
CHUNK = "chunk"
MAX_PLACE_BYTES = 0xFFFF
"""A place is stored behind a 2-byte length."""


@dataclass(frozen=True, slots=True)
class Place:
    checkpoint: str
    """The directory name of the checkpoint holding the piece (its step and lineage)."""
    role: str
    """``STATE`` or ``CHUNK``."""
    tensor: str = ""
    shard: tuple[int, ...] = ()
    """The piece's offsets in the global tensor (all zeros for a whole tensor)."""
    offset: int = 0
    """The chunk's byte offset in its piece."""
    pack: int = 0
    at: int = 0
    """The chunk's byte offset in its pack."""

    @classmethod
    def state(cls, checkpoint: str) -> Place:
        return cls(checkpoint, STATE)

    @classmethod
    def chunk(cls, checkpoint: str, pack: int, at: int, tensor: str, shard: tuple[int, ...], offset: int) -> Place:
        return cls(checkpoint, CHUNK, tensor, shard, offset, pack, at)

    def encode(self) -> bytes:
        raw = msgpack.packb(
            [self.role, self.checkpoint, self.tensor, list(self.shard), self.offset, self.pack, self.at],
            use_bin_type=True,
        )
        if len(raw) > MAX_PLACE_BYTES:
            raise ValueError(f"the place of tensor {self.tensor[:80]}… is {len(raw)} bytes, over {MAX_PLACE_BYTES}")
        return raw

    @classmethod
    def decode(cls, raw: bytes, where: str) -> Place:
        """The place a piece says it is; raises CheckpointCorrupt for anything no writer wrote."""
        try:
            o = msgpack.unpackb(raw, raw=False)
        except Exception as e:  # msgpack raises several unrelated types for bad input
            raise CheckpointCorrupt(f"{where}: the place it is sealed for is not valid msgpack ({e})") from None
        ok = (
            isinstance(o, list)
            and len(o) == 7
            and o[0] in (STATE, CHUNK)
            and isinstance(o[1], str)
            and isinstance(o[2], str)
            and isinstance(o[3], list)
            and all(_count(d) for d in o[3])
            and all(_count(v) for v in o[4:])
        )
        if not ok:
            raise CheckpointCorrupt(f"{where}: the place it is sealed for, {shown(o)}, is malformed")
        return cls(o[1], o[0], o[2], tuple(o[3]), o[4], o[5], o[6])

    def describe(self) -> str:
        """How a place is named in messages: the step and lineage, and for a chunk the tensor,
        its offset there and where it is stored."""
        name = parse_dirname(self.checkpoint)
        whose = (
            f"step {name.step} of lineage {lineage_label(name.lineage)}"
            if name is not None
            else f"checkpoint {shown(self.checkpoint)}"
        )
        if self.role == STATE:
            return f"the state of {whose}"
        shard = f" (shard at {list(self.shard)})" if any(self.shard) else ""
        return f"tensor {self.tensor}{shard} bytes {self.offset}.. of {whose}, stored in pack-{self.pack}.bin@{self.at}"


def misplaced(said: Place, expected: Place, where: str) -> CheckpointCorrupt:
    """The refusal of a piece found at ``expected`` that is sealed for ``said``."""
    return CheckpointCorrupt(
        f"{where}: refused: it is sealed as {said.describe()}, but was found as {expected.describe()} "
        "(a piece moved, swapped or copied in from elsewhere)"
    )


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 62
