"""torchft's transports' ``send_checkpoint`` and ``recv_checkpoint`` over replicaft's transfer.

``send_checkpoint(dst_ranks, step, state_dict, timeout)`` copies the state into one host
snapshot (``replicaft.transfer.snapshot``) and serves it, as the only step, on this transport's
``StateServer``, whose address is ``metadata()``; ``recv_checkpoint(src_rank, metadata, step,
timeout)`` fetches that step from the address with replicaft's striped, checksummed client and
rebuilds the state dict. Nothing is pickled: a state holds tensors and plain values (None, bool,
int, float, str, bytes, lists, tuples, dicts), anything else is refused by ``send_checkpoint``
naming its path. torchft's HTTP transport sends a pickle, and its process-group one sends
tensors over the group; here both run over the same transfer, so ``PGTransport``'s group is
only accepted. The server binds ``REPLICAFT_HOST`` (default 127.0.0.1, as replicaft's manager)
and checks ``REPLICAFT_TOKEN`` where it is set; the healer presents the same. TLS is not offered here.
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Callable
from typing import Any, TypeVar

import torch

from lighthouse.config.options import TOKEN_ENV
from replicaft.compat.torchft.checkpointing.transport import CheckpointTransport
from replicaft.errors import OptionsError
from replicaft.state.flat import flatten, unflatten
from replicaft.transfer.client import fetch_state
from replicaft.transfer.donors import Donor
from replicaft.transfer.server import StateServer
from replicaft.transfer.snapshot import Snapshot

__all__ = ["TransferTransport"]

T = TypeVar("T")


def _seconds(timeout: datetime.timedelta | float, what: str) -> float:
    seconds = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else float(timeout)
    if not seconds > 0:
        raise OptionsError(f"{what}: timeout={timeout!r}; it must be positive")
    return seconds


class TransferTransport(CheckpointTransport[T]):
    """A transport serving its sends on a state server of its own (see the module docstring).

    ``state_dict``: like torchft's ``PGTransport``, a function returning this process's own
    state, whose tensors a received state is written into in place where path, dtype and shape
    match (contiguous CPU or CUDA tensors: replicaft/transfer/placement.py); until a receive
    has returned they hold partial bytes. ``device``: where received tensors that are not
    written in place are put."""

    def __init__(
        self,
        timeout: datetime.timedelta | float,
        *,
        device: torch.device | str | None = None,
        state_dict: Callable[[], Any] | None = None,
    ) -> None:
        super().__init__()
        self._timeout_s = _seconds(timeout, type(self).__name__)
        self._device = None if device is None else torch.device(device)
        self._own_state = state_dict
        self._token = os.environ.get(TOKEN_ENV) or None
        self._server: StateServer | None = None
        """Started on first use: a transport handed to the ``Manager`` is never used."""
        self._address = ""

    def _serving(self) -> StateServer:
        if self._server is None:
            self._server = StateServer(os.environ.get("REPLICAFT_HOST") or "127.0.0.1", self._token)
            self._address = self._server.start()
        return self._server

    def metadata(self) -> str:
        """This transport's state server, ``host:port``: what the healer's ``recv_checkpoint`` takes."""
        self._serving()
        return self._address

    def send_checkpoint(
        self, dst_ranks: list[int], step: int, state_dict: T, timeout: datetime.timedelta | None = None
    ) -> None:
        """Serve a copy of ``state_dict`` as ``step`` (replacing any earlier step) until
        ``disallow_checkpoint``; returns once the copy is made, so the caller may change its
        state then. Any healer that has ``metadata()`` may fetch it, ``dst_ranks`` or not."""
        if not isinstance(state_dict, dict):
            raise OptionsError(
                f"send_checkpoint(step={step}): the state must be a dict, got {type(state_dict).__name__}"
            )
        server = self._serving()
        server.publish(Snapshot.capture(flatten(state_dict), step=step, quorum_id=0, replica_id=self._address))
        server.retain({step})

    def recv_checkpoint(self, src_rank: int, metadata: str, step: int, timeout: datetime.timedelta | None = None) -> T:
        """The state ``src_rank``'s transport serves as ``step``, from its ``metadata()``;
        raises ``replicaft.errors.HealError`` if it cannot be fetched and verified in time."""
        if not isinstance(metadata, str) or ":" not in metadata:
            raise OptionsError(
                f"recv_checkpoint(src_rank={src_rank}, metadata={metadata!r}): pass the sender's "
                "transport.metadata() (its host:port)"
            )
        timeout_s = self._timeout_s if timeout is None else _seconds(timeout, "recv_checkpoint")
        into = None
        if self._own_state is not None:
            own = flatten(self._own_state())
            into = dict(zip(own.names, own.tensors, strict=True))
        result = fetch_state(
            [Donor(f"rank{src_rank}", metadata)], step, token=self._token, timeout_s=timeout_s, into=into
        )
        tensors = result.tensors
        if self._device is not None:
            tensors = [t if t.device == self._device else t.to(self._device) for t in tensors]
        return unflatten(result.manifest.skeleton, tensors)  # type: ignore[no-any-return]

    def disallow_checkpoint(self) -> None:
        if self._server is not None:
            self._server.retain(set())

    def shutdown(self, wait: bool = True) -> None:
        if self._server is not None:
            self._server.stop()
