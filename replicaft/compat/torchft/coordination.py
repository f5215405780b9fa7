"""torchft's low-level coordination API, backed by replicaft's lighthouse and group server.

``LighthouseServer`` runs replicaft's lighthouse (lighthouse/server/grpc_server.py) on a loop thread of
this process, as torchft runs its Rust one in-process. ``LighthouseClient.quorum`` joins a
quorum through a lighthouse session per replica id (replicaft's sessions heartbeat on their
own; ``heartbeat`` opens one if needed). ``ManagerServer`` is a group's manager server
(replicaft/group/server.py over a coordinator) and ``ManagerClient`` a rank's client of it: ``_quorum`` returns
torchft's ``QuorumResult`` fields computed by replicaft's step plan (lighthouse/rules/plan.py),
``should_commit`` is the group's vote.

Deliberate differences: a server asked to bind a wildcard address (``[::]``, ``0.0.0.0``)
binds loopback, replicaft's default (pass a concrete address to serve other hosts); a
store address travels in the member's ``data`` (replicaft's quorum has no such column);
``checkpoint_metadata`` is not used (replicaft's heal finds donors through the plan). A manager
server is always authenticated (torchft's is not): with the job's token (``REPLICAFT_TOKEN``)
where there is one (set but empty is refused, as by the manager), which a client in another
process then needs too, else with a secret made once per process, which a client in the same
process uses.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import os
import secrets
import threading
import uuid
from dataclasses import dataclass, field
from typing import Any

from lighthouse import errors as lighthouse_errors
from lighthouse.client.blocking_client import LighthouseClient as _BlockingLighthouseClient
from lighthouse.config.options import LighthouseOptions, MembershipOptions
from lighthouse.rules.plan import plan_step
from lighthouse.server.grpc_server import LighthouseServer as _LighthouseServer
from lighthouse.wire.progress import Progress
from lighthouse.wire.protocol import Quorum as _Quorum
from replicaft.config.options import ManagerOptions
from replicaft.errors import OptionsError
from replicaft.group.client import RPC_GRACE_S, RemoteGroupChannel
from replicaft.group.coordinator import GroupCoordinator
from replicaft.group.server import GroupServer
from replicaft.process.threads import LoopThread

__all__ = ["LighthouseClient", "LighthouseServer", "ManagerClient", "ManagerServer", "Quorum", "QuorumMember"]

logger = logging.getLogger(__name__)
_WILDCARDS = {"", "::", "0.0.0.0", "[::]"}
_PROCESS_SECRET = secrets.token_urlsafe(24)


def _server_token() -> str:
    """The token manager servers and clients of this process use (module docstring). An empty
    ``REPLICAFT_TOKEN`` is refused with the manager's own error (ManagerOptions.from_env): it
    used to fall back to the per-process secret, so a job that meant to share a token ran
    its manager servers with one no other process had."""
    try:
        token = LighthouseOptions.token_from_env(os.environ)
    except lighthouse_errors.OptionsError as e:
        raise OptionsError(str(e)) from None
    return token or _PROCESS_SECRET


def _host_port(bind: str) -> tuple[str, int]:
    host, _, port = bind.rpartition(":")
    if not port.isdigit():
        raise OptionsError(f"bind={bind!r}: expected HOST:PORT, e.g. '[::]:29510' or '127.0.0.1:0'")
    host = host.strip("[]")
    if host in _WILDCARDS or host == "::":
        logger.info("bind=%s: replicaft binds loopback unless given a concrete address", bind)
        host = "127.0.0.1"
    return host, int(port)


def _strip_scheme(addr: str) -> str:
    return addr.removeprefix("http://").removeprefix("https://").rstrip("/")


@dataclass
class QuorumMember:
    replica_id: str
    address: str
    store_address: str
    step: int
    world_size: int
    shrink_only: bool
    data: dict[Any, object] | None = None


@dataclass
class Timestamp:
    seconds: int
    nanos: int


@dataclass
class Quorum:
    quorum_id: int
    participants: list[QuorumMember]
    created: Timestamp


@dataclass
class QuorumResult:
    quorum_id: int
    replica_rank: int
    replica_world_size: int
    recover_src_manager_address: str
    recover_src_replica_rank: int | None
    recover_dst_replica_ranks: list[int]
    store_address: str
    max_step: int
    max_replica_rank: int | None
    max_world_size: int
    heal: bool
    commit_failures: int
    replica_ids: list[str] = field(default_factory=list)


class LighthouseServer:
    """replicaft's lighthouse on a loop thread of this process; ``address()`` is ``http://host:port``."""

    def __init__(
        self,
        bind: str,
        min_replicas: int,
        join_timeout_ms: int | None = None,
        quorum_tick_ms: int | None = None,
        heartbeat_timeout_ms: int | None = None,
    ) -> None:
        host, port = _host_port(bind)
        d = MembershipOptions()
        membership = MembershipOptions(
            min_replicas=min_replicas,
            join_timeout_s=d.join_timeout_s if join_timeout_ms is None else join_timeout_ms / 1000,
            heartbeat_timeout_s=d.heartbeat_timeout_s if heartbeat_timeout_ms is None else heartbeat_timeout_ms / 1000,
            progress_timeout_s=d.progress_timeout_s,
        )
        options = LighthouseOptions(
            host=host,
            port=port,
            membership=membership,
            tick_s=0.02 if quorum_tick_ms is None else quorum_tick_ms / 1000,
        )
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="replicaft-compat-lighthouse", daemon=True)
        self._thread.start()
        self._server = _LighthouseServer(options)
        addresses = asyncio.run_coroutine_threadsafe(self._server.start(), self._loop).result(30.0)
        self._address = f"http://{addresses.grpc}"

    def address(self) -> str:
        return self._address

    def shutdown(self) -> None:
        if not self._loop.is_running():
            return
        asyncio.run_coroutine_threadsafe(self._server.stop(), self._loop).result(30.0)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10.0)


class LighthouseClient:
    """Joins quorums for any replica id, through one replicaft lighthouse session per id."""

    def __init__(self, addr: str, connect_timeout: datetime.timedelta) -> None:
        self.addr = _strip_scheme(addr)
        self.connect_timeout = connect_timeout
        self._sessions: dict[str, _BlockingLighthouseClient] = {}
        self._lock = threading.Lock()

    def _session(self, replica_id: str, world_size: int = 1, address: str = "") -> _BlockingLighthouseClient:
        with self._lock:
            if replica_id not in self._sessions:
                client = _BlockingLighthouseClient(self.addr, replica_id, world_size=world_size, member_address=address)
                self._sessions[replica_id] = client.start()
            return self._sessions[replica_id]

    def quorum(
        self,
        replica_id: str,
        timeout: datetime.timedelta,
        address: str | None = None,
        store_address: str | None = None,
        step: int | None = None,
        world_size: int | None = None,
        shrink_only: bool | None = None,
        data: dict[Any, object] | None = None,
    ) -> Quorum:
        session = self._session(replica_id, world_size or 1, address or "")
        payload = {str(k): v for k, v in (data or {}).items()}
        payload["store_address"] = store_address or ""
        q = session.quorum(step or 0, timeout.total_seconds(), shrink_only=bool(shrink_only), data=payload)
        return to_torchft_quorum(q)

    def heartbeat(self, replica_id: str, timeout: datetime.timedelta = datetime.timedelta(seconds=5)) -> None:
        self._session(replica_id).wait_registered(timeout.total_seconds())

    def close(self) -> None:
        with self._lock:
            for s in self._sessions.values():
                s.close()
            self._sessions.clear()


def to_torchft_quorum(q: _Quorum) -> Quorum:
    members = []
    for m in q.participants:
        data = dict(m.data)
        store = str(data.pop("store_address", ""))
        members.append(QuorumMember(m.replica_id, m.address, store, m.step, m.world_size, False, data))
    seconds = int(q.created_unix_s)
    return Quorum(q.quorum_id, members, Timestamp(seconds, int((q.created_unix_s - seconds) * 1e9)))


class ManagerServer:
    """A replica group's manager server (replicaft's group server), speaking to the lighthouse."""

    def __init__(
        self,
        replica_id: str,
        lighthouse_addr: str,
        hostname: str = "",
        bind: str = "127.0.0.1:0",
        store_addr: str = "",
        world_size: int = 1,
        heartbeat_interval: datetime.timedelta = datetime.timedelta(milliseconds=100),
        connect_timeout: datetime.timedelta = datetime.timedelta(seconds=10),
        quorum_retries: int = 0,
    ) -> None:
        host, _ = _host_port(bind)
        options = ManagerOptions(
            lighthouse=_strip_scheme(lighthouse_addr),
            replica_id=replica_id,
            host=host,
            group_world_size=world_size,
            heartbeat_interval_s=heartbeat_interval.total_seconds(),
            connect_timeout_s=connect_timeout.total_seconds(),
            max_quorum_failures=quorum_retries + 1,
        )
        self.replica_id = replica_id
        self.store_addr = store_addr
        self._loop = LoopThread("torchft-manager-server")
        self._loop.start()
        self._coordinator = GroupCoordinator(options, Progress(), lambda notice: None)
        self._loop.call(self._coordinator.start(), options.connect_timeout_s)
        self._server = GroupServer(self._coordinator, self._loop, host=host, token=_server_token())
        self._address = self._server.start(options.connect_timeout_s)

    def address(self) -> str:
        return self._address

    def shutdown(self) -> None:
        self._server.stop()
        try:
            self._loop.call(self._coordinator.stop(), 5.0)
        finally:
            self._loop.stop()


class ManagerClient:
    """A rank's client of its group's manager server."""

    def __init__(self, addr: str, connect_timeout: datetime.timedelta, group_rank: int = 0) -> None:
        self._address = _strip_scheme(addr)
        self._group_rank = group_rank
        self._client = RemoteGroupChannel(self._address, group_rank, _server_token())
        self._tag = uuid.uuid4().hex
        self._quorum_id = 0

    def _quorum(
        self,
        group_rank: int,
        step: int,
        checkpoint_metadata: str,
        shrink_only: bool,
        timeout: datetime.timedelta,
        commit_failures: int,
        init_sync: bool = True,
    ) -> QuorumResult:
        if group_rank != self._group_rank:
            self._client.close()
            self._group_rank = group_rank
            self._client = RemoteGroupChannel(self._address, group_rank, _server_token())
        q = (
            self._client.ask_quorum(
                step, timeout.total_seconds(), commit_failures=commit_failures, rank_data={"tag": self._tag}
            )
            .result(timeout.total_seconds() + RPC_GRACE_S)
            .quorum
        )
        me = next(
            m.replica_id
            for m in q.participants
            if any(isinstance(r, dict) and r.get("tag") == self._tag for r in m.data.get("ranks", []))
        )
        plan = plan_step(q, me)
        self._quorum_id = plan.quorum_id
        ranks = {m.replica_id: i for i, m in enumerate(plan.participants)}
        source = plan.donors[plan.healers.index(me) % len(plan.donors)] if plan.healing else None
        return QuorumResult(
            quorum_id=plan.quorum_id,
            replica_rank=plan.replica_rank,
            replica_world_size=plan.num_replicas,
            recover_src_manager_address=(plan.member(source).address if source else ""),  # type: ignore[union-attr]
            recover_src_replica_rank=ranks[source] if source else None,
            recover_dst_replica_ranks=[
                ranks[h] for i, h in enumerate(plan.healers) if plan.donors[i % len(plan.donors)] == me
            ],
            store_address="",
            max_step=plan.max_step,
            max_replica_rank=plan.donors.index(me) if me in plan.donors else None,
            max_world_size=len(plan.donors),
            heal=plan.healing,
            commit_failures=commit_failures,
            replica_ids=[m.replica_id for m in plan.participants],
        )

    def _checkpoint_metadata(self, rank: int, timeout: datetime.timedelta) -> str:
        return "replicaft"

    def should_commit(self, group_rank: int, step: int, should_commit: bool, timeout: datetime.timedelta) -> bool:
        reply = self._client.vote(
            step, self._quorum_id, should_commit, "" if should_commit else "voted no", timeout.total_seconds()
        )
        return reply.commit
