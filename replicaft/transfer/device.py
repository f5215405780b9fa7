"""Stream-ordered copies between an accelerator and host memory, written once for CUDA and the CPU.

Why this module: the state a heal or a checkpoint moves lives, on a GPU job, in device memory,
while sockets, checksums and files read host memory. Copying a whole device tensor with
``.cpu()`` allocates a fresh, unpinned host tensor of its full size and blocks the calling
thread until the copy is done, and a plain ``copy_`` into a device tensor runs on the compute
stream, behind (and in front of) the training step. Instead:

* device-to-host copies run on a side stream (:class:`CudaCopyStream`), ordered after the work
  the compute stream had queued when the copy was asked for (:meth:`CopyStream.after_compute`),
  into pinned host memory (the rank's reused snapshot buffer), in pieces queued by a thread
  while the step goes on (capture.BackgroundCapture), waited for by event;
* host-to-device copies land in the healer's own tensors in place, on the side stream, from
  pinned staging buffers (:class:`StagingPool`, bounded and reused: a heal or a snapshot after
  the first allocates nothing) while the next piece is being received;
* every copy returns an event (:class:`CopyEvent`); whoever hands a buffer on waits for it, with
  a deadline.

:class:`HostCopyStream` is the same contract on the CPU: a worker thread performs the queued
copies in order, so the pipelines here (:class:`StagedWriter`, snapshot.CopyPlan's queued pieces) run their
real overlapped, buffer-reusing logic in CPU tests; only pinning needs CUDA.
"""

from __future__ import annotations

import collections
import queue
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Iterable

import torch

from replicaft.errors import StateError

STAGING_BUFFERS = 4
"""Staging buffers per pool: enough for a copy in flight on each side of the piece in use."""
EVENT_POLL_S = 0.0002
"""How often a wait on a CUDA event polls it (a CUDA event has no timed wait)."""


class CopyTimeout(StateError):
    """A copy between device and host did not complete within its deadline."""


class CopyEvent(ABC):
    """The completion of one queued copy (and of every copy queued before it on its stream)."""

    @abstractmethod
    def done(self) -> bool: ...

    @abstractmethod
    def wait(self, deadline: float) -> None:
        """Block until done; CopyTimeout past the monotonic ``deadline``; the copy's error if it failed."""


class CopyStream(ABC):
    """Copies performed in the order they were queued, beside the compute stream."""

    pins: bool = False
    """Whether host buffers for this stream are allocated pinned (page-locked)."""

    @abstractmethod
    def stages(self, t: torch.Tensor) -> bool:
        """Whether ``t``'s bytes are copied through this stream (else read in place by the host)."""

    @abstractmethod
    def after_compute(self) -> None:
        """Order the copies queued from now on after the work queued on the compute stream so far
        (call on the training thread: CUDA's current stream is per thread)."""

    @abstractmethod
    def copy(self, dst: torch.Tensor, src: torch.Tensor) -> CopyEvent:
        """Queue ``dst.copy_(src)``; neither may be touched by anyone else until the event is done."""

    def host_empty(self, num_bytes: int) -> torch.Tensor:
        """A uint8 host buffer this stream copies to and from at full speed (pinned on CUDA)."""
        return torch.empty(num_bytes, dtype=torch.uint8, pin_memory=self.pins)


class _CudaEvent(CopyEvent):
    def __init__(self, event: torch.cuda.Event) -> None:
        self._event = event

    def done(self) -> bool:
        return bool(self._event.query())

    def wait(self, deadline: float) -> None:
        while not self._event.query():
            if time.monotonic() >= deadline:
                raise CopyTimeout("a copy between the GPU and host memory did not complete within its deadline")
            time.sleep(EVENT_POLL_S)


class CudaCopyStream(CopyStream):
    """Copies on a side CUDA stream of ``device``, from and to pinned host memory, non-blocking."""

    pins = True

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._stream = torch.cuda.Stream(device)

    def stages(self, t: torch.Tensor) -> bool:
        return t.device == self.device and t.is_contiguous()

    def after_compute(self) -> None:
        self._stream.wait_stream(torch.cuda.current_stream(self.device))

    def copy(self, dst: torch.Tensor, src: torch.Tensor) -> CopyEvent:
        with torch.cuda.stream(self._stream):
            dst.copy_(src, non_blocking=True)
            for t in (dst, src):
                if t.is_cuda:  # the caching allocator must not reuse its memory before this copy ran
                    t.record_stream(self._stream)
            event = torch.cuda.Event()
            event.record(self._stream)
        return _CudaEvent(event)


class _HostEvent(CopyEvent):
    def __init__(self) -> None:
        self._done = threading.Event()
        self.error: BaseException | None = None

    def done(self) -> bool:
        return self._done.is_set()

    def wait(self, deadline: float) -> None:
        if not self._done.wait(max(0.0, deadline - time.monotonic())):
            raise CopyTimeout("a staged host copy did not complete within its deadline")
        if self.error is not None:
            raise StateError(f"a staged copy failed: {type(self.error).__name__}: {self.error}")

    def set(self) -> None:
        self._done.set()


class HostCopyStream(CopyStream):
    """The CPU implementation: one worker thread performs the queued copies in order.

    Used where the state is on the CPU but a caller wants the staged path (tests drive the
    pipelines with it): the copies really run beside the caller, in order, with events.
    """

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[tuple[torch.Tensor, torch.Tensor, _HostEvent]] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="replicaft-copies", daemon=True)
        self._thread.start()

    def stages(self, t: torch.Tensor) -> bool:
        return t.device.type == "cpu" and t.is_contiguous()

    def after_compute(self) -> None:
        """CPU compute is synchronous with the thread that asked: nothing is queued."""

    def copy(self, dst: torch.Tensor, src: torch.Tensor) -> CopyEvent:
        event = _HostEvent()
        self._queue.put((dst, src, event))
        return event

    def _run(self) -> None:
        while True:
            dst, src, event = self._queue.get()
            try:
                dst.copy_(src)
            except BaseException as e:  # reported by wait(), to the thread that queued it
                event.error = e
            event.set()


class StagingPool:
    """At most ``max_buffers`` host buffers of ``buffer_bytes`` each, allocated on first need and
    reused after. ``allocated`` counts allocations: a second heal must not add to it."""

    def __init__(self, stream: CopyStream, buffer_bytes: int, max_buffers: int = STAGING_BUFFERS) -> None:
        if buffer_bytes < 1 or max_buffers < 1:
            raise ValueError(f"buffer_bytes={buffer_bytes}, max_buffers={max_buffers}; both must be at least 1")
        self.stream = stream
        self.buffer_bytes = buffer_bytes
        self.max_buffers = max_buffers
        self.allocated = 0
        self.changes = 0
        self._free: list[torch.Tensor] = []
        self._cond = threading.Condition()

    def try_acquire(self) -> torch.Tensor | None:
        """A free buffer (allocated if the bound allows), or None at once."""
        with self._cond:
            return self._take()

    def acquire(self, deadline: float) -> torch.Tensor:
        """A free buffer, waiting for one to be released until the monotonic ``deadline``."""
        while True:
            seen = self.changes
            buffer = self.try_acquire()
            if buffer is not None:
                return buffer
            self.wait_for_change(seen, deadline)

    def release(self, buffer: torch.Tensor) -> None:
        with self._cond:
            self._free.append(buffer)
            self.changes += 1
            self._cond.notify_all()

    def changed(self) -> None:
        """Wake the waiters of :meth:`wait_for_change`: a buffer was queued for release."""
        with self._cond:
            self.changes += 1
            self._cond.notify_all()

    def wait_for_change(self, seen: int, deadline: float) -> None:
        """Wait until :attr:`changes` moves past ``seen`` (a release, or a buffer queued for
        one), until the monotonic ``deadline``."""
        with self._cond:
            while self.changes == seen:
                if not self._cond.wait(max(0.0, deadline - time.monotonic())):
                    raise CopyTimeout(
                        f"no staging buffer of {self.buffer_bytes} bytes was released in time "
                        f"(all {self.max_buffers} in use)"
                    )

    def _take(self) -> torch.Tensor | None:
        if self._free:
            return self._free.pop()
        if self.allocated < self.max_buffers:
            self.allocated += 1
            return self.stream.host_empty(self.buffer_bytes)
        return None


class StagedWriter:
    """Host-to-device writes through a :class:`StagingPool`: fill a buffer (receive into it,
    check it), hand it to :meth:`land` with where its bytes go, fill the next while the copies
    run. Thread-safe: several connections of one heal share one writer."""

    def __init__(self, pool: StagingPool) -> None:
        self.pool = pool
        self._pending: collections.deque[tuple[torch.Tensor, CopyEvent]] = collections.deque()
        self._lock = threading.Lock()

    def buffer(self, deadline: float) -> torch.Tensor:
        """A staging buffer to fill: a free one, else the oldest whose copies are done (waited
        for). With none free and none pending, every buffer is being filled by another thread:
        wait until one is landed or released, then look again (a landed buffer is reaped here,
        whoever landed it, so a writer that has finished leaves nothing stranded)."""
        while True:
            seen = self.pool.changes
            self._reap(block_until=None)
            buffer = self.pool.try_acquire()
            if buffer is not None:
                return buffer
            if not self._reap(block_until=deadline):
                self.pool.wait_for_change(seen, deadline)

    def land(self, buffer: torch.Tensor, copies: Iterable[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Queue each ``(dst, src)`` copy (``src`` a slice of ``buffer``); ``buffer`` goes back to
        the pool once they are done."""
        event = None
        for dst, src in copies:
            event = self.pool.stream.copy(dst, src)
        if event is None:
            self.pool.release(buffer)
            return
        with self._lock:
            self._pending.append((buffer, event))
        self.pool.changed()

    def finish(self, deadline: float) -> None:
        """Wait for every queued copy; the buffers go back to the pool."""
        while self._reap(block_until=deadline):
            pass

    def _reap(self, block_until: float | None) -> bool:
        """Release the buffers whose copies are done; with ``block_until``, first wait for the
        oldest pending one. Returns whether one was released."""
        released = False
        while True:
            with self._lock:
                if not self._pending:
                    return released
                buffer, event = self._pending[0]
                if not event.done() and (block_until is None or released):
                    return released
                self._pending.popleft()
            try:
                event.wait(block_until if block_until is not None else time.monotonic())
            finally:
                self.pool.release(buffer)
            released = True


def raw_bytes(t: torch.Tensor) -> torch.Tensor:
    """A 1-D uint8 tensor over ``t``'s memory (contiguous ``t``, any device) with a version
    counter of its own: writing through it does not count as a write of ``t`` by the step
    (a heal's version check, catchup.py), just as the CPU path's writes through a memoryview."""
    nbytes = t.numel() * t.element_size()
    raw = torch.empty(0, dtype=torch.uint8, device=t.device)
    return raw.set_(t.untyped_storage(), t.storage_offset() * t.element_size(), (nbytes,))


def on_accelerator(t: torch.Tensor) -> bool:
    """Whether ``t``'s bytes must be staged through host memory (not a CPU tensor)."""
    return t.device.type != "cpu"


_streams: dict[torch.device, CopyStream] = {}
_pools: dict[tuple[torch.device, int], StagingPool] = {}
_registry_lock = threading.Lock()


def stream_for(device: torch.device) -> CopyStream:
    """This process's copy stream for ``device`` (one per device, made on first use)."""
    with _registry_lock:
        stream = _streams.get(device)
        if stream is None:
            if device.type != "cuda":
                raise StateError(
                    f"no copy stream for device {device}: replicaft stages CUDA tensors only; "
                    "move the state to the CPU or a CUDA device"
                )
            stream = _streams[device] = CudaCopyStream(device)
        return stream


def pool_for(stream: CopyStream, buffer_bytes: int) -> StagingPool:
    """This process's staging pool for ``stream`` and buffers of ``buffer_bytes`` (reused by every heal)."""
    key = (getattr(stream, "device", torch.device("cpu")), buffer_bytes)
    with _registry_lock:
        pool = _pools.get(key)
        if pool is None or pool.stream is not stream:
            pool = _pools[key] = StagingPool(stream, buffer_bytes)
        return pool


def device_of(tensors: Iterable[torch.Tensor]) -> torch.device | None:
    """The one accelerator device among ``tensors`` (None if all are on the CPU)."""
    devices = {t.device for t in tensors if on_accelerator(t)}
    if len(devices) > 1:
        raise StateError(
            f"the state spans several devices ({sorted(map(str, devices))}); a rank's registered "
            "state must live on one device (its own GPU) or the CPU"
        )
    return next(iter(devices), None)
