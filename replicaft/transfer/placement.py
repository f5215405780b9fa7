"""Where a healer puts each byte it receives: into its own tensors where it can, else new memory.

A snapshot is one byte range (manifest.py): tensors at aligned offsets with padding between
them. The healer receives stripes of that range; a :class:`Placement` maps every byte of it
to a destination. A tensor the healer already holds with the same name, dtype and shape
(contiguous, on the CPU) receives its bytes in place: its pages exist, so the receive costs no
page faults (a fresh buffer pays one per 4 KiB, about as much as the copy), and applying it
later is no copy at all. Every other tensor, and the padding the chunk checksums also cover,
goes to one new buffer (from a warm standby's reserve where it fits, reserve.py: a new
process has no optimizer moments yet, so with Adam this buffer is two thirds of the state).

In place means the healer's tensors hold partly received bytes while the heal runs and, if it
fails, afterwards: the caller must treat its state as invalid from the first byte on until a
heal completes (replicaft.manager does), and must not hand over tensors that its own step
writes while the transfer runs (the manager passes only large ones and checks their version
counters before applying).

A target in device memory (CUDA) is received in place too, through host staging: a chunk is
received into a pinned staging buffer (device.py, reused from heal to heal), verified there
(checksums on the host copy), then copied into the target on a side stream while the next
chunk is received (:meth:`Placement.receive`); :meth:`Placement.finish` waits for those copies.
Those writes go through a tensor with its own version counter (device.raw_bytes), like the
CPU path's writes through a memoryview, so the healer's version check sees only its own steps.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping

import torch

from replicaft.process import reserve
from replicaft.transfer.device import (
    CopyStream,
    StagedWriter,
    device_of,
    pool_for,
    raw_bytes,
    stream_for,
)
from replicaft.transfer.manifest import Manifest
from replicaft.transfer.snapshot import spec_dtype


class Placement:
    def __init__(
        self, manifest: Manifest, into: Mapping[str, torch.Tensor] | None = None, stream: CopyStream | None = None
    ) -> None:
        """``stream``: the copy stream staging targets go through (default: the process's
        stream for the device of ``into``'s device tensors, if any)."""
        into = into or {}
        self.manifest = manifest
        if stream is None:
            device = device_of(into.values())
            stream = stream_for(device) if device is not None else None
        self._writer = StagedWriter(pool_for(stream, manifest.chunk_bytes)) if stream is not None else None
        self._staged: dict[int, torch.Tensor] = {}
        """Segment start -> the raw bytes of a target received through staging (see the docstring)."""
        self._dtypes = [spec_dtype(spec) for spec in manifest.tensors]  # StateError for a bad spec
        self.in_place: dict[str, torch.Tensor] = {}
        """Manifest name -> the caller's tensor that receives it in place."""
        starts: list[int] = []
        targets: list[memoryview | None] = []  # None: the scratch buffer, at the same relative position
        scratch_bytes = 0
        scratch_at: list[int] = []
        position = 0
        for spec in manifest.tensors:
            target = into.get(spec.name)
            staged = target is not None and stream is not None and stream.stages(target)
            if target is not None and (staged or target.device.type == "cpu") and _fits(target, spec.dtype, spec.shape):
                if spec.offset > position:
                    starts.append(position)
                    targets.append(None)
                    scratch_at.append(scratch_bytes)
                    scratch_bytes += spec.offset - position
                starts.append(spec.offset)
                if staged:
                    self._staged[spec.offset] = raw_bytes(target)
                    targets.append(memoryview(b""))
                else:
                    targets.append(memoryview(target.detach().reshape(-1).view(torch.uint8).numpy()))
                scratch_at.append(-1)
                self.in_place[spec.name] = target
                position = spec.offset + spec.num_bytes
        if position < manifest.total_bytes or not starts:
            starts.append(position)
            targets.append(None)
            scratch_at.append(scratch_bytes)
            scratch_bytes += manifest.total_bytes - position
        self.scratch = reserve.empty(scratch_bytes, torch.uint8)
        scratch_view = memoryview(self.scratch.numpy())
        ends = [*starts[1:], manifest.total_bytes]
        self._starts = starts
        self._views = [
            view if view is not None else scratch_view[at : at + end - start]
            for view, at, start, end in zip(targets, scratch_at, starts, ends, strict=True)
        ]
        self._lengths = [end - start for start, end in zip(starts, ends, strict=True)]
        self._scratch_at = dict(zip(starts, scratch_at, strict=True))

    @property
    def in_place_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.in_place.values())

    def receive(self, start: int, stop: int, deadline: float) -> Landing:
        """Writable views that together are bytes [start, stop) (at most one chunk) of the
        snapshot, in order: the final memory, or a staging buffer for targets on a device."""
        landing = Landing(self._writer)
        i = bisect.bisect_right(self._starts, start) - 1
        while start < stop:
            segment_start = self._starts[i]
            piece_stop = min(stop, segment_start + self._lengths[i])
            raw = self._staged.get(segment_start)
            if raw is None:
                landing.pieces.append(self._views[i][start - segment_start : piece_stop - segment_start])
            else:
                landing.stage(raw[start - segment_start : piece_stop - segment_start], deadline)
            start = piece_stop
            i += 1
        return landing

    def finish(self, deadline: float) -> None:
        """Wait for the copies into targets on a device (StateError past ``deadline``)."""
        if self._writer is not None:
            self._writer.finish(deadline)

    def tensors(self) -> list[torch.Tensor]:
        """One tensor per manifest tensor, in order: the caller's own, or a view of the scratch."""
        out = []
        for spec, dtype in zip(self.manifest.tensors, self._dtypes, strict=True):
            own = self.in_place.get(spec.name)
            if own is not None:
                out.append(own)
                continue
            i = bisect.bisect_right(self._starts, spec.offset) - 1
            at = self._scratch_at[self._starts[i]] + spec.offset - self._starts[i]
            raw = self.scratch[at : at + spec.num_bytes]
            out.append(raw.view(dtype).reshape(spec.shape))
        return out


class Landing:
    """The views one chunk is received into; :meth:`land` (once it verified) sends the staged
    part on to the device, :meth:`drop` gives an unlanded staging buffer back."""

    def __init__(self, writer: StagedWriter | None) -> None:
        self._writer = writer
        self.pieces: list[memoryview] = []
        self._buffer: torch.Tensor | None = None
        self._used = 0
        self._copies: list[tuple[torch.Tensor, torch.Tensor]] = []

    def stage(self, dst: torch.Tensor, deadline: float) -> None:
        assert self._writer is not None, "a staged target needs the placement's writer"
        if self._buffer is None:
            self._buffer = self._writer.buffer(deadline)
        src = self._buffer[self._used : self._used + dst.numel()]
        self._used += dst.numel()
        self.pieces.append(memoryview(src.numpy()))
        self._copies.append((dst, src))

    def land(self) -> None:
        if self._buffer is not None and self._writer is not None:
            self._writer.land(self._buffer, self._copies)
            self._buffer = None

    def drop(self) -> None:
        if self._buffer is not None and self._writer is not None:
            self._writer.pool.release(self._buffer)
            self._buffer = None


def _fits(target: torch.Tensor, dtype: str, shape: tuple[int, ...]) -> bool:
    return (
        target.is_contiguous()
        and str(target.dtype).removeprefix("torch.") == dtype
        and tuple(target.shape) == shape
        and math.prod(shape) > 0
    )
