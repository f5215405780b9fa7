"""``CheckpointTransport[T]``: torchft's interface for moving a state dict to a healer.

A script may build torchft's ``HTTPTransport`` or ``PGTransport`` and hand it to the
``Manager`` (accepted there and not used: the manager heals over replicaft's own transfer),
or drive one itself: ``send_checkpoint`` on the donor, ``metadata()`` carried to the healer
by the script, ``recv_checkpoint`` there. Both shim transports do that over replicaft's
transfer (transfer_transport.py); a subclass of this base implements the three methods itself.
"""

from __future__ import annotations

import datetime
from typing import Any, Generic, TypeVar

__all__ = ["CheckpointTransport"]

T = TypeVar("T")


class CheckpointTransport(Generic[T]):
    """torchft's base: ``metadata``, ``send_checkpoint``, ``recv_checkpoint``, ``disallow_checkpoint``,
    ``shutdown``. The constructor takes any arguments, so a torchft subclass's ``super().__init__()``
    and a bare ``CheckpointTransport()`` handed to the ``Manager`` both work."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args = args
        self.kwargs = kwargs

    def metadata(self) -> str:
        """What a healer's ``recv_checkpoint`` needs to reach this transport."""
        return "replicaft"

    def send_checkpoint(self, dst_ranks: list[int], step: int, state_dict: T, timeout: datetime.timedelta) -> None:
        raise NotImplementedError(
            f"{type(self).__name__}.send_checkpoint: implement it, or use HTTPTransport or PGTransport"
        )

    def recv_checkpoint(self, src_rank: int, metadata: str, step: int, timeout: datetime.timedelta) -> T:
        raise NotImplementedError(
            f"{type(self).__name__}.recv_checkpoint: implement it, or use HTTPTransport or PGTransport"
        )

    def disallow_checkpoint(self) -> None:
        """Stop serving what ``send_checkpoint`` offered; the state may change from now on."""

    def shutdown(self, wait: bool = True) -> None: ...
