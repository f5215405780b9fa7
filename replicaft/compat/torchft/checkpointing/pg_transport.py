"""``PGTransport(pg, timeout, device)``, accepted (see the package docstring)."""

from replicaft.compat.torchft.checkpointing.transport import CheckpointTransport


class PGTransport(CheckpointTransport):
    """torchft's process-group transport; replicaft heals over its own transfer instead."""
