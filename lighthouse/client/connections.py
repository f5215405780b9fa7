"""The client's gRPC channels to the lighthouses it knows, and the calls it opens on them.

One channel per lighthouse address, opened on first use (a channel connects in the
background) and closed together with the client. Every call carries the job's token, and
waits for a ready channel only where that helps (:attr:`Connections.wait_for_ready`).

Split from async_client.py, which holds the session and the requests on it: this is the I/O
every call of the client goes through. Which lighthouse to call is not decided here but by
:class:`~lighthouse.client.channels.Targets`, a pure object (channels.py); a call always goes
to its ``current``.
"""

from __future__ import annotations

import grpc

from lighthouse.client.channels import CHANNEL_OPTIONS, Targets
from lighthouse.config.options import TOKEN_METADATA_KEY
from lighthouse.tls.files import TlsFiles, grpc_aio_channel
from lighthouse.wire import protocol


class Connections:
    """The channels of one client, used on its event loop only; no I/O until a call."""

    def __init__(self, targets: Targets, *, token: str | None, tls: TlsFiles | None) -> None:
        self.targets = targets
        self.tls = tls
        self.metadata = ((TOKEN_METADATA_KEY, token),) if token else ()
        self.wait_for_ready = not targets.replicated and tls is None
        """One plaintext lighthouse: a call waits for it through a restart. A replicated set:
        fail fast, the session moves on to the leader. TLS: fail fast too, since a call that
        waits for a channel ready never hears of a failed handshake (a wrong CA), only of
        its deadline; a restart is then bridged by the session's reconnect pauses."""
        self._channels: dict[str, grpc.aio.Channel] = {}

    def open(self) -> None:
        """Open the channel to ``targets.current``, so that it connects while the caller goes on."""
        self._channel_to(self.targets.current)

    def session(self) -> grpc.aio.StreamStreamCall:
        """A session stream with ``targets.current``; the first attempt does not wait for a
        ready channel (Targets.first_attempt says why)."""
        return self._channel_to(self.targets.current).stream_stream(protocol.SESSION_METHOD)(
            metadata=self.metadata, wait_for_ready=self.wait_for_ready and not self.targets.first_attempt
        )

    async def unary(self, method: str, body: bytes, timeout_s: float) -> bytes:
        """Call ``method`` of ``targets.current`` with ``body``; raises grpc.aio.AioRpcError."""
        assert self._channels, "start() the client first"
        call = self._channel_to(self.targets.current).unary_unary(method)
        return await call(body, timeout=timeout_s, metadata=self.metadata, wait_for_ready=self.wait_for_ready)

    async def close(self) -> None:
        for channel in self._channels.values():
            await channel.close()
        self._channels.clear()

    def _channel_to(self, address: str) -> grpc.aio.Channel:
        channel = self._channels.get(address)
        if channel is None:
            channel = self._channels[address] = grpc_aio_channel(address, self.tls, CHANNEL_OPTIONS)
        return channel
