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
* ranges are sent two chunks at a time straight from the live tensors (no copy: through a bounce
  buffer the donor's send cost a third more CPU, and one donor's heal ran at 1.1-1.4 GB/s
  instead of 1.8-2.0);
* :meth:`LiveSnapshot.seal`, before the optimizer step, waits a bounded time for the healers
  to have been sent every chunk (or to have said they have it all, :meth:`LiveSnapshot.release`:
  with several donors, each sends only part), then for sends in progress to end (``LIVE_SEND_BYTES`` each; past
  ``LIVE_SEND_GRACE_S``, a stalled healer's connection is shut, which ends its send), and
  copies into the host buffer only the chunks some expected healer has not been sent yet;
  later requests are served from that copy. A chunk every healer has been sent is not kept:
  a healer asks for a chunk again only from another donor, or in a new heal, which starts
  from a new snapshot. The kernel copies what ``send`` takes before it returns, so once no
  send is in progress nothing reads the live tensors.
* the host buffer is the rank's spare one (snapshot.SpareBuffer), warm from the last
  checkpoint's snapshot when there was one; once the snapshot is retired (no longer
  served) and no send reads it, it goes back for the next checkpoint or heal.

Device (CUDA) tensors cannot be sent from where they live: they are copied at the quorum into
the host buffer (pinned, on the copy stream's side stream, in pieces: snapshot.CopyPlan and
replicaft/transfer/device.py), checksummed there and served from that copy. The manifest carries every
chunk's digest, so that copy ends before the snapshot is served; it runs at the device's
pinned copy rate (tens of GB/s), well above a socket's.

Version counters read before the digests are compared at :meth:`seal`: if a live tensor was
written meanwhile (user code in forward), what went out may mix two states, and the seal
says so; the caller withdraws the snapshot.
"""

from __future__ import annotations

import dataclasses
import socket
import threading
import time

import torch

from replicaft.state.flat import SMALL_TENSOR_BYTES, Flat
from replicaft.transfer.capture import deferrable, version_counter
from replicaft.transfer.manifest import CHUNK_BYTES, Manifest
from replicaft.transfer.server import NotServed
from replicaft.transfer.snapshot import CopyPlan
from replicaft.transfer.spare import SpareBuffer
from replicaft.transfer.wire import SEND_PIECE_BYTES, send_bytes

LIVE_SEND_BYTES = SEND_PIECE_BYTES
"""The most of the live tensors one send takes between two looks at the seal (whole chunks):
8 MiB, two chunks, halved the per-chunk Python of a donor's send (segments, marking, the
send's setup: ~10 % of its CPU at 4 MiB on the 2-core host), and a seal waits for at most
that much of a send in progress."""
LIVE_SEND_GRACE_S = 2.0
"""How long :meth:`LiveSnapshot.seal` lets sends in progress end (``LIVE_SEND_BYTES`` each:
8 MiB take ~70 ms at 1 Gbit/s) before it shuts their connections: only a stalled healer takes longer."""
LIVE_SEND_EXIT_S = 30.0
"""How long it then waits for those sends to return."""


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
        spare: SpareBuffer | None = None,
        chunk_bytes: int = CHUNK_BYTES,
        copy_now_bytes: int = SMALL_TENSOR_BYTES,
    ) -> None:
        self.step = step
        self.readers = readers
        """The healers expected to fetch this snapshot (their ``reader`` in range requests)."""
        self._spare = spare
        """Where the host buffer comes from and, once retired and unread, goes back to (then None)."""
        self._plan = CopyPlan(flat, spare.take() if spare is not None else None)
        # Tensors not readable in place (device or strided: tensor_bytes copies them whole) go
        # to the host buffer at once, with those not deferrable.
        live = {
            i
            for i, t in enumerate(flat.tensors)
            if deferrable(t, copy_now_bytes) and t.device.type == "cpu" and t.is_contiguous()
        }
        now = [i for i in range(len(flat.tensors)) if i not in live]
        self._live = live
        self._versions = {i: version_counter(flat.tensors[i]) for i in live}
        self._plan.copy(now)
        manifest = self._plan.manifest(step=step, quorum_id=quorum_id, replica_id=replica_id, chunk_bytes=chunk_bytes)
        checksums = tuple(self._plan.live_checksums(live.__contains__, chunk_bytes))
        self.manifest: Manifest = dataclasses.replace(manifest, checksums=checksums)
        num_chunks = len(checksums)
        self._sent_to: list[set[str]] = [set() for _ in range(num_chunks)]
        self._undelivered = num_chunks if readers else 0
        """Chunks some expected healer has not been sent yet."""
        self._kept = [False] * num_chunks
        self._senders: set[object] = set()
        """Connections (or fault-hook buffers) reading the live tensors right now."""
        self._sealed = False
        self._copied = False
        """Sealed, and the chunks still needed are in the host buffer."""
        self._kept_reads = 0
        """Sends reading the host buffer right now."""
        self._retired = False
        self._cond = threading.Condition()
        self.kept_bytes = 0
        """Bytes copied at :meth:`seal` (chunks some healer had not been sent yet)."""
        self.waited_s = 0.0
        """How long :meth:`seal` waited for the healers (and sends in progress)."""
        self.reused_buffer = self._plan.reused
        """Whether the host buffer is the spare one, not a fresh allocation."""
        self.shut = 0
        """Connections :meth:`seal` shut: their sends outlasted ``LIVE_SEND_GRACE_S``."""

    def send(self, conn: socket.socket, start: int, stop: int, reader: str | None) -> None:
        """Send bytes ``[start, stop)`` on ``conn``: from the live tensors until sealed, then
        from the host copy (NotServed for bytes not kept)."""
        c = self.manifest.chunk_bytes
        piece = max(c, LIVE_SEND_BYTES // c * c)
        reading_kept = False
        try:
            a = start
            while a < stop:
                b = min(a - a % piece + piece, stop)
                with self._cond:
                    live = not self._sealed
                    if live:
                        self._senders.add(conn)
                if not live:
                    if not reading_kept:
                        self._begin_kept_read()
                        reading_kept = True
                    b = min(a - a % c + c, stop)  # chunk by chunk: some may not be kept
                    send_bytes(conn, self._kept_bytes(a, b))
                    with self._cond:
                        self._mark_sent(a, b, reader)
                        self._cond.notify_all()
                    a = b
                    continue
                sent = False
                try:
                    for segment in self._plan.segments(self._live.__contains__, a, b):
                        send_bytes(conn, memoryview(segment.numpy()))
                    sent = True
                finally:
                    self._sent(conn, a, b, reader if sent else None)
                a = b
        finally:
            if reading_kept:
                self._kept_read_done()

    def read(self, start: int, stop: int, reader: str | None, out: torch.Tensor) -> memoryview:
        """Bytes ``[start, stop)``, copied into ``out`` while live (for a state server's fault
        hook, which alters what it sends)."""
        with self._cond:
            live = not self._sealed
            if live:
                self._senders.add(out)
        if not live:
            self._begin_kept_read()
            try:
                out[: stop - start].copy_(torch.frombuffer(self._kept_bytes(start, stop), dtype=torch.uint8))
            finally:
                self._kept_read_done()
            with self._cond:
                self._mark_sent(start, stop, reader)
                self._cond.notify_all()
            return memoryview(out[: stop - start].numpy())
        read = False
        try:
            self._plan.fill(out[: stop - start], start, stop, self._live.__contains__)
            read = True
        finally:
            self._sent(out, start, stop, reader if read else None)
        return memoryview(out[: stop - start].numpy())

    def _sent(self, sender: object, start: int, stop: int, reader: str | None) -> None:
        """``sender`` stopped reading the live tensors; ``reader`` (None if the send failed)
        was sent the chunks ``[start, stop)`` covers whole."""
        with self._cond:
            self._senders.discard(sender)
            self._mark_sent(start, stop, reader)
            self._cond.notify_all()

    def _mark_sent(self, start: int, stop: int, reader: str | None) -> None:
        """Under the lock: ``reader`` (if any) was sent the chunks ``[start, stop)`` covers whole."""
        if reader is None:
            return
        for k in range(-(-start // self.manifest.chunk_bytes), self._chunk_end(stop)):
            sent = self._sent_to[k]
            if reader not in sent:
                sent.add(reader)
                if reader in self.readers and self.readers <= sent:
                    self._undelivered -= 1

    def _chunk_end(self, stop: int) -> int:
        """One past the last chunk that ends at or before ``stop`` (the last chunk may be short)."""
        c = self.manifest.chunk_bytes
        return len(self._kept) if stop >= self.manifest.total_bytes else stop // c

    def release(self, reader: str) -> None:
        """``reader`` has verified the whole state, from this donor and others: it will not ask
        for any chunk again, so :meth:`seal` neither waits for nor keeps a chunk for it."""
        with self._cond:
            for sent in self._sent_to:
                if reader not in sent:
                    sent.add(reader)
                    if reader in self.readers and self.readers <= sent:
                        self._undelivered -= 1
            self._cond.notify_all()

    def awaiting(self, timeout_s: float) -> frozenset[str]:
        """The expected healers not yet sent every chunk (nor said to have it all), after
        waiting up to ``timeout_s`` for there to be none; a retired snapshot awaits nobody."""
        with self._cond:
            self._cond.wait_for(lambda: self._undelivered == 0 or self._retired, max(timeout_s, 0.0))
            if self._retired:
                return frozenset()
            return frozenset(r for r in self.readers if any(r not in sent for sent in self._sent_to))

    def check(self, start: int, stop: int) -> None:
        """Raise NotServed if bytes ``[start, stop)`` are no longer served (sealed, not kept)."""
        with self._cond:
            if not self._sealed:
                return
            self._wait_copied()
        self._kept_bytes(start, stop)

    def _wait_copied(self) -> None:
        """Under the lock: wait for :meth:`seal` to have made the host copy (a request can come
        between the end of live reads and the end of the copy); NotServed if it does not come
        or the snapshot is retired."""
        if not self._cond.wait_for(lambda: self._copied, LIVE_SEND_EXIT_S):
            raise NotServed(f"the snapshot of step {self.step} is still being sealed")
        if self._retired:
            raise NotServed(f"the snapshot of step {self.step} is no longer served")

    def _begin_kept_read(self) -> None:
        """A send starts reading the host copy: it is not given back until
        :meth:`_kept_read_done`, even if the snapshot is retired meanwhile."""
        with self._cond:
            self._wait_copied()
            self._kept_reads += 1

    def _kept_bytes(self, start: int, stop: int) -> memoryview:
        c = self.manifest.chunk_bytes
        if not all(self._kept[start // c : -(-stop // c)]):
            raise NotServed(
                f"bytes {start}..{stop} of the snapshot of step {self.step} are not kept: every expected "
                f"healer ({sorted(self.readers)}) was sent them before the step ended"
            )
        return memoryview(self._plan.buffer.numpy())[start:stop]

    def _kept_read_done(self) -> None:
        with self._cond:
            self._kept_reads -= 1
            self._give_back_if_unread()

    def retire(self) -> None:
        """No longer served: once no send reads the host buffer, it goes back to the spare."""
        with self._cond:
            self._retired = True
            self._give_back_if_unread()
            self._cond.notify_all()

    def _give_back_if_unread(self) -> None:
        if self._retired and self._copied and not self._kept_reads and self._spare is not None:
            self._spare.give(self._plan.buffer)
            self._spare = None

    def seal(self, wait_s: float) -> str:
        """Stop reading the live tensors: call before anything writes them. Returns "" or why
        the snapshot must be withdrawn (a live tensor was written while it was served).

        Waits up to ``wait_s`` for every expected healer to have been sent every chunk; the
        chunks one has not been sent by then are copied into the host buffer.
        """
        started = time.monotonic()
        with self._cond:
            self._cond.wait_for(lambda: self._undelivered == 0, max(wait_s, 0.0))
            self._sealed = True
            if not self._cond.wait_for(lambda: not self._senders, LIVE_SEND_GRACE_S):
                for conn in self._senders:
                    if isinstance(conn, socket.socket):
                        _shut(conn)
                        self.shut += 1
                if not self._cond.wait_for(lambda: not self._senders, LIVE_SEND_EXIT_S):
                    return f"a send from the live state did not end within {LIVE_SEND_GRACE_S + LIVE_SEND_EXIT_S:g}s"
            self.waited_s = time.monotonic() - started
            c = self.manifest.chunk_bytes
            total = self.manifest.total_bytes
            unsent = [not self.readers <= sent for sent in self._sent_to]
            for first, last in _runs(unsent):  # one copy per run: the donor's step waits for it
                lo, hi = first * c, min((last + 1) * c, total)
                self._plan.fill(self._plan.buffer[lo:hi], lo, hi, self._live.__contains__)
                self._kept[first : last + 1] = [True] * (last + 1 - first)
                self.kept_bytes += hi - lo
            self._copied = True
            self._give_back_if_unread()
            self._cond.notify_all()
        flat = self._plan.flat
        changed = sorted(flat.names[i] for i, v in self._versions.items() if version_counter(flat.tensors[i]) != v)
        if changed:
            return f"the state changed while it was served (written in place: {', '.join(changed[:5])})"
        return ""


def _runs(flags: list[bool]) -> list[tuple[int, int]]:
    """The ``(first, last)`` index of each run of consecutive true ``flags``."""
    runs: list[tuple[int, int]] = []
    for k, flag in enumerate(flags):
        if not flag:
            continue
        if runs and runs[-1][1] == k - 1:
            runs[-1] = (runs[-1][0], k)
        else:
            runs.append((k, k))
    return runs


def _shut(conn: socket.socket) -> None:
    """End a stalled healer's connection: its blocked send returns at once. A TLS socket is
    shut at the TCP level, past ssl.SSLSocket.shutdown: that one drops the TLS state first, and a
    send racing it on another thread would go out as plaintext before the TCP shutdown."""
    try:
        socket.socket.shutdown(conn, socket.SHUT_RDWR)
    except OSError:
        pass
