"""An asyncio client of etcd's v3 gRPC API, just what the replicated lighthouse uses.

Why our own, over grpcio, rather than a library. The lighthouse already runs on grpc.aio:
the etcd calls then share its event loop, its deadlines and its error types, and a call to
etcd is one more ``await`` among the server's, not a thread. The asyncio etcd clients on PyPI
(``aetcd`` and its forks) bring protobuf's runtime and generated stubs with their own
version pins, for the same six RPCs; etcd's JSON gateway needs an HTTP client the standard
library does not have for asyncio, base64 for every key, and doubles the hops. The wire
format of those six RPCs is small and fixed (wire.py), so the cost of owning it is ~250
lines, tested against a real etcd cluster (tests/lighthouse/test_replicated_lighthouse.py).

Every call takes the lighthouse's deadline. Endpoints are tried in turn: an endpoint that
is down, or a member cut off from etcd's own quorum (it answers "no leader" / times out), is
skipped for the next one, so a single etcd member's death costs one failed attempt.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence

import grpc

from lighthouse.errors import EtcdUnavailable
from lighthouse.replicated.etcd import wire

logger = logging.getLogger(__name__)

_RANGE = "/etcdserverpb.KV/Range"
_PUT = "/etcdserverpb.KV/Put"
_DELETE = "/etcdserverpb.KV/DeleteRange"
_TXN = "/etcdserverpb.KV/Txn"
_GRANT = "/etcdserverpb.Lease/LeaseGrant"
_REVOKE = "/etcdserverpb.Lease/LeaseRevoke"
_KEEPALIVE = "/etcdserverpb.Lease/LeaseKeepAlive"

ATTEMPT_TIMEOUT_S = 0.5
"""One try against one endpoint. A healthy etcd on a LAN answers in milliseconds; a member
that lost its quorum holds a request until its own timeout, so this bounds what a sick
member costs before the next is tried."""
_RETRYABLE = {
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.UNKNOWN,
    grpc.StatusCode.INTERNAL,
    grpc.StatusCode.CANCELLED,
}


_Attempt = Callable[[grpc.aio.Channel, float], Awaitable[bytes]]
"""One try of a call against one endpoint's channel, with that try's timeout."""


class EtcdClient:
    """Build with endpoints (``host:port`` of etcd's client URLs); ``start()`` opens channels."""

    def __init__(self, endpoints: Sequence[str]) -> None:
        if not endpoints:
            raise ValueError("no etcd endpoints given; pass host:port of at least one etcd member")
        self.endpoints = tuple(endpoints)
        self._channels: list[grpc.aio.Channel] = []
        self._preferred = 0
        """The endpoint that answered last: tried first next time."""

    async def start(self) -> None:
        options = [
            ("grpc.initial_reconnect_backoff_ms", 50),
            ("grpc.max_reconnect_backoff_ms", 500),
            ("grpc.enable_retries", 0),
        ]
        self._channels = [grpc.aio.insecure_channel(e, options=options) for e in self.endpoints]

    async def close(self) -> None:
        for channel in self._channels:
            await channel.close()
        self._channels = []

    async def __aenter__(self) -> EtcdClient:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- key-value ----------------------------------------------------------------------------

    async def get(self, key: bytes, timeout_s: float) -> wire.KeyValue | None:
        """The key's current value and revisions (a linearizable read), or None if absent."""
        reply = wire.range_response(await self._unary(_RANGE, wire.range_request(key), timeout_s))
        return reply.kvs[0] if reply.kvs else None

    async def put(self, key: bytes, value: bytes, timeout_s: float, *, lease: int = 0) -> int:
        """Write unconditionally; returns the store's revision after the write."""
        return wire.revision_only(await self._unary(_PUT, wire.put_request(key, value, lease), timeout_s))

    async def delete(self, key: bytes, timeout_s: float) -> int:
        return wire.revision_only(await self._unary(_DELETE, wire.delete_range_request(key), timeout_s))

    async def txn(
        self, compare: Sequence[wire.Compare], success: Sequence[bytes], failure: Sequence[bytes], timeout_s: float
    ) -> wire.TxnResponse:
        """``success`` ops if every guard holds, else ``failure`` ops, atomically."""
        return wire.txn_response(await self._unary(_TXN, wire.txn_request(compare, success, failure), timeout_s))

    # -- leases -------------------------------------------------------------------------------

    async def grant(self, ttl_s: int, timeout_s: float) -> wire.LeaseReply:
        reply = wire.lease_reply(await self._unary(_GRANT, wire.lease_grant_request(ttl_s), timeout_s))
        if reply.error or reply.ttl_s <= 0:
            raise EtcdUnavailable(f"etcd refused a lease of {ttl_s}s: {reply.error or 'no TTL granted'}")
        return reply

    async def revoke(self, lease_id: int, timeout_s: float) -> None:
        """Revoke a lease (its keys are deleted); a lease already gone is not an error."""
        try:
            await self._unary(_REVOKE, wire.lease_id_request(lease_id), timeout_s)
        except EtcdNotFound:
            pass

    async def keepalive(self, lease_id: int, timeout_s: float) -> int:
        """Renew the lease once; returns its new TTL, 0 when etcd no longer has it."""

        async def once(channel: grpc.aio.Channel, attempt_s: float) -> bytes:
            call = channel.stream_stream(_KEEPALIVE)(timeout=attempt_s)
            await call.write(wire.lease_id_request(lease_id))
            await call.done_writing()
            raw = await call.read()
            call.cancel()
            if raw is grpc.aio.EOF:
                raise EtcdUnavailable("etcd closed the keepalive stream without an answer")
            return bytes(raw)

        return wire.lease_reply(await self._attempts(once, timeout_s, "LeaseKeepAlive")).ttl_s

    # -- plumbing -----------------------------------------------------------------------------

    async def _unary(self, method: str, body: bytes, timeout_s: float) -> bytes:
        async def once(channel: grpc.aio.Channel, attempt_s: float) -> bytes:
            return bytes(await channel.unary_unary(method)(body, timeout=attempt_s))

        return await self._attempts(once, timeout_s, method.rsplit("/", 1)[1])

    async def _attempts(self, once: _Attempt, timeout_s: float, what: str) -> bytes:
        """``once`` against each endpoint in turn, from the one that answered last, until one
        answers or ``timeout_s`` passes; a full round of failures pauses 50 ms."""
        assert self._channels, "start() the etcd client first"
        deadline = time.monotonic() + timeout_s
        errors: list[str] = []
        n = len(self._channels)
        tried = 0
        while (remaining := deadline - time.monotonic()) > 0:
            index = (self._preferred + tried) % n
            try:
                result = await once(self._channels[index], min(ATTEMPT_TIMEOUT_S, remaining))
                self._preferred = index
                return result
            except grpc.aio.AioRpcError as e:
                if e.code() == grpc.StatusCode.NOT_FOUND:
                    raise EtcdNotFound(e.details() or "not found") from None
                if e.code() not in _RETRYABLE:
                    raise EtcdUnavailable(
                        f"etcd {self.endpoints[index]} refused {what}: {e.code().name} {e.details()}"
                    ) from None
                errors.append(f"{self.endpoints[index]}: {e.code().name} {e.details()}")
            except EtcdUnavailable as e:
                errors.append(f"{self.endpoints[index]}: {e}")
            tried += 1
            if tried % n == 0:
                await asyncio.sleep(min(0.05, max(deadline - time.monotonic(), 0.0)))
        raise EtcdUnavailable(
            f"etcd did not answer {what} within {timeout_s:g}s from {list(self.endpoints)}: "
            + ("; ".join(errors[-n:]) or "no attempt finished")
        )


class EtcdNotFound(EtcdUnavailable):
    """etcd answered NOT_FOUND (a lease that expired or was revoked)."""
