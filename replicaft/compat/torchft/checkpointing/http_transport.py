"""``HTTPTransport(timeout, num_chunks)``, accepted (see the package docstring)."""

from replicaft.compat.torchft.checkpointing.transport import CheckpointTransport


class HTTPTransport(CheckpointTransport):
    """torchft's HTTP transport (pickle on the wire); replicaft heals over its own transfer instead."""
