"""A host snapshot of the training state: one flat buffer plus its manifest.

A persistent checkpoint is written from one (its writer never touches the live tensors), and
a donor's live snapshot (live.py) keeps in one what its healers still need when its
optimizer steps. :class:`CopyPlan` lays the tensors out in the buffer and copies them in;
copying behind the training step instead of at once is capture.py's.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
import socket
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch

from replicaft.errors import StateError
from replicaft.state.content import BufferHashes, copy_changed
from replicaft.state.flat import DTYPES, Flat, Sharding, tensor_bytes
from replicaft.transfer.checksum import digest
from replicaft.transfer.device import CopyEvent, CopyStream, device_of, raw_bytes, stream_for
from replicaft.transfer.manifest import CHUNK_BYTES, Manifest, TensorSpec, chunk_checksums, layout
from replicaft.transfer.wire import SEND_PIECE_BYTES, send_bytes

COPY_TIMEOUT_S = 120.0
"""How long a copy of the state out of device memory may take before it is reported failed."""


@dataclass(frozen=True, slots=True)
class Snapshot:
    buffer: torch.Tensor
    """uint8, CPU, ``manifest.total_bytes`` long."""
    manifest: Manifest
    shardings: tuple[Sharding | None, ...] | None = None
    """From :attr:`Flat.shardings`: for a checkpoint writer, never served."""
    content: BufferHashes | None = None
    """What is known of the buffer's content hashes (replicaft/state/content.py): the pieces a
    capture found unchanged in a reused buffer; the checkpoint writer adds the rest."""

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
        stream: CopyStream | None = None,
        content: BufferHashes | None = None,
    ) -> Snapshot:
        """Copy the state into one host buffer. ``with_checksums=False`` skips the per-chunk
        digests (a pass over the bytes): a checkpoint writer checksums its files itself, and only a
        snapshot served to healers needs them. ``out`` (uint8, large enough) is reused instead of
        a fresh allocation: a fresh buffer costs a page fault per 4 KiB, about half the copy's
        time (measured), and nothing may still be reading ``out``; ``content``, what ``out``
        holds (its last snapshot's :attr:`content`), spares copying and hashing what did not change."""
        plan = CopyPlan(flat, out, stream, content)
        plan.copy(range(len(flat.tensors)))
        return plan.snapshot(
            step=step,
            quorum_id=quorum_id,
            replica_id=replica_id,
            chunk_bytes=chunk_bytes,
            with_checksums=with_checksums,
        )

    def send(self, conn: socket.socket, start: int, stop: int, reader: str | None) -> None:
        """Send bytes ``[start, stop)`` of the buffer on ``conn`` (for a state server)."""
        data = memoryview(self.buffer.numpy())[start:stop]
        for i in range(0, len(data), SEND_PIECE_BYTES):
            send_bytes(conn, data[i : i + SEND_PIECE_BYTES])

    def read(self, start: int, stop: int, reader: str | None, out: torch.Tensor) -> memoryview:
        """Bytes ``[start, stop)`` of the buffer (``reader`` and ``out`` are for a
        :class:`~replicaft.transfer.live.LiveSnapshot`; a snapshot needs neither)."""
        return memoryview(self.buffer.numpy())[start:stop]

    def check(self, start: int, stop: int) -> None:
        """A snapshot serves every byte of its buffer."""

    def retire(self) -> None:
        """No longer served: its buffer is freed with it, once no request reads it."""

    def release(self, reader: str) -> None:
        """``reader`` has the whole state (a snapshot keeps its buffer regardless)."""

    def awaiting(self, timeout_s: float) -> frozenset[str]:
        """A snapshot does not know its readers: it awaits nobody."""
        return frozenset()


class CopyPlan:
    """Where each tensor of ``flat`` goes in one uint8 buffer, and the copies into it.

    Tensors ``stream`` stages (device tensors, on the process's copy stream of their device
    unless one is given) are copied by queued copies into the buffer, pinned where the stream
    pins: a reused ``out`` that is not pinned is replaced once, then the pinned one is reused.
    ``content``: the content hashes of what ``out`` holds; host tensors' pieces found unchanged
    are not copied and keep their hashes (:attr:`content`, content.copy_changed).
    """

    def __init__(
        self,
        flat: Flat,
        out: torch.Tensor | None,
        stream: CopyStream | None = None,
        content: BufferHashes | None = None,
    ) -> None:
        self.flat = flat
        self.sizes = [t.numel() * t.element_size() for t in flat.tensors]
        self.offsets, self.total = layout(self.sizes)
        if stream is None:
            device = device_of(flat.tensors)
            stream = stream_for(device) if device is not None else None
        self._stream = stream
        self._staged = frozenset(i for i, t in enumerate(flat.tensors) if stream is not None and stream.stages(t))
        self._events: list[CopyEvent] = []
        self._events_lock = threading.Lock()
        pin = bool(self._staged) and stream is not None and stream.pins
        self.reused = (
            out is not None and out.dtype == torch.uint8 and out.numel() >= self.total and (out.is_pinned() or not pin)
        )
        """Whether ``out`` is the buffer (else a fresh one was allocated)."""
        if self.reused and out is not None:
            self.buffer = out[: self.total]
        else:
            self.buffer = (
                stream.host_empty(self.total)
                if pin and stream is not None
                else torch.empty(self.total, dtype=torch.uint8)
            )
        self.ends = [*self.offsets[1:], self.total] if self.offsets else []
        if stream is not None and self._staged:
            stream.after_compute()
        self._known = content if self.reused and content else None
        self.content: BufferHashes = {}

    def staged(self, i: int) -> bool:
        """Whether tensor ``i`` is copied by the copy stream (see :meth:`wait_copies`)."""
        return i in self._staged

    def copy(self, indices: Iterable[int]) -> None:
        """Copy tensors ``indices`` whole; returns once they are in the buffer."""
        for i in indices:
            self.copy_piece(i, 0, self.sizes[i])
        self.wait_copies(time.monotonic() + COPY_TIMEOUT_S)

    def copy_piece(self, i: int, lo: int, hi: int) -> None:
        """Bytes ``[lo, hi)`` of tensor ``i``; the piece ending the tensor also zeroes its padding.
        A staged tensor's piece is only queued: it is in the buffer after :meth:`wait_copies`."""
        offset = self.offsets[i]
        if i in self._staged and self._stream is not None:
            event = self._stream.copy(self.buffer[offset + lo : offset + hi], raw_bytes(self.flat.tensors[i])[lo:hi])
            with self._events_lock:
                self._events.append(event)
        elif self._known is None:
            self.buffer[offset + lo : offset + hi].copy_(tensor_bytes(self.flat.tensors[i])[lo:hi])
        else:
            copy_changed(
                tensor_bytes(self.flat.tensors[i])[lo:hi],
                self.buffer[offset + lo : offset + hi],
                offset=offset,
                lo=lo,
                size=self.sizes[i],
                known=self._known,
                kept=self.content,
            )
        if hi == self.sizes[i]:
            # The alignment padding is part of the checksummed bytes: left uninitialised, two
            # donors of the same state would disagree (seen: "donors disagree" with equal digests).
            self.buffer[offset + hi : self.ends[i]].zero_()

    def wait_copies(self, deadline: float) -> None:
        """Wait for the queued copies of staged tensors; CopyTimeout past the monotonic ``deadline``."""
        with self._events_lock:
            events, self._events = self._events, []
        for event in events:
            event.wait(deadline)

    @property
    def shardings(self) -> tuple[Sharding | None, ...] | None:
        return tuple(self.flat.shardings) if self.flat.shardings is not None else None

    def manifest(self, *, step: int, quorum_id: int, replica_id: str, chunk_bytes: int) -> Manifest:
        """The manifest of the buffer, without checksums."""
        flat = self.flat
        specs = tuple(
            TensorSpec(name, str(t.dtype).removeprefix("torch."), tuple(t.shape), offset, size)
            for name, t, offset, size in zip(flat.names, flat.tensors, self.offsets, self.sizes, strict=True)
        )
        return Manifest(
            step=step,
            quorum_id=quorum_id,
            replica_id=replica_id,
            skeleton=flat.skeleton,
            tensors=specs,
            total_bytes=self.total,
            chunk_bytes=chunk_bytes,
            checksums=(),
        )

    def snapshot(
        self, *, step: int, quorum_id: int, replica_id: str, chunk_bytes: int, with_checksums: bool
    ) -> Snapshot:
        m = self.manifest(step=step, quorum_id=quorum_id, replica_id=replica_id, chunk_bytes=chunk_bytes)
        snapshot = Snapshot(self.buffer, m, self.shardings, self.content)
        return checksummed(snapshot) if with_checksums else snapshot

    def segments(self, is_live: Callable[[int], bool], start: int = 0, stop: int | None = None) -> list[torch.Tensor]:
        """The buffer's bytes ``[start, stop)`` as they are, or will be once copied: uint8
        tensors in order, tensor ``i``'s bytes read from the tensor itself where ``is_live(i)``
        and from the buffer otherwise, each followed by its zero padding."""
        stop = self.total if stop is None else stop
        out: list[torch.Tensor] = []
        first = max(bisect.bisect_right(self.offsets, start) - 1, 0)
        for i in range(first, bisect.bisect_left(self.offsets, stop)):
            lo, data_end, hi = self.offsets[i], self.offsets[i] + self.sizes[i], self.ends[i]
            a, b = max(lo, start), min(hi, stop)
            if a < min(b, data_end):
                source = tensor_bytes(self.flat.tensors[i]) if is_live(i) else self.buffer[lo:data_end]
                out.append(source[a - lo : min(b, data_end) - lo])
            if b > max(a, data_end):
                out.append(torch.zeros(b - max(a, data_end), dtype=torch.uint8))
        return out

    def live_checksums(self, is_live: Callable[[int], bool], chunk_bytes: int) -> list[bytes]:
        """The chunk digests of the buffer as it will be once copied (see :meth:`segments`): the
        same bytes :func:`checksummed` reads after a copy."""
        checksums = []
        pieces: list[memoryview] = []
        filled = 0
        for segment in self.segments(is_live):
            view = memoryview(segment.numpy())
            while len(view):
                take = view[: chunk_bytes - filled]
                pieces.append(take)
                filled += len(take)
                view = view[len(take) :]
                if filled == chunk_bytes:
                    checksums.append(digest(pieces))
                    pieces, filled = [], 0
        if pieces:
            checksums.append(digest(pieces))
        return checksums

    def fill(self, out: torch.Tensor, start: int, stop: int, is_live: Callable[[int], bool]) -> None:
        """Write the buffer's bytes ``[start, stop)`` (see :meth:`segments`) into ``out``."""
        position = 0
        for segment in self.segments(is_live, start, stop):
            out[position : position + len(segment)].copy_(segment)
            position += len(segment)


def checksummed(snapshot: Snapshot) -> Snapshot:
    """``snapshot`` with the per-chunk checksums a healer verifies (a pass over its bytes)."""
    m = snapshot.manifest
    checksums = tuple(chunk_checksums(memoryview(snapshot.buffer.numpy()), m.chunk_bytes))
    return dataclasses.replace(snapshot, manifest=dataclasses.replace(m, checksums=checksums))


def tensors_from_buffer(buffer: torch.Tensor, manifest: Manifest) -> list[torch.Tensor]:
    """Views of ``buffer`` shaped as the manifest's tensors (no copy)."""
    out = []
    for spec in manifest.tensors:
        raw = buffer[spec.offset : spec.offset + spec.num_bytes]
        out.append(raw.view(spec_dtype(spec)).reshape(spec.shape))
    return out


def spec_dtype(spec: TensorSpec) -> torch.dtype:
    """The dtype of a manifest tensor, once its dtype, shape, size and offset agree.

    The manifest came off the wire: a spec whose dtype, shape and byte count disagree raises
    StateError naming the tensor rather than a torch error from inside ``view``.
    """
    dtype = DTYPES.get(spec.dtype)
    if dtype is None:
        raise StateError(f"manifest tensor {spec.name} has unknown dtype {spec.dtype!r}; known: {sorted(DTYPES)}")
    expected = math.prod(spec.shape) * dtype.itemsize
    if spec.num_bytes != expected or spec.offset % dtype.itemsize:
        raise StateError(
            f"manifest tensor {spec.name}: {spec.num_bytes} bytes at offset {spec.offset} cannot hold "
            f"{spec.dtype} of shape {list(spec.shape)} ({expected} bytes at a multiple of {dtype.itemsize})"
        )
    return dtype
