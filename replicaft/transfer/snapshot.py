"""A host snapshot of the training state: one flat buffer plus its manifest.

A persistent checkpoint is written from one (its writer never touches the live tensors), and
a donor's live snapshot (live.py) keeps in one what its healers still need when its
optimizer steps.
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
from replicaft.process.threads import lower_thread_priority
from replicaft.state.content import BufferHashes, copy_changed
from replicaft.state.flat import DTYPES, SMALL_TENSOR_BYTES, Flat, Sharding, tensor_bytes
from replicaft.transfer.checksum import digest
from replicaft.transfer.device import CopyEvent, CopyStream, device_of, raw_bytes, stream_for
from replicaft.transfer.manifest import CHUNK_BYTES, Manifest, TensorSpec, chunk_checksums, layout
from replicaft.transfer.wire import SEND_PIECE_BYTES

CAPTURE_NICENESS = 19
"""The background copy's CPU niceness (see BackgroundCapture)."""
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
            conn.sendall(data[i : i + SEND_PIECE_BYTES])

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


class BackgroundCapture:
    """A checkpoint snapshot copied on a thread while the training step goes on.

    Why it is safe: after a committed step the state changes again only when the next step
    commits (the optimizer steps after ``should_commit``), so a copy started at the step
    boundary may run through forward and backward, provided :meth:`finish` is called before
    anything writes the state. Two things can still write it earlier: a module's forward
    updating a buffer (BatchNorm statistics) and user code. So tensors smaller than
    ``copy_now_bytes`` (buffers, counters) and those named in ``copy_now`` are copied at once,
    and :meth:`finish` compares every deferred tensor's version counter (bumped by every
    in-place write, ``.data`` aside) with its value at the start: if one moved, the snapshot
    is refused, never a torn one saved. Checksums are not taken: the checkpoint writer
    checksums its files.

    The copy thread runs at the lowest CPU priority and copies in ``PIECE_BYTES`` pieces:
    during forward and backward it takes only CPU time the step leaves idle, and whatever
    is left at :meth:`finish` is copied by the training thread and the copy thread together.
    Measured on 2 cores at 1 GB: a copy at the step's priority made forward and backward
    ~180 ms slower, while the copy alone takes ~100 ms; with this, the save's step was
    6-180 ms slower than a plain one over two benchmark runs (a synchronous DCP save: 2.5 s).

    Device tensors (CUDA) are copied the same way, piece by piece, but by the copy stream
    (replicaft/transfer/device.py): the thread only queues device-to-host copies on a side stream, into
    the (pinned, reused) host buffer, ordered after the step's queued work; :meth:`finish` waits
    for their events, never for the compute stream.
    """

    PIECE_BYTES = 8 * 1024 * 1024

    def __init__(
        self,
        flat: Flat,
        *,
        step: int,
        quorum_id: int,
        replica_id: str,
        out: torch.Tensor | None = None,
        copy_now: frozenset[str] = frozenset(),
        copy_now_bytes: int = SMALL_TENSOR_BYTES,
        stream: CopyStream | None = None,
        content: BufferHashes | None = None,
    ) -> None:
        self.step = step
        self._plan = CopyPlan(flat, out, stream, content)
        self._header = {"step": step, "quorum_id": quorum_id, "replica_id": replica_id}
        now, later = [], []
        for i, (name, t) in enumerate(zip(flat.names, flat.tensors, strict=True)):
            (later if deferrable(t, copy_now_bytes) and name not in copy_now else now).append(i)
        self._plan.copy(now)
        self._versions = {i: version_counter(flat.tensors[i]) for i in later}
        self.deferred_bytes = sum(self._plan.sizes[i] for i in later)
        """Bytes copied behind the step (the rest were copied before the constructor returned)."""
        self._pieces = [piece for i in later for piece in self._pieces_of(i)]
        self._next_piece = 0
        self._lock = threading.Lock()
        self._error: BaseException | None = None
        self.changed: frozenset[str] = frozenset()
        """After :meth:`finish`: deferred tensors written while they were being copied."""
        self._thread = threading.Thread(target=self._copy_behind, name="replicaft-capture", daemon=True)
        self._thread.start()

    def _pieces_of(self, i: int) -> list[tuple[int, int, int]]:
        """``(i, lo, hi)`` byte ranges of tensor ``i``: one for a strided tensor or a device one
        not staged, which ``tensor_bytes`` copies to host whole on every call."""
        size = self._plan.sizes[i]
        t = self._plan.flat.tensors[i]
        piecewise = self._plan.staged(i) or (t.device.type == "cpu" and t.is_contiguous())
        step = self.PIECE_BYTES if piecewise else max(size, 1)
        return [(i, lo, min(lo + step, size)) for lo in range(0, size, step)]

    def _copy_behind(self) -> None:
        lower_thread_priority(CAPTURE_NICENESS, "the background state copy")
        self._copy_pieces()

    def _copy_pieces(self) -> None:
        """Copy pieces until none is left; run by the copy thread and, in finish, the training thread."""
        while True:
            with self._lock:
                if self._next_piece == len(self._pieces) or self._error is not None:
                    return
                piece = self._pieces[self._next_piece]
                self._next_piece += 1
            try:
                self._plan.copy_piece(*piece)
            except BaseException as e:  # reported by finish(), on the training thread
                self._error = e

    @property
    def buffer(self) -> torch.Tensor:
        return self._plan.buffer

    @property
    def running(self) -> bool:
        """The thread is still copying (after a :meth:`finish` that timed out)."""
        return self._thread.is_alive()

    def finish(self, timeout_s: float) -> tuple[Snapshot | None, str]:
        """Finish the copy; the snapshot, or None and why not (then ``buffer`` may be reused).

        Call before the state is written again. Blocks only for the part of the copy that
        has not overlapped the step yet, which this thread then helps copy.
        """
        self._copy_pieces()
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            return None, f"the background copy of the state did not finish within {timeout_s:g}s"
        if self._error is None:
            try:
                self._plan.wait_copies(time.monotonic() + timeout_s)
            except StateError as e:
                self._error = e
        if self._error is not None:
            return None, f"the background copy of the state failed: {type(self._error).__name__}: {self._error}"
        flat = self._plan.flat
        self.changed = frozenset(
            flat.names[i] for i, v in self._versions.items() if version_counter(flat.tensors[i]) != v
        )
        if self.changed:
            return (
                None,
                f"the state changed during the background copy (written in place: "
                f"{', '.join(sorted(self.changed)[:5])})",
            )
        return self._plan.snapshot(**self._header, chunk_bytes=CHUNK_BYTES, with_checksums=False), ""


def deferrable(t: torch.Tensor, copy_now_bytes: int) -> bool:
    """Whether ``t`` may be read after the step boundary, until the state is next written:
    it has a version counter to prove it was not written meanwhile, and is not small (small
    tensors, such as the buffers a forward updates, are copied at once)."""
    return version_counter(t) is not None and t.numel() * t.element_size() >= copy_now_bytes


def version_counter(t: torch.Tensor) -> int | None:
    """The tensor's in-place write counter; None for tensors without one (inference mode)."""
    try:
        return t._version
    except RuntimeError:
        return None


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
