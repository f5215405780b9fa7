"""A donor's heal snapshot served from its live tensors, copied only where a healer still needs it.

Why not copy the state first: on a donor's one busy core, copying 1.6 GB into a fresh host
buffer took 4.4 s (a first touch of host memory costs ~4 ms per MB on the benchmark VM,
against ~0.1 ms per MB to reuse it), and the healer could not start until it was done.
Serving the live tensors needs no copy: between the step boundary where the snapshot is
taken and the optimizer step that ends the step, nothing writes the registered state
(forward and backward write gradients and, for BatchNorm, buffers, which are copied at once
like every small tensor). So:

* at the quorum, the manifest and its chunk digests are taken from the live tensors (a
  read-only pass, ~20 GB/s) and the snapshot is served at once;
* each range request is copied piece by piece from the live tensors into the connection's
  small reused bounce buffer and sent from there, so a live tensor is read only for the
  length of a memcpy, never while a send waits on a slow healer;
* :meth:`LiveSnapshot.seal`, before the optimizer step, waits a bounded time for the healers
  to have been sent every chunk, then copies into the host buffer only the chunks some
  expected healer has not been sent yet; later requests are served from that copy. A chunk
  every healer has been sent is not kept: a healer asks for a chunk again only from another
  donor, or in a new heal, which starts from a new snapshot.

Version counters read before the digests are compared at :meth:`seal`: if a live tensor was
written meanwhile (user code in forward), what went out may mix two states, and the seal
says so; the caller withdraws the snapshot.
"""

from __future__ import annotations

import dataclasses
import threading
import time

import torch

from replicaft.state import SMALL_TENSOR_BYTES, Flat
from replicaft.transfer.manifest import CHUNK_BYTES, Manifest
from replicaft.transfer.server import NotServed
from replicaft.transfer.snapshot import CopyPlan, version_counter

LIVE_READ_TIMEOUT_S = 30.0
"""How long :meth:`LiveSnapshot.seal` waits for live reads in progress (each one memcpy)."""


class LiveSnapshot:
    """The state at ``step``, served live until sealed; see the module docstring."""

    def __init__(
        self,
        flat: Flat,
        *,
        step: int,
        quorum_id: int,
        replica_id: str,
        readers: frozenset[str],
        chunk_bytes: int = CHUNK_BYTES,
        copy_now_bytes: int = SMALL_TENSOR_BYTES,
    ) -> None:
        self.step = step
        self.readers = readers
        """The healers expected to fetch this snapshot (their ``reader`` in range requests)."""
        self._plan = CopyPlan(flat, None)
        # Small tensors (buffers a forward updates, counters) and those not readable in place
        # (device or strided: tensor_bytes copies them whole) go to the host buffer at once.
        now = [i for i, t in enumerate(flat.tensors)
               if version_counter(t) is None or t.numel() * t.element_size() < copy_now_bytes
               or t.device.type != "cpu" or not t.is_contiguous()]
        live = set(range(len(flat.tensors))) - set(now)
        self._live = live
        self._versions = {i: version_counter(flat.tensors[i]) for i in live}
        self._plan.copy(now)
        manifest = self._plan.manifest(step=step, quorum_id=quorum_id, replica_id=replica_id, chunk_bytes=chunk_bytes)
        checksums = tuple(self._plan.live_checksums(live.__contains__, chunk_bytes))
        self.manifest: Manifest = dataclasses.replace(manifest, checksums=checksums)
        num_chunks = len(checksums)
        self._sent_to: list[set[str]] = [set() for _ in range(num_chunks)]
        self._kept = [False] * num_chunks
        self._live_reads = 0
        self._sealed = False
        self._cond = threading.Condition()
        self.kept_bytes = 0
        """Bytes copied at :meth:`seal` (chunks some healer had not been sent yet)."""
        self.waited_s = 0.0
        """How long :meth:`seal` waited for the healers."""

    def read(self, start: int, stop: int, reader: str | None, bounce: torch.Tensor) -> memoryview:
        """Bytes ``[start, stop)``, copied into ``bounce`` while live (``bounce`` must hold them)."""
        with self._cond:
            live = not self._sealed
            if live:
                self._live_reads += 1
        if not live:
            return self._kept_bytes(start, stop)
        try:
            out = bounce[: stop - start]
            self._plan.fill(out, start, stop, self._live.__contains__)
        finally:
            with self._cond:
                self._live_reads -= 1
                if reader is not None:
                    c = self.manifest.chunk_bytes
                    for k in range(-(-start // c), self._chunk_end(stop)):
                        self._sent_to[k].add(reader)
                self._cond.notify_all()
        return memoryview(out.numpy())

    def _chunk_end(self, stop: int) -> int:
        """One past the last chunk that ends at or before ``stop`` (the last chunk may be short)."""
        c = self.manifest.chunk_bytes
        return len(self._kept) if stop >= self.manifest.total_bytes else stop // c

    def _kept_bytes(self, start: int, stop: int) -> memoryview:
        c = self.manifest.chunk_bytes
        if not all(self._kept[start // c : -(-stop // c)]):
            raise NotServed(f"bytes {start}..{stop} of the snapshot of step {self.step} are not kept: every expected "
                             f"healer ({sorted(self.readers)}) was sent them before the step ended")
        return memoryview(self._plan.buffer.numpy())[start:stop]

    def _delivered(self) -> bool:
        return all(self.readers <= sent for sent in self._sent_to)

    def seal(self, wait_s: float) -> str:
        """Stop reading the live tensors: call before anything writes them. Returns "" or why
        the snapshot must be withdrawn (a live tensor was written while it was served).

        Waits up to ``wait_s`` for every expected healer to have been sent every chunk; the
        chunks one has not been sent by then are copied into the host buffer.
        """
        started = time.monotonic()
        with self._cond:
            self._cond.wait_for(self._delivered, max(wait_s, 0.0))
            self.waited_s = time.monotonic() - started
            self._sealed = True
            if not self._cond.wait_for(lambda: self._live_reads == 0, LIVE_READ_TIMEOUT_S):
                return f"a read of the live state did not end within {LIVE_READ_TIMEOUT_S:g}s"
            c = self.manifest.chunk_bytes
            total = self.manifest.total_bytes
            for k, sent in enumerate(self._sent_to):
                if not self.readers <= sent:
                    lo, hi = k * c, min((k + 1) * c, total)
                    self._plan.fill(self._plan.buffer[lo:hi], lo, hi, self._live.__contains__)
                    self._kept[k] = True
                    self.kept_bytes += hi - lo
        flat = self._plan.flat
        changed = sorted(flat.names[i] for i, v in self._versions.items() if version_counter(flat.tensors[i]) != v)
        if changed:
            return f"the state changed while it was served (written in place: {', '.join(changed[:5])})"
        return ""
