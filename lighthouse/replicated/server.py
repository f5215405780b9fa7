"""A lighthouse of a replicated set: leads while it holds an etcd lease, follows otherwise.

Several ``replicaft-lighthouse --etcd ...`` processes serve one job. Each campaigns for one
key, ``<prefix>/leader``, created in a transaction only while absent and attached to its own
lease; the one that creates it leads, the others answer every member "not the leader
(leader: X)" and watch. What a new leader needs to form the next quorum at once lives in
``<prefix>/state``: the job's incarnation, the next quorum id, and the members of the last
quorum. The leader writes it before any member hears of a quorum with a new id, in a
transaction that holds only while the leader key is still the one it created and the state
is the version it last wrote, so a deposed leader's write fails and it never publishes
(a quorum that keeps its id, the fast path, needs no write: its members are recorded).

Three ways leadership moves, and what each costs the job:

* The leader's process dies (SIGKILL, crash): members' sessions break at once and they try
  the other lighthouses. A follower holds an idle TCP connection to the leader's port; the
  kernel closes it when the process dies, and a new connection is then *refused* (a host
  that answers with a reset has no listener on that port), which proves the leader is gone,
  so the follower revokes its lease instead of waiting for the lease to run out. A timeout
  proves nothing (a partition looks the same) and revokes nothing.
* The leader is cut off from etcd (partition): its keepalives fail, and it stops serving on
  its own clock before etcd could let another lead (leadership.py's LeaseClock); members'
  sessions end with "not the leader" and they move on. Costs about one lease.
* The leader freezes (SIGSTOP, a stalled host): its members' sessions stay open, and nothing
  it could say reaches them. So the leader tells its members its lease with each renewal
  (a ``lease`` notice), and a member that hears no newer lease before the last one runs out
  leaves for the other lighthouses (lighthouse/client/leader_watch.py): a frozen leader held
  its members until their quorum requests timed out (60 s with 30 s timeouts, issue 37), and
  now costs them about one lease.
* etcd loses its quorum: no leader can renew, every lighthouse stops serving and says why;
  members keep retrying, training waits. When etcd is back, one campaigns successfully.

The new leader forms its first quorum as soon as every member of the last quorum has
registered again (membership.restore), not after a join timeout: they report the steps they
committed, so nothing is committed twice in two histories.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass

import msgpack

from lighthouse.config.options import LighthouseOptions
from lighthouse.errors import EtcdUnavailable, OptionsError
from lighthouse.replicated.etcd import wire
from lighthouse.replicated.etcd.client import EtcdClient
from lighthouse.replicated.leadership import LeaseClock
from lighthouse.server.grpc_server import LighthouseServer, ServingAddresses
from lighthouse.wire.protocol import Quorum

logger = logging.getLogger(__name__)

POLL_S = 0.05
"""How often a follower reads the leader key (a linearizable read: ~1 ms on a LAN)."""
RETRY_S = 0.2
"""Pause before campaigning again after etcd failed to answer."""
ETCD_TIMEOUT_S = 1.0
"""Deadline of one etcd call (the client tries every endpoint within it)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ReplicationOptions:
    etcd_endpoints: tuple[str, ...]
    """``host:port`` of etcd's client URLs, all of them (any one may be down)."""
    advertise: str
    """The address members reach this lighthouse at (the leader key names it to followers)."""
    prefix: str = "/replicaft/default"
    """Keys of this job in etcd; one prefix per job sharing an etcd."""
    lease_ttl_s: int = 2
    """The leader's lease. A partitioned leader costs the job about this long; etcd grants
    no less than 1.5 of its election timeouts (1 s by default, so 2 s here)."""

    def __post_init__(self) -> None:
        if not self.etcd_endpoints:
            raise OptionsError("etcd_endpoints is empty; pass --etcd host:port[,host:port...]")
        if not self.advertise or ":" not in self.advertise or self.advertise.startswith(("0.0.0.0:", "[::]:")):
            raise OptionsError(
                f"advertise={self.advertise!r}; give the host:port members reach this lighthouse at "
                "(--advertise), not a wildcard address"
            )
        if (
            isinstance(self.lease_ttl_s, bool)
            or not isinstance(self.lease_ttl_s, int)
            or not 1 <= self.lease_ttl_s <= 60
        ):
            raise OptionsError(f"lease_ttl_s={self.lease_ttl_s!r}; use whole seconds in [1, 60]")
        if not self.prefix.startswith("/"):
            raise OptionsError(f"prefix={self.prefix!r}; an etcd key prefix starts with / (e.g. /replicaft/job-7)")


class ReplicatedLighthouse:
    """Build with options; ``start()`` serves (as a follower until it wins the lead)."""

    def __init__(self, options: LighthouseOptions, replication: ReplicationOptions) -> None:
        self.replication = replication
        self.server = LighthouseServer(options, leadership=self)
        self.etcd = EtcdClient(replication.etcd_endpoints)
        self._leader_key = f"{replication.prefix}/leader".encode()
        self._state_key = f"{replication.prefix}/state".encode()
        self._clock = LeaseClock(float(replication.lease_ttl_s))
        self._leading = False
        self._term = 0
        """The leader key's create revision while this lighthouse leads: its term."""
        self._state_revision = 0
        self._hint = "no leader known yet"
        self._task: asyncio.Task[None] | None = None

    # -- Leadership ---------------------------------------------------------------------------

    def serving(self) -> bool:
        return self._leading and self._clock.valid(time.monotonic())

    def leader_hint(self) -> str:
        return self._hint

    def lease_remaining_s(self) -> float:
        return self._clock.remaining_s(time.monotonic()) if self.serving() else 0.0

    async def publish(self, quorum: Quorum, next_quorum_id: int) -> bool:
        state = {
            "incarnation": quorum.incarnation,
            "next_quorum_id": next_quorum_id,
            "quorum_id": quorum.quorum_id,
            "members": list(quorum.replica_ids),
            "steps": list(quorum.steps),
            "leader": self.replication.advertise,
        }
        return await self._write_state(state)

    # -- lifecycle ----------------------------------------------------------------------------

    async def start(self) -> ServingAddresses:
        await self.etcd.start()
        addresses = await self.server.start()
        self._task = asyncio.create_task(self._run(), name="lighthouse-leadership")
        return addresses

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._leading = False
        await self.server.stop()
        await self.etcd.close()

    async def _run(self) -> None:
        etcd_down_since: float | None = None
        while True:
            try:
                await self._one_lease()
                etcd_down_since = None
            except EtcdUnavailable as e:
                self._lose(f"etcd unavailable: {e}")
                if etcd_down_since is None:
                    etcd_down_since = time.monotonic()
                    logger.error("cannot reach etcd's quorum; not forming quorums until it is back: %s", e)
                self._hint = f"no leader: etcd unavailable for {time.monotonic() - etcd_down_since:.1f}s"
                await asyncio.sleep(RETRY_S)

    async def _one_lease(self) -> None:
        """Hold one lease: campaign with it, lead or follow, until it lapses."""
        sent = time.monotonic()
        lease = await self.etcd.grant(self.replication.lease_ttl_s, ETCD_TIMEOUT_S)
        self._clock = LeaseClock(float(self.replication.lease_ttl_s)).renewed(sent, lease.ttl_s)
        keeper = asyncio.create_task(self._keep_alive(lease.lease_id), name="lighthouse-lease")
        try:
            while not keeper.done():
                me = msgpack.packb({"address": self.replication.advertise, "lease": lease.lease_id})
                won = await self.etcd.txn(
                    [wire.Compare(self._leader_key, wire.CREATE, wire.EQUAL, 0)],
                    [wire.request_op_put(wire.put_request(self._leader_key, me, lease.lease_id))],
                    [wire.request_op_range(wire.range_request(self._leader_key))],
                    ETCD_TIMEOUT_S,
                )
                if won.succeeded:
                    await self._lead(won.revision, keeper)
                    return
                current = won.ranges[0].kvs[0] if won.ranges and won.ranges[0].kvs else None
                if current is not None:
                    await self._follow(current, keeper)
            keeper.result()  # raises the keeper's EtcdUnavailable
        finally:
            keeper.cancel()
            if keeper.done() and not keeper.cancelled():
                keeper.exception()  # retrieved: it ended the lease, which _run reports
            self._lose("its etcd lease ended")
            with contextlib.suppress(EtcdUnavailable):
                await self.etcd.revoke(lease.lease_id, ETCD_TIMEOUT_S)

    async def _keep_alive(self, lease_id: int) -> None:
        """Renew every quarter lease; returns when etcd no longer has the lease, raises
        EtcdUnavailable when it could not be renewed before the local clock ran out."""
        interval = self.replication.lease_ttl_s / 4
        while True:
            await asyncio.sleep(interval)
            sent = time.monotonic()
            try:
                ttl = await self.etcd.keepalive(lease_id, max(self._clock.remaining_s(sent), 0.05))
            except EtcdUnavailable:
                if not self._clock.valid(time.monotonic()):
                    raise
                continue
            self._clock = self._clock.renewed(sent, ttl)
            if ttl <= 0:
                return
            if self.serving():
                self.server.announce_lease(self.lease_remaining_s())

    async def _lead(self, term: int, keeper: asyncio.Task[None]) -> None:
        stored = await self.etcd.get(self._state_key, ETCD_TIMEOUT_S)
        state = msgpack.unpackb(stored.value) if stored is not None else {}
        self._term, self._state_revision = term, stored.mod_revision if stored is not None else 0
        incarnation = int(state.get("incarnation") or time.time_ns() // 1000)
        next_id = int(state.get("next_quorum_id", 1))
        # No quorum recorded (a new job, or etcd's data lost): nothing to wait for by name;
        # the membership then waits as a restarted single lighthouse does if members report
        # quorums this etcd never saw.
        members = tuple(state["members"]) if "members" in state else None
        if not await self._write_state(
            {**state, "incarnation": incarnation, "next_quorum_id": next_id, "leader": self.replication.advertise}
        ):
            return
        self._leading = True
        self._hint = f"leader: {self.replication.advertise}"
        self.server.take_leadership(incarnation, members, int(state.get("quorum_id", -1)), next_id)
        logger.warning("lighthouse %s leads %s (term %d)", self.replication.advertise, self.replication.prefix, term)
        while self.serving() and not keeper.done():
            await asyncio.sleep(POLL_S)
        self._lose("its lease lapsed" if not keeper.done() else "its lease could not be renewed in etcd")

    async def _follow(self, leader: wire.KeyValue, keeper: asyncio.Task[None]) -> None:
        info = msgpack.unpackb(leader.value)
        address, lease_id = str(info.get("address", "?")), int(info.get("lease", 0))
        self._hint = f"leader: {address}"
        probe = asyncio.create_task(self._probe(address, lease_id), name="lighthouse-probe")
        try:
            while not keeper.done():
                current = await self.etcd.get(self._leader_key, ETCD_TIMEOUT_S)
                if current is None or current.create_revision != leader.create_revision:
                    return
                await asyncio.sleep(POLL_S)
        finally:
            probe.cancel()

    async def _probe(self, address: str, lease_id: int) -> None:
        """Hold a TCP connection to the leader; when its process is gone (the connection
        closes and a new one is refused), revoke its lease so that a follower leads now."""
        host, _, port = address.rpartition(":")
        while True:
            try:
                reader, writer = await asyncio.wait_for(asyncio.open_connection(host.strip("[]"), int(port)), 1.0)
            except ConnectionRefusedError:
                logger.warning("leader %s is gone (connection refused): revoking its lease", address)
                await self.etcd.revoke(lease_id, ETCD_TIMEOUT_S)
                return
            except (OSError, asyncio.TimeoutError):
                await asyncio.sleep(POLL_S)  # unreachable proves nothing: wait for its lease
                continue
            try:
                while await reader.read(4096):  # nothing is sent; EOF when the peer closes
                    pass
            except OSError:
                pass
            finally:
                writer.close()

    async def _write_state(self, state: dict[str, object]) -> bool:
        result = await self.etcd.txn(
            [
                wire.Compare(self._leader_key, wire.CREATE, wire.EQUAL, self._term),
                wire.Compare(self._state_key, wire.MOD, wire.EQUAL, self._state_revision),
            ],
            [wire.request_op_put(wire.put_request(self._state_key, msgpack.packb(state)))],
            [],
            ETCD_TIMEOUT_S,
        )
        if not result.succeeded:
            self._lose("etcd refused its write: another lighthouse leads")
            return False
        self._state_revision = result.revision
        return True

    def _lose(self, reason: str) -> None:
        if self._leading:
            logger.warning("lighthouse %s stops leading: %s", self.replication.advertise, reason)
        self._leading = False
        self.server.step_down(reason)
