"""The fault-tolerant column process group: rebuilt per quorum, abandoned (never aborted) when hung.

Rank ``r`` of every participating group forms one "column" process group. It is rebuilt
whenever the quorum id changes, under a store prefix that is unique forever
(``StepPlan.store_prefix``), on a rendezvous store hosted by an up-to-date participant.
The column's "ok" flag is not one of the group's collectives: it goes over a mesh of sockets
built beside the group, on the same store (replicaft/column/flag.py says why).

Why abandon instead of abort. Measured on torch 2.13 (CPU): ``ProcessGroupGloo.abort()``
returns at once but does not unblock an in-flight all-reduce; a crashed peer gives an
immediate "Connection reset by peer", a hung one (SIGSTOP, partition) gives nothing until the
Gloo timeout; and an abandoned Gloo operation completes later if the hung peer resumes, writing
into its buffer. So a wait here never blocks past its deadline or an abort signal: it gives
the operation up, the group is marked broken (its quorum will be replaced), and the caller
must treat the buffer as owned by the abandoned operation (the DDP wrapper reallocates its
buckets). Broken groups and their pending operations are parked until the operations end
(the Gloo timeout bounds that), because dropping the last reference to a Gloo process group
with a pending operation joins its worker threads, which would block the caller.

The alternative, running collectives in a killable subprocess (torchft's "Baby" groups),
costs a shared-memory copy of every bucket each way and a new interpreter per
reconfiguration: measured here (torch 2.13 CPU, one thread), copying 100 MB of gradients into
shared memory and back takes 35 + 46 ms per step, against a 100 MB step of ~430 ms in the
step-overhead benchmark, i.e. ~19 % overhead before the subprocess's own start-up. Abandoning
costs nothing on the healthy path and parks at most the abandoned buffers, so it is our choice.
On CUDA with NCCL, ``abort()`` does unblock the communicator, so an abandon also aborts.
"""

from __future__ import annotations

import datetime
import functools
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
import torch.distributed as dist

from lighthouse.rules.plan import StepPlan
from lighthouse.tls.files import TlsFiles
from replicaft.column import rendezvous
from replicaft.column.flag import FlagError, FlagMesh
from replicaft.errors import GroupError

logger = logging.getLogger(__name__)

WAIT_POLL_S = 0.01
"""How often a wait checks its abort signal; bounds how late a member-lost notice is acted on."""
Reduce = Literal["sum", "max"]
"""The reductions a column all-reduce does: SUM for gradients and flags, MAX for the
deterministic mode's agreed scale (replicaft/deterministic/rules.py)."""
MAX_PARKED = 16
"""Broken groups kept alive until their abandoned operations end; beyond this the oldest is
released anyway (logged), so a pathological run cannot grow without bound."""


class CollectiveError(RuntimeError):
    """A collective failed, timed out or was abandoned; the step must not commit."""


@dataclass(frozen=True, slots=True)
class ColumnSpec:
    store_address: str
    prefix: str
    rank: int
    world_size: int
    quorum_id: int

    @classmethod
    def for_plan(cls, plan: StepPlan, group_rank: int) -> ColumnSpec:
        """Column ``group_rank`` of ``plan``'s quorum: rendezvous on the store its owner
        published, under a prefix unique forever; raises GroupError if it published none."""
        owner = plan.column_store_owner(group_rank).replica_id
        store = plan.rank_entry(owner, group_rank).get("store")
        if not isinstance(store, str):
            raise GroupError(f"quorum member {owner!r} published no store for group rank {group_rank}")
        return cls(store, f"{plan.store_prefix}/{group_rank}", plan.replica_rank, plan.num_replicas, plan.quorum_id)


class CollectiveHandle:
    """An in-flight all-reduce. ``wait`` returns when it completes, or raises CollectiveError.

    How it waits depends on the backend. A Gloo operation completes on Gloo's own thread, and
    ``Work.wait(slice)`` blocks in C++ with the GIL released: the training thread wakes straight
    from Gloo's signal. A Python done-callback there would have to take the GIL on Gloo's
    thread, and when the training thread let go of it to issue the next bucket it got it back
    only after the callback: 0.3-0.6 ms a step of a 10 MB model, toggled every 10 steps in the
    same processes of benchmarks/step_overhead.py. An NCCL ``Work.wait`` does not block the CPU (it orders the
    stream), so there the future's done-callback sets an event that the wait polls.
    """

    def __init__(self, group: FaultTolerantProcessGroup, work: dist.Work | None, op: str) -> None:
        self._group = group
        self._work = work
        self._op = op
        self._done: threading.Event | None = None
        if work is not None and group.backend == "nccl":
            done = self._done = threading.Event()
            work.get_future().add_done_callback(lambda _: done.set())

    def wait(self, deadline: float, abort: threading.Event, tick: Callable[[], None] | None = None) -> None:
        """Block until done, the monotonic ``deadline`` passes, or ``abort`` is set."""
        if self._work is None:
            return
        while True:
            try:
                if self._ended_within(self._work, WAIT_POLL_S):
                    return
            except Exception as e:
                failure = f"{self._op} failed: {e}"
                break
            if tick is not None:
                tick()
            if abort.is_set():
                self._group.abandon(f"{self._op} abandoned: a member of the quorum was lost")
                raise CollectiveError(f"{self._op} abandoned: a member of the quorum was lost")
            if time.monotonic() >= deadline:
                self._group.abandon(f"{self._op} timed out")
                raise CollectiveError(f"{self._op} did not complete within its deadline")
        # Raised outside the handler, unchained: a chained error's frames would keep this
        # handle, and with it the Gloo work, alive for as long as the error is kept.
        self._group.mark_broken(failure)
        raise CollectiveError(failure)

    def _ended_within(self, work: dist.Work, seconds: float) -> bool:
        """True once the operation succeeded, False if it is still running after ``seconds``;
        raises how it failed."""
        if self._done is not None:
            if not self._done.wait(seconds):
                return False
            work.get_future().value()
            return True
        try:
            work.wait(datetime.timedelta(seconds=seconds))
            return True
        except RuntimeError:
            # Gloo raises both for its own failure and when the slice passed.
            if not work.is_completed():
                return False
        work.wait()  # it ended just after the slice, or failed: returns at once, or raises why
        return True


class ManagedWork:
    """An all-reduce issued through the manager; ``wait()`` never raises for a peer's failure."""

    def __init__(self, tensor: torch.Tensor, finish: Callable[[], bool]) -> None:
        self._tensor = tensor
        self._finish = finish
        self._result: bool | None = None

    def wait(self) -> bool:
        """Block until the reduction is done; returns False if the step will not commit."""
        if self._result is None:
            self._result = self._finish()
        return self._result

    def tensor(self) -> torch.Tensor:
        return self._tensor


class FaultTolerantProcessGroup:
    """One rank's view of its column across the groups of the current quorum."""

    def __init__(
        self,
        backend: str,
        *,
        collective_timeout_s: float,
        connect_timeout_s: float,
        host: str = "127.0.0.1",
        token: str | None = None,
        tls: TlsFiles | None = None,
    ) -> None:
        """``token`` and ``tls``: the job's, which authenticate (and encrypt) the flag mesh (flag_handshake.py)."""
        if backend not in ("gloo", "nccl"):
            raise ValueError(f"backend={backend!r}; expected 'gloo' or 'nccl'")
        self.backend = backend
        self.host = host
        """The address Gloo binds and advertises to peers: the one other groups can reach.
        (Gloo's default is whatever the hostname resolves to, often 127.0.0.1, which breaks a
        multi-host job unless GLOO_SOCKET_IFNAME is set.)"""
        self.collective_timeout_s = collective_timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.spec: ColumnSpec | None = None
        self.broken: str | None = None
        """Why the current group may not be used again (None while healthy)."""
        self._pg: dist.ProcessGroup | None = None
        self._pending: list[dist.Work] = []
        self._parked: list[tuple[dist.ProcessGroup, list[dist.Work]]] = []
        self._flags: FlagMesh | None = None
        self._token = token
        self._tls = tls

    @property
    def device(self) -> torch.device:
        """Where this backend's tensors live: the current CUDA device for NCCL, else the CPU."""
        return torch.device("cuda", torch.cuda.current_device()) if self.backend == "nccl" else torch.device("cpu")

    @property
    def size(self) -> int:
        return 0 if self.spec is None else self.spec.world_size

    def configure(self, spec: ColumnSpec, abort: threading.Event | None = None) -> None:
        """Build the group for a new quorum (blocks for the rendezvous, bounded by connect_timeout_s).

        Every rank first waits, abortably, until all have published their flag addresses:
        Gloo's rendezvous, which follows, cannot be interrupted, and a member that died after
        the quorum formed never joins it, so entering it waited out the whole connect timeout
        (chaos ``every_fault``: a donor killed as it began serving a heal cost the others
        10 s). Set, ``abort`` (a member of the quorum was lost) ends that wait at once, and
        Gloo's rendezvous itself is watched for it and for a peer that gave up (rendezvous.py)."""
        self._retire()
        self.spec = None
        self.broken = None
        if spec.world_size > 1:
            # Two clients: Gloo's rendezvous holds one while the other watches (rendezvous.py).
            prefixed, watch = self._store_client(spec), self._store_client(spec)
            if self._flags is None:
                self._flags = FlagMesh(self.host, token=self._token, tls=self._tls)
            self._flags.publish(prefixed, spec.rank)
            deadline = time.monotonic() + self.connect_timeout_s
            abort = abort or threading.Event()
            try:
                self._flags.await_peers(prefixed, spec.world_size, deadline, abort)
                create = functools.partial(self._create, prefixed, spec.rank, spec.world_size)
                self._pg = rendezvous.join(create, watch, deadline, abort) if self.backend == "gloo" else create()
            except (FlagError, rendezvous.RendezvousError) as e:
                rendezvous.mark_abandoned(watch, spec.rank)
                raise CollectiveError(str(e)) from None
            try:
                self._flags.connect(prefixed, spec.quorum_id, spec.rank, spec.world_size, deadline)
            except FlagError as e:
                raise CollectiveError(str(e)) from None
        self.spec = spec

    def _store_client(self, spec: ColumnSpec) -> dist.Store:
        """A connection to the quorum's rendezvous store, under the quorum's prefix."""
        host, port = spec.store_address.rsplit(":", 1)
        store = dist.TCPStore(
            host.strip("[]"),
            int(port),
            is_master=False,
            timeout=datetime.timedelta(seconds=self.connect_timeout_s),
            wait_for_workers=False,
        )
        return dist.PrefixStore(spec.prefix, store)

    def _create(self, store: dist.Store, rank: int, size: int) -> dist.ProcessGroup:
        timeout = datetime.timedelta(seconds=self.collective_timeout_s)
        if self.backend == "gloo":
            options = dist.ProcessGroupGloo._Options()
            options._timeout = timeout
            options._devices = [dist.ProcessGroupGloo.create_device(hostname=self.host)]
            return dist.ProcessGroupGloo(store, rank, size, options)
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout
        # Non-blocking communicator init: the init with a member that died meanwhile returns
        # instead of blocking in NCCL, and ``abandon``'s abort() can end it; torch bounds its
        # waits on a non-blocking communicator by TORCH_NCCL_NONBLOCKING_TIMEOUT (read here).
        options.config.blocking = False
        os.environ.setdefault("TORCH_NCCL_NONBLOCKING_TIMEOUT", f"{self.connect_timeout_s:g}")
        pg = dist.ProcessGroupNCCL(store, rank, size, options)
        device = torch.device("cuda", torch.cuda.current_device())
        pg.eager_connect_single_device(device)
        return pg

    def allreduce(self, tensor: torch.Tensor, op: str = "allreduce", *, reduce: Reduce = "sum") -> CollectiveHandle:
        """Start a SUM (or MAX) all-reduce of ``tensor`` in place; raises CollectiveError if unusable."""
        if self.spec is None:
            raise CollectiveError(f"{op}: the column group is not configured for this quorum")
        if self.broken is not None:
            raise CollectiveError(f"{op}: the column group is broken ({self.broken})")
        if self._pg is None:
            return CollectiveHandle(self, None, op)
        opts = dist.AllreduceOptions()
        opts.reduceOp = dist.ReduceOp.MAX if reduce == "max" else dist.ReduceOp.SUM
        try:
            work = self._pg.allreduce([tensor], opts)
        except Exception as e:
            self.mark_broken(f"{op} could not start: {e}")
            raise CollectiveError(f"{op} could not start: {e}") from e
        self._pending = [w for w in self._pending if not w.is_completed()]
        self._pending.append(work)
        return CollectiveHandle(self, work, op)

    def reduce_flag(
        self, value: float, step: int, deadline: float, abort: threading.Event, tick: Callable[[], None] | None = None
    ) -> float:
        """The column's "ok" flag: the sum of every rank's ``value`` for ``step``, exchanged
        over the column's flag mesh (replicaft/column/flag.py), not this group; raises CollectiveError
        (and breaks the group) if it fails."""
        if self.spec is None:
            raise CollectiveError("ok flag: the column group is not configured for this quorum")
        if self.broken is not None:
            raise CollectiveError(f"ok flag: the column group is broken ({self.broken})")
        if self._pg is None:
            return value
        assert self._flags is not None
        try:
            return self._flags.reduce(value, step, deadline, abort, tick)
        except FlagError as e:
            self.mark_broken(str(e))
            raise CollectiveError(str(e)) from None

    def mark_broken(self, reason: str) -> None:
        if self.broken is None:
            self.broken = reason
            logger.warning("column group of quorum %s broken: %s", self.spec.quorum_id if self.spec else None, reason)

    def abandon(self, reason: str) -> None:
        """Give up every in-flight operation; their buffers now belong to them."""
        self.mark_broken(reason)
        if self.backend == "nccl" and self._pg is not None:
            self._pg.abort()

    def shutdown(self) -> None:
        self._retire()
        self.spec = None
        if self._flags is not None:
            self._flags.close()
            self._flags = None

    def _retire(self) -> None:
        if self._flags is not None:
            self._flags.close_peers()
        if self._pg is not None:
            pending = [w for w in self._pending if not w.is_completed()]
            if pending:
                self._parked.append((self._pg, pending))
        self._pg = None
        self._pending = []
        self._parked = [(pg, ws) for pg, ws in self._parked if not all(w.is_completed() for w in ws)]
        if len(self._parked) > MAX_PARKED:
            logger.warning(
                "%d broken column groups still have pending operations; releasing the oldest", len(self._parked)
            )
            self._parked.pop(0)
