"""torchft's checkpoint transports, on replicaft's transfer.

torchft heals through a pluggable ``CheckpointTransport`` (HTTP with pickle, or a process
group). replicaft heals over its own verified, striped, pickle-free transfer
(replicaft/transfer), so a transport handed to the ``Manager`` is accepted and not used; the
manager logs that once. A script that drives a transport itself gets working
``send_checkpoint``/``recv_checkpoint`` from both, over that same transfer
(transfer_transport.py). Importable from the same paths as in torchft.
"""

from replicaft.compat.torchft.checkpointing.http_transport import HTTPTransport
from replicaft.compat.torchft.checkpointing.pg_transport import PGTransport
from replicaft.compat.torchft.checkpointing.transport import CheckpointTransport

__all__ = ["CheckpointTransport", "HTTPTransport", "PGTransport"]
