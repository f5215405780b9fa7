"""The fence of a group of one rank, asked from the training thread: no hop through the loop.

A group commits a step only once the lighthouse confirms that the step's quorum is still
current and the group still in it (commit.py). A group of W > 1 ranks gathers its votes on
rank 0's loop (coordinator.py), which then asks the lighthouse. A group of one rank has no
votes to gather, and there the loop only added two thread hops to the one round trip the
step must wait for: measured in the step-overhead benchmark (10 MB, 2 groups, 2 cores),
the vote took 1.7-2.1 ms through the loop and 1.2-1.3 ms with the fence asked here, the
fence's own round trip being ~1.2 ms either way. So rank 0 of a group of one asks the
lighthouse itself, over a blocking channel of its own, while the session (heartbeats,
quorums, notices) stays on the loop.

The call goes to the lighthouse the session currently talks to (``Targets.current``, which
moves to the leader of a replicated set), with the job's token and TLS. Like the loop's
fence it never raises for I/O: a lighthouse that cannot be reached, or that refuses, means
"no", and the step is retried. Most steps never get here with a question: within the commit
lease the step's quorum granted (lighthouse/rules/commit_lease.py), the answer is known, and the
vote took 0.04 ms instead of 1.2-1.4 ms in the same benchmark.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import grpc

from lighthouse.client.channels import CHANNEL_OPTIONS, translate
from lighthouse.config.options import TOKEN_METADATA_KEY
from lighthouse.rules.commit_lease import WITHIN_LEASE
from lighthouse.tls.files import TlsFiles, grpc_channel
from lighthouse.wire import envelope, protocol
from lighthouse.wire.fence import FenceRequest, FenceResponse


class BlockingFence:
    """Asks the lighthouse whether ``replica_id`` may commit a step; one owner, any one thread."""

    def __init__(
        self,
        replica_id: str,
        current_address: Callable[[], str],
        commit_lease_covers: Callable[[int, int], bool],
        *,
        token: str | None,
        tls: TlsFiles | None,
        wait_for_ready: bool,
    ) -> None:
        self.replica_id = replica_id
        self._current_address = current_address
        """The lighthouse the session talks to now (read on the caller's thread: a str swap)."""
        self._lease_covers = commit_lease_covers
        """The session's commit lease (lighthouse/rules/commit_lease.py): within it, no question to ask."""
        self._metadata = ((TOKEN_METADATA_KEY, token),) if token else ()
        self._tls = tls
        self._wait_for_ready = wait_for_ready
        self._channels: dict[str, grpc.Channel] = {}
        self._lock = threading.Lock()
        """Guards ``_channels`` against ``close`` from another thread (shutdown)."""
        self._closed = False

    def fence(self, quorum_id: int, step: int, timeout_s: float) -> FenceResponse:
        """May this group commit ``step`` of ``quorum_id``? Blocks at most ``timeout_s``; never
        raises for I/O (an unreachable or refusing lighthouse answers "no")."""
        if self._lease_covers(quorum_id, step):
            return FenceResponse(True, WITHIN_LEASE)
        address = self._current_address()
        with self._lock:
            if self._closed:
                return FenceResponse(False, "the manager is shutting down")
            channel = self._channels.get(address)
            if channel is None:
                channel = self._channels[address] = grpc_channel(address, self._tls, CHANNEL_OPTIONS)
        try:
            raw = channel.unary_unary(protocol.FENCE_METHOD)(
                envelope.encode(FenceRequest(self.replica_id, quorum_id, step)),
                timeout=timeout_s,
                metadata=self._metadata,
                wait_for_ready=self._wait_for_ready,
            )
        except grpc.RpcError as e:
            return FenceResponse(False, f"lighthouse did not confirm the quorum: {translate(e, address)}")
        return FenceResponse.decode(raw)

    def close(self) -> None:
        """Close every channel; a later ``fence`` answers "no". Safe to call twice."""
        with self._lock:
            self._closed = True
            channels, self._channels = list(self._channels.values()), {}
        for channel in channels:
            channel.close()
