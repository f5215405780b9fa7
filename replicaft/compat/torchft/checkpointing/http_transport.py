"""``HTTPTransport(timeout, num_chunks)``: torchft's HTTP transport, over replicaft's transfer.

``send_checkpoint`` and ``recv_checkpoint`` work (transfer_transport.py), without pickle: the
bytes travel in replicaft's striped, checksummed ranges, so ``num_chunks`` (torchft's split of
the pickle into parallel requests) is accepted and not needed. ``allow_checkpoint(step)``
(torchft's call before a send) and ``address()`` are kept.
"""

from __future__ import annotations

import datetime
from typing import TypeVar

from replicaft.compat.torchft.checkpointing.transfer_transport import TransferTransport

__all__ = ["HTTPTransport"]

T = TypeVar("T")


class HTTPTransport(TransferTransport[T]):
    """torchft's ``HTTPTransport``; the received tensors are on the CPU, as torchft's."""

    def __init__(self, timeout: datetime.timedelta, num_chunks: int = 0) -> None:
        super().__init__(timeout)
        self.num_chunks = num_chunks

    def address(self) -> str:
        return self.metadata()

    def allow_checkpoint(self, step: int) -> None:
        """torchft serves the last sent state once allowed; here a send serves it at once."""
