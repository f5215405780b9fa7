"""A host snapshot of the training state: one flat buffer plus its manifest.

Donors serve heals from a snapshot rather than from live tensors, so their optimizer step
never waits for a transfer; the same buffer can feed a persistent checkpoint writer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from replicaft.errors import StateError
from replicaft.state import DTYPES, Flat, Sharding, tensor_bytes
from replicaft.transfer.manifest import CHUNK_BYTES, Manifest, TensorSpec, chunk_checksums, layout


@dataclass(frozen=True, slots=True)
class Snapshot:
    buffer: torch.Tensor
    """uint8, CPU, ``manifest.total_bytes`` long."""
    manifest: Manifest
    shardings: tuple[Sharding | None, ...] | None = None
    """From :attr:`Flat.shardings`: for a checkpoint writer, never served."""

    @classmethod
    def capture(
        cls,
        flat: Flat,
        *,
        step: int,
        quorum_id: int,
        replica_id: str,
        chunk_bytes: int = CHUNK_BYTES,
        with_checksums: bool = True,
        out: torch.Tensor | None = None,
    ) -> Snapshot:
        """Copy the state into one host buffer. ``with_checksums=False`` skips the per-chunk
        CRCs (a pass over the bytes): a checkpoint writer checksums its files itself, and only a
        snapshot served to healers needs them. ``out`` (uint8, large enough) is reused instead of
        a fresh allocation: a fresh buffer costs a page fault per 4 KiB, about half the copy's
        time (measured), and nothing may still be reading ``out``."""
        views = [tensor_bytes(t) for t in flat.tensors]
        offsets, total = layout([v.numel() for v in views])
        reuse = out is not None and out.dtype == torch.uint8 and out.numel() >= total
        buffer = out[:total] if reuse and out is not None else torch.empty(total, dtype=torch.uint8)
        ends = [*offsets[1:], total] if offsets else []
        for view, offset, end in zip(views, offsets, ends, strict=True):
            buffer[offset : offset + view.numel()].copy_(view)
            # The alignment padding is part of the checksummed bytes: left uninitialised, two
            # donors of the same state would disagree (seen: "donors disagree" with equal digests).
            buffer[offset + view.numel() : end].zero_()
        specs = tuple(
            TensorSpec(name, str(t.dtype).removeprefix("torch."), tuple(t.shape), offset, view.numel())
            for name, t, view, offset in zip(flat.names, flat.tensors, views, offsets, strict=True)
        )
        manifest = Manifest(
            step=step,
            quorum_id=quorum_id,
            replica_id=replica_id,
            skeleton=flat.skeleton,
            tensors=specs,
            total_bytes=total,
            chunk_bytes=chunk_bytes,
            checksums=tuple(chunk_checksums(memoryview(buffer.numpy()), chunk_bytes)) if with_checksums else (),
        )
        return cls(buffer, manifest, tuple(flat.shardings) if flat.shardings is not None else None)


def tensors_from_buffer(buffer: torch.Tensor, manifest: Manifest) -> list[torch.Tensor]:
    """Views of ``buffer`` shaped as the manifest's tensors (no copy).

    The manifest came off the wire: a spec whose dtype, shape and byte count disagree raises
    StateError naming the tensor rather than a torch error from inside ``view``.
    """
    out = []
    for spec in manifest.tensors:
        dtype = DTYPES.get(spec.dtype)
        if dtype is None:
            raise StateError(f"manifest tensor {spec.name} has unknown dtype {spec.dtype!r}; known: {sorted(DTYPES)}")
        expected = math.prod(spec.shape) * dtype.itemsize
        if spec.num_bytes != expected or spec.offset % dtype.itemsize:
            raise StateError(
                f"manifest tensor {spec.name}: {spec.num_bytes} bytes at offset {spec.offset} cannot hold "
                f"{spec.dtype} of shape {list(spec.shape)} ({expected} bytes at a multiple of {dtype.itemsize})"
            )
        raw = buffer[spec.offset : spec.offset + spec.num_bytes]
        out.append(raw.view(dtype).reshape(spec.shape))
    return out
