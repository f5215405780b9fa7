"""Memory faulted in ahead of need, for the large buffers a restarted group allocates as it heals.

Why: the first write to a page costs a page fault, and on a VM whose balloon takes back freed
memory (free page reporting, as on the benchmark machine) a fault in the host as well. Writing
1.5 GB of fresh memory took 0.5-3.2 s there, erratically; writing it again 0.06-0.1 s. A
restarted group allocates two such buffers at its start: DDP's gradient buckets (one copy of
the parameters) and the heal's buffer for what it does not already hold (the optimizer's
moments, which a new process does not have yet, transfer/placement.py). With Adam that is the
size of the whole state, written while the heal runs, and it made the heal miss the first
step it could have landed in (catchup.py replays the step then, which costs seconds more).

So a warm standby (standby.py) maps a reserve and faults it in while it waits, sized by the
launcher from the state size its groups reported (the ``state_size`` event). The buckets and
the heal's buffer are taken from it with :func:`empty`; in any other process, and once the
reserve is used up, :func:`empty` is ``torch.empty``.

The reserve is a bump allocator over one anonymous mapping: what is taken is never given back.
What it serves lives as long as the process (the buckets; the heal's buffer becomes the
optimizer's state), except the buffer of a heal that failed, whose retry then gets fresh memory.
Only CPU tensors come from it, and the launcher sizes it by the CPU part of the state, so a
standby of a job whose state is on GPUs holds next to nothing (a MiB of slack).
"""

from __future__ import annotations

import mmap
import threading

import torch

ALIGNMENT = 64
"""Bytes; what torch's CPU allocator aligns to."""


class MemoryReserve:
    """``num_bytes`` of anonymous memory, every page of it faulted in when this returns."""

    def __init__(self, num_bytes: int) -> None:
        if num_bytes <= 0:
            raise ValueError(f"a memory reserve needs a positive size, got {num_bytes}")
        self._map = mmap.mmap(-1, num_bytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _POPULATE)
        self._bytes = torch.frombuffer(self._map, dtype=torch.uint8)
        if not _POPULATE:
            self._bytes.fill_(0)
        self.num_bytes = num_bytes
        self.used_bytes = 0
        """Taken so far, alignment included."""
        self._lock = threading.Lock()

    def take(self, numel: int, dtype: torch.dtype) -> torch.Tensor | None:
        """A 1-D tensor of ``numel`` elements (zeros) from the reserve; None if it does not fit."""
        num_bytes = numel * dtype.itemsize
        with self._lock:
            start = -(-self.used_bytes // ALIGNMENT) * ALIGNMENT
            if num_bytes <= 0 or start + num_bytes > self.num_bytes:
                return None
            self.used_bytes = start + num_bytes
        return self._bytes[start : start + num_bytes].view(dtype)


_POPULATE = getattr(mmap, "MAP_POPULATE", 0)
_reserve: MemoryReserve | None = None


def install(num_bytes: int) -> MemoryReserve:
    """Map and fault in a reserve of ``num_bytes`` for this process, replacing any earlier one.

    Called by a standby before it runs the script (an earlier reserve, if replaced, has had
    nothing taken from it yet, so no tensor still points into it)."""
    global _reserve
    _reserve = MemoryReserve(num_bytes)
    return _reserve


def installed() -> MemoryReserve | None:
    return _reserve


def empty(numel: int, dtype: torch.dtype, device: torch.device | str = "cpu") -> torch.Tensor:
    """A 1-D tensor of ``numel`` elements: from the reserve where it fits (zeros), else ``torch.empty``."""
    if _reserve is not None and torch.device(device).type == "cpu":
        tensor = _reserve.take(numel, dtype)
        if tensor is not None:
            return tensor
    return torch.empty(numel, dtype=dtype, device=device)
