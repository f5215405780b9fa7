"""The one reusable host buffer a rank copies its state into, shared by checkpoints and heals."""

from __future__ import annotations

import threading

import torch

from replicaft.state.content import BufferHashes


class SpareBuffer:
    """The host buffer a rank's next copy of its state reuses, once nothing reads it.

    A rank copies its state into host memory for two things in turn: a persistent
    checkpoint's snapshot (replicaft/persistence/duties.py) and the chunks a donor's live snapshot keeps for
    its healers (live.py). A fresh buffer costs a page fault per 4 KiB, about as much as the
    copy itself (measured), so both take the one spare buffer held here and give it back
    when they are done with it. The price: host memory of up to one copy of the state stays
    allocated (resident where it was written) between uses. Thread-safe.
    """

    def __init__(self) -> None:
        self._buffer: torch.Tensor | None = None
        self._content: BufferHashes | None = None
        self._lock = threading.Lock()

    def take(self) -> torch.Tensor | None:
        """The spare buffer, now the caller's alone; None if there is none. What it held is
        forgotten: the caller may write it any way it likes."""
        return self.take_with_content()[0]

    def take_with_content(self) -> tuple[torch.Tensor | None, BufferHashes | None]:
        """The spare buffer and the content hashes of what it holds (replicaft/state/content.py),
        for a caller that writes it only through ``CopyPlan`` (a checkpoint capture)."""
        with self._lock:
            taken = self._buffer, self._content
            self._buffer, self._content = None, None
        return taken

    def give(self, buffer: torch.Tensor, content: BufferHashes | None = None) -> None:
        """Keep ``buffer`` for the next copy (the larger one, if another was given meanwhile),
        with ``content``, the hashes of what it holds, where the giver knows them."""
        with self._lock:
            if self._buffer is None or buffer.numel() > self._buffer.numel():
                self._buffer, self._content = buffer, content
