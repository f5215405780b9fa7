"""torchft 0.2.0's ``Manager`` on replicaft's manager.

Covered: the constructor arguments (``pg``, ``load_state_dict``, ``state_dict``,
``min_replica_size``, ``use_async_quorum``, ``timeout``, ``quorum_timeout``,
``connect_timeout``, ``rank``, ``world_size``, ``store_addr``, ``store_port``,
``lighthouse_addr``, ``replica_id``, ``heartbeat_interval``, ``init_sync``, ``max_retries``,
``quorum_retries``, ``checkpoint_transport``; ``port`` and ``hostname`` are accepted and
unused because replicaft binds its own ports) and the methods (``register_state_dict_fn``,
``start_quorum``, ``wait_quorum``, ``allreduce``, ``should_commit``, ``report_error``,
``errored``, ``wrap_future`` (managed_future.py), ``current_step``, ``batches_committed``,
``num_participants``, ``participating_rank``, ``is_participating``, ``shutdown``); the environment variables
``TORCHFT_LIGHTHOUSE`` (or replicaft's ``REPLICAFT_LIGHTHOUSE``), the replica id when none
is passed (replicaft's ``REPLICAFT_REPLICA_ID``, which the launcher sets, else
``REPLICA_GROUP_ID``, which ``--torchft`` also sets, to the group's number), ``TORCHFT_TIMEOUT_SEC``,
``TORCHFT_QUORUM_TIMEOUT_SEC``, ``TORCHFT_CONNECT_TIMEOUT_SEC``, ``TORCHFT_QUORUM_RETRIES``,
``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``.

Differences, on purpose: explicit arguments win over the environment (torchft lets
``TORCHFT_*_SEC`` override them); ``replica_id`` is used as given, without a uuid suffix, so
a restarted group is recognised; a failed quorum or collective never raises into the loop; a
``checkpoint_transport`` is accepted and not used (replicaft's striped, verified transfer
moves the state; a log line says so). Not supported (a clear error says so):
``world_size_mode=FIXED_WITH_SPARES``, ``allreduce(should_quantize=True)``,
``start_quorum(allow_heal=False / shrink_only=True)``. A ``timeout`` passed to
``start_quorum`` or ``should_commit`` is that call's deadline, as in torchft, and its running
out raises ``TimeoutError`` (a synchronous ``start_quorum`` without a quorum, a
``should_commit`` without a decision); without one, nothing raises.

Also different: ``should_commit`` right after another ``should_commit`` asks for the new
step's quorum first (torchft commits it on the last quorum); an error injected through
``FakeProcessGroupWrapper`` fails only this facade's ``allreduce`` (torchft: any all-reduce;
the wrappers' go through replicaft's manager, see ``_StepWatch``); under ``DiLoCo`` and ``LocalSGD`` heals do not move
the states registered with
``register_state_dict_fn`` (the group's local weights and inner optimizer, which differ
between groups: see ``keep_user_state_per_group``); and random generator state is not moved
(torchft moves none). The tensors a script's state shares with what the compat
``DistributedDataParallel`` and ``Optimizer`` register are served and hashed once (aliasing.py).
"""

from __future__ import annotations

import datetime
import logging
import os
import time
import uuid
from collections.abc import Callable
from typing import Any

import torch

import replicaft
from lighthouse.errors import QuorumTimeout
from replicaft.column.process_group import ManagedWork
from replicaft.compat.torchft.aliasing import resolve_aliased, strip_aliased, tensor_keys
from replicaft.compat.torchft.checkpointing.transport import CheckpointTransport
from replicaft.compat.torchft.process_group import FakeProcessGroupWrapper, ProcessGroup
from replicaft.errors import GroupError, OptionsError
from replicaft.state.registry import StepHooks

__all__ = ["Manager", "WorldSizeMode"]

logger = logging.getLogger(__name__)


class WorldSizeMode:
    DYNAMIC = 0
    FIXED_WITH_SPARES = 1


def _seconds(value: datetime.timedelta | float | None) -> float | None:
    if value is None:
        return None
    return value.total_seconds() if isinstance(value, datetime.timedelta) else float(value)


def _env_seconds(name: str) -> float | None:
    raw = os.environ.get(name)
    if raw is None:
        return None
    try:
        return float(raw)
    except ValueError:
        raise OptionsError(f"{name}={raw!r} is not a number of seconds") from None


class _StepWatch(StepHooks):
    """Whether a step is open: its quorum asked for (by this facade or a wrapper calling
    replicaft's manager directly) and the step not yet decided. torchft's ``should_commit``
    may follow another ``should_commit`` and commits a step on the same quorum; replicaft's
    steps each have their own, so the facade asks for it first.

    An error injected through ``FakeProcessGroupWrapper`` is delivered only by this facade's
    ``allreduce``, not at a step's start: replicaft's manager skips the all-reduces of a step
    that already failed, while the other groups run them, and the next collective then pairs
    with a peer's different one (Gloo aborts the process: "52 vs 4 ... collective mismatch").
    """

    def __init__(self, pg: ProcessGroup, manager: replicaft.Manager) -> None:
        self.open = False
        self._pg = pg
        self._manager = manager

    def deliver_injected_error(self) -> None:
        injected = self._pg.take_error() if isinstance(self._pg, FakeProcessGroupWrapper) else None
        if injected is not None:
            self._manager.report_error(injected)

    def on_step_start(self) -> None:
        self.open = True

    def on_commit(self) -> None:
        self.open = False

    def on_abort(self) -> None:
        self.open = False


class Manager:
    """torchft's ``Manager`` constructor and methods, backed by :class:`replicaft.Manager`."""

    from replicaft.compat.torchft.managed_future import wrap_future

    def __init__(
        self,
        pg: ProcessGroup,
        load_state_dict: Callable[[Any], None] | None,
        state_dict: Callable[[], Any] | None,
        min_replica_size: int,
        use_async_quorum: bool = True,
        timeout: datetime.timedelta = datetime.timedelta(seconds=60),
        quorum_timeout: datetime.timedelta = datetime.timedelta(seconds=60),
        connect_timeout: datetime.timedelta = datetime.timedelta(seconds=60),
        rank: int | None = None,
        world_size: int | None = None,
        world_size_mode: int = WorldSizeMode.DYNAMIC,
        store_addr: str | None = None,
        store_port: int | None = None,
        lighthouse_addr: str | None = None,
        replica_id: str | None = None,
        port: int | None = None,
        hostname: str | None = None,
        heartbeat_interval: datetime.timedelta = datetime.timedelta(milliseconds=100),
        checkpoint_transport: object | None = None,
        init_sync: bool = True,
        max_retries: int | None = None,
        quorum_retries: int = 0,
    ) -> None:
        if world_size_mode != WorldSizeMode.DYNAMIC:
            raise OptionsError("world_size_mode=FIXED_WITH_SPARES is not supported by replicaft; use DYNAMIC")
        if checkpoint_transport is not None:
            if not isinstance(checkpoint_transport, CheckpointTransport):
                raise OptionsError(
                    f"checkpoint_transport={checkpoint_transport!r} is not a torchft CheckpointTransport; pass "
                    "PGTransport or HTTPTransport from torchft.checkpointing, or nothing"
                )
            logger.info(
                "checkpoint_transport=%s accepted and not used: replicaft's own transfer (striped, "
                "verified, no pickle) moves the state in a heal",
                type(checkpoint_transport).__name__,
            )
        if not isinstance(pg, ProcessGroup):
            raise OptionsError(
                f"pg={pg!r}: pass a process group from torchft.process_group (ProcessGroupGloo, "
                "ProcessGroupNCCL, ProcessGroupBabyNCCL, ...)"
            )
        # REPLICAFT_*: set by replicaft-launch (and the chaos harness) for the groups they start.
        lighthouse = lighthouse_addr or os.environ.get("TORCHFT_LIGHTHOUSE") or os.environ.get("REPLICAFT_LIGHTHOUSE")
        if not lighthouse:
            raise OptionsError("no lighthouse: pass lighthouse_addr or set TORCHFT_LIGHTHOUSE")
        lighthouse = lighthouse.removeprefix("http://").removeprefix("https://").rstrip("/")
        group_store = None
        store_addr = store_addr or os.environ.get("MASTER_ADDR")
        store_port = store_port or (int(os.environ["MASTER_PORT"]) if "MASTER_PORT" in os.environ else None)
        if store_addr and store_port:
            group_store = f"{store_addr}:{store_port}"
        collective = _seconds(timeout) if timeout is not None else _env_seconds("TORCHFT_TIMEOUT_SEC")
        quorum = _seconds(quorum_timeout) if quorum_timeout is not None else _env_seconds("TORCHFT_QUORUM_TIMEOUT_SEC")
        options = replicaft.ManagerOptions(
            lighthouse=lighthouse,
            replica_id=replica_id
            or os.environ.get("REPLICAFT_REPLICA_ID")
            or os.environ.get("REPLICA_GROUP_ID")
            or str(uuid.uuid4()),
            group_rank=rank if rank is not None else int(os.environ.get("RANK", "0")),
            group_world_size=world_size if world_size is not None else int(os.environ.get("WORLD_SIZE", "1")),
            group_store=group_store,
            min_replicas=min_replica_size,
            backend=pg.backend,
            heartbeat_interval_s=_seconds(heartbeat_interval) or 0.1,
            collective_timeout_s=collective or 60.0,
            quorum_timeout_s=max(quorum or 60.0, (collective or 60.0) * 2),
            heal_timeout_s=collective or 60.0,
            connect_timeout_s=_seconds(connect_timeout) or _env_seconds("TORCHFT_CONNECT_TIMEOUT_SEC") or 60.0,
            max_quorum_failures=max(1, int(os.environ.get("TORCHFT_QUORUM_RETRIES", quorum_retries)) + 1),
            token=os.environ.get("REPLICAFT_TOKEN"),
            events_dir=os.environ.get("REPLICAFT_EVENTS_DIR"),
        )
        self._use_async_quorum = use_async_quorum
        self._pg = pg
        self._user_fns: dict[str, tuple[Callable[[Any], None], Callable[[], Any]]] = {}
        self._user_state_per_group = False
        """Set by the compat DiLoCo and LocalSGD (``keep_user_state_per_group``)."""
        self._registered_states: list[Callable[[], Any]] = []
        """What the compat wrappers registered with replicaft themselves (``note_registered_state``)."""
        self._views: dict[str, Callable[[], Any]] = {}
        """torchft-shaped views of replicaft state for ``_manager_state_dict`` (compat DiLoCo)."""
        self._max_retries = max_retries
        self._failed_commits = 0
        # torchft moves no random generator state; its tests run the replica groups as threads
        # of one process, whose global generators no group owns (two donors' snapshots of them
        # never agree, and a healer would load one into every thread).
        self._manager = replicaft.Manager(options, init_sync=init_sync, rng_state=False)
        self._step_watch = _StepWatch(pg, self._manager)
        self._manager.register_hooks(self._step_watch)
        if state_dict is not None and load_state_dict is not None:
            self.register_state_dict_fn("default", load_state_dict, state_dict)
        self._manager.start()

    @property
    def inner(self) -> replicaft.Manager:
        """The replicaft manager behind this facade (for the wrappers)."""
        return self._manager

    def register_state_dict_fn(
        self, key: str, load_state_dict: Callable[[Any], None], state_dict: Callable[[], Any]
    ) -> None:
        self._user_fns[key] = (load_state_dict, state_dict)
        self._manager.register_state(key, lambda: self._served_user_state(key), lambda s: self._load_user_state(key, s))

    def set_state_dict_fns(self, load_state_dict: Callable[[Any], None], state_dict: Callable[[], Any]) -> None:
        """torchft's deprecated form of ``register_state_dict_fn`` (torchtitan calls it), under
        the key torchft uses for it."""
        logger.warning("`set_state_dict_fns` is deprecated, please use `register_state_dict_fn` instead")
        self.register_state_dict_fn("set_state_dict_fns", load_state_dict, state_dict)

    def state_dict(self) -> dict[str, int]:
        """The manager's own counters, for a checkpoint the script writes itself (torchft's)."""
        return {"step": self.current_step(), "batches_committed": self.batches_committed()}

    def load_state_dict(self, state_dict: dict[str, int]) -> None:
        """Continue from a checkpoint the script wrote itself (before the first step)."""
        self._manager.restore_step(int(state_dict["step"]))

    def keep_user_state_per_group(self) -> None:
        """From now on heals neither serve nor load the states registered through
        ``register_state_dict_fn``: under DiLoCo and LocalSGD they hold the group's local
        weights and inner optimizer, which differ between groups by design, so two donors
        never agree on them (replicaft heals from the donors' majority; torchft copies one
        donor's). The healer keeps its own; its weights come from the synced fragments."""
        self._user_state_per_group = True

    def note_registered_state(self, state_dict: Callable[[], Any]) -> None:
        """A compat wrapper (``DistributedDataParallel``, ``Optimizer``) registered the state
        ``state_dict`` returns with replicaft itself: the tensors the script's own state shares
        with it are served and hashed once, not twice (aliasing.py)."""
        self._registered_states.append(state_dict)

    def _served_user_state(self, key: str) -> Any:
        if self._user_state_per_group:
            return {}
        state = self._user_fns[key][1]()
        if not self._registered_states:
            return state
        return strip_aliased(state, tensor_keys(fn() for fn in self._registered_states))

    def _load_user_state(self, key: str, state: Any) -> None:
        if self._user_state_per_group:
            return
        load, state_dict = self._user_fns[key]
        # Always resolved against the own state: a healed DTensor (torchtitan's FSDP2 model)
        # arrives as a plain tensor and becomes a DTensor again there (aliasing.py).
        load(resolve_aliased(state, state_dict()))

    def _manager_state_dict(self) -> dict[str, Any]:
        """torchft's private layout of the state a heal moves, which its own tests read:
        ``{"user": {key: state}, "torchft": {"step": ...}}``, DiLoCo fragments included as
        ``StreamingDiLoCoFragment_<i>`` (``original_parameters``, ``outer_optimizer``)."""
        user = {key: state_dict() for key, (_, state_dict) in self._user_fns.items()}
        for key, view in self._views.items():
            user[key] = view()
        return {
            "user": user,
            "torchft": {"step": self._manager.current_step(), "batches_committed": self._manager.current_step()},
        }

    def start_quorum(
        self, allow_heal: bool = True, shrink_only: bool = False, timeout: datetime.timedelta | None = None
    ) -> None:
        if not allow_heal or shrink_only:
            raise OptionsError("start_quorum(allow_heal=False / shrink_only=True) is not supported by replicaft")
        deadline_s = None if timeout is None else _seconds(timeout)
        self._manager.start_quorum(deadline_s)
        if self._use_async_quorum:
            return
        try:
            formed = self._manager.wait_quorum() is not None
        except (QuorumTimeout, GroupError):  # the quorum failed max_quorum_failures times in a row
            if deadline_s is None:
                raise
            formed = False
        if not formed and deadline_s is not None:
            raise TimeoutError(
                f"status: Cancelled, message: Timeout expired: no quorum within start_quorum(timeout="
                f"{deadline_s:g}s): {self._manager.errored()}"
            )

    def wait_quorum(self) -> None:
        self._manager.wait_quorum()

    def allreduce(self, tensor: torch.Tensor, should_quantize: bool = False) -> ManagedWork:
        if should_quantize:
            raise OptionsError("should_quantize=True is not supported by replicaft; DiLoCo's should_quantize is")
        self._step_watch.deliver_injected_error()
        return self._manager.allreduce(tensor)

    def should_commit(self, timeout: datetime.timedelta | None = None) -> bool:
        if not self._step_watch.open:
            self.start_quorum()
        deadline_s = None if timeout is None else _seconds(timeout)
        started = time.monotonic()
        committed = self._manager.should_commit(deadline_s)
        self._failed_commits = 0 if committed else self._failed_commits + 1
        if not committed and deadline_s is not None and time.monotonic() - started >= deadline_s:
            raise TimeoutError(
                f"status: Cancelled, message: Timeout expired: should_commit(timeout={deadline_s:g}s) "
                "ran out without the group's decision; the step is not committed"
            )
        if self._max_retries is not None and self._failed_commits > self._max_retries:
            raise RuntimeError(
                f"{self._failed_commits} consecutive steps failed to commit (max_retries={self._max_retries})"
            )
        return committed

    def report_error(self, e: Exception) -> None:
        self._manager.report_error(e)

    def errored(self) -> Exception | None:
        return self._manager.errored()

    def current_step(self) -> int:
        return self._manager.current_step()

    def batches_committed(self) -> int:
        return self._manager.current_step()

    def num_participants(self) -> int:
        return self._manager.num_participants()

    def participating_rank(self) -> int | None:
        plan = self._manager.plan
        if plan is None or plan.healing:
            return None
        return plan.donors.index(plan.replica_id)

    def is_participating(self) -> bool:
        return self.participating_rank() is not None

    def shutdown(self, wait: bool = True) -> None:
        self._manager.shutdown()

    def disallow_state_dict_read(self) -> None:
        """torchft locks its state against its checkpoint server; replicaft serves a heal only
        between the quorum and the commit, when nothing writes the state, so no lock is needed."""

    def allow_state_dict_read(self) -> None:
        """See ``disallow_state_dict_read``."""
