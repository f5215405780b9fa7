"""``CheckpointTransport``: the base class torchft scripts may construct or subclass."""

from __future__ import annotations

from typing import Any


class CheckpointTransport:
    """Accepted by the compat ``Manager`` and not used: replicaft's transfer moves the state."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args = args
        self.kwargs = kwargs

    def metadata(self) -> str:
        return "replicaft"

    def disallow_checkpoint(self) -> None: ...

    def shutdown(self, wait: bool = True) -> None: ...
