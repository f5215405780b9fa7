"""The servers and connections one rank runs for its manager, started and stopped as one.

Every rank hosts:

* a rendezvous **store** (``TCPStore``): when this rank's group owns a column's rendezvous
  (lighthouse/rules/plan.py, ``column_store_owner``), the column's process group meets on it;
* a **state server** (transfer/server.py): healers pull this rank's snapshot from it.

Group rank 0 also hosts the group's **coordinator** on an event loop thread of its own (the
group's one lighthouse session and its rounds, group/coordinator.py), and, when the group has
more than one rank, the **group server** through which the other ranks reach it. Rank 0 talks
to the coordinator in-process (in a group of one rank it asks the lighthouse's fence itself,
from the training thread: group/fence.py); ranks > 0 find the group server through the group's own
rendezvous store (torchrun's) and hold a notice stream to it.

Their addresses go into every quorum request (``rank_addresses``), which is how peers find
them. Built in ``__init__``, connected in ``start()``, closed in ``stop()``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch.distributed as dist

from lighthouse.wire.progress import Progress
from lighthouse.wire.protocol import Notice
from replicaft.config.options import ManagerOptions
from replicaft.group.client import (
    GroupChannel,
    LocalGroupChannel,
    RemoteGroupChannel,
    find_group_server,
    group_secret,
    group_store,
    publish_group_server,
)
from replicaft.group.coordinator import GroupCoordinator
from replicaft.group.fence import BlockingFence
from replicaft.group.server import GroupServer
from replicaft.process.faults import slow_serve_hook
from replicaft.process.threads import LoopThread
from replicaft.transfer.server import StateServer

logger = logging.getLogger(__name__)


class RankServices:
    """What one rank runs for its manager; see the module docstring."""

    def __init__(
        self,
        options: ManagerOptions,
        progress: Progress,
        on_notice: Callable[[Notice], None],
        faults: frozenset[tuple[str, int]],
        current_step: Callable[[], int],
    ) -> None:
        self.options = options
        self._progress = progress
        self._on_notice = on_notice
        self.store: dist.TCPStore | None = None
        self.tls = options.tls()
        self.state_server = StateServer(
            options.host,
            options.token,
            fault_hook=slow_serve_hook(faults, current_step),
            tls=self.tls.server_context() if self.tls else None,
        )
        self.channel: GroupChannel | None = None
        self.rank_addresses: dict[str, str] = {}
        self._loop: LoopThread | None = None
        self._coordinator: GroupCoordinator | None = None
        self._group_server: GroupServer | None = None

    def start(self) -> str:
        """Open everything; returns the group manager's address (rank 0's loop for W = 1)."""
        o = self.options
        self.store = dist.TCPStore(o.host, 0, is_master=True, wait_for_workers=False)
        self.rank_addresses = {"store": f"{o.host}:{self.store.port}", "state": self.state_server.start()}
        if o.group_rank == 0:
            return self._start_coordinator()
        assert o.group_store is not None
        address, secret = find_group_server(group_store(o.group_store, o.connect_timeout_s))
        channel = RemoteGroupChannel(address, o.group_rank, secret, self.tls)
        channel.watch(self._on_notice)
        self.channel = channel
        return address

    def _start_coordinator(self) -> str:
        o = self.options
        self._loop = LoopThread("replicaft-group")
        self._loop.start()
        self._coordinator = GroupCoordinator(o, self._progress, self._on_notice)
        self._loop.call(self._coordinator.start(), o.connect_timeout_s)
        if o.group_world_size == 1:
            lighthouse = self._coordinator.lighthouse
            assert lighthouse is not None
            fence = BlockingFence(
                o.replica_id,
                lambda: lighthouse.targets.current,
                lighthouse.commit_lease.covers,
                token=o.token,
                tls=self.tls,
                wait_for_ready=not lighthouse.targets.replicated and self.tls is None,
            )
            self.channel = LocalGroupChannel(self._coordinator, self._loop, fence)
            return "in-process"
        self.channel = LocalGroupChannel(self._coordinator, self._loop)
        assert o.group_store is not None
        secret = group_secret(o.token)
        self._group_server = GroupServer(self._coordinator, self._loop, host=o.host, token=secret, tls=self.tls)
        address = self._group_server.start(o.connect_timeout_s)
        publish_group_server(group_store(o.group_store, o.connect_timeout_s), address, secret)
        return address

    def stop(self) -> None:
        """Close everything this rank opened; safe to call twice."""
        if self.channel is not None:
            self.channel.close()
            self.channel = None
        if self._group_server is not None:
            self._group_server.stop()
            self._group_server = None
        if self._coordinator is not None and self._loop is not None:
            try:
                self._loop.call(self._coordinator.stop(), 5.0)
            except Exception:
                logger.exception("the group's lighthouse session did not close cleanly")
            self._coordinator = None
        if self._loop is not None:
            self._loop.stop()
            self._loop = None
        self.state_server.stop()
