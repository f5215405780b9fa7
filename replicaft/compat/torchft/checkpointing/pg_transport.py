"""``PGTransport(pg, timeout, device, state_dict=None)``: torchft's process-group transport,
over replicaft's transfer.

``send_checkpoint`` and ``recv_checkpoint`` work (transfer_transport.py). torchft sends the
tensors over ``pg``; here they travel over replicaft's transfer, so ``pg`` is accepted and not
used, and the healer passes the sender's ``metadata()`` (its server's address; torchft's
manager carries it in the quorum, a script carries it itself). Received tensors go to
``device``, or into ``state_dict()``'s tensors in place where they match, as in torchft.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from typing import TypeVar

import torch

from replicaft.compat.torchft.checkpointing.transfer_transport import TransferTransport

__all__ = ["PGTransport"]

T = TypeVar("T")


class PGTransport(TransferTransport[T]):
    """torchft's ``PGTransport``; see the module docstring."""

    def __init__(
        self,
        pg: object,
        timeout: datetime.timedelta = datetime.timedelta(seconds=60),
        device: torch.device | str = "cpu",
        state_dict: Callable[[], object] | None = None,
    ) -> None:
        super().__init__(timeout, device=device, state_dict=state_dict)
        self.pg = pg
