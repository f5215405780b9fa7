"""replicaft as a Ray Train backend: every Ray Train worker is a replica group of its own, and Ray
Train replaces a failed group alone while the others train on.

``ReplicaftConfig`` is a ``TorchConfig`` (pass it to ``TorchTrainer(torch_config=...)``) whose
backend declares replica groups (``has_replica_groups``, as Ray's ``TorchftConfig`` does), so
that Ray Train's controller, seeing one worker die, starts a new worker in its place, at the
same world rank, instead of restarting the whole worker group. Ray's ``FailureConfig``
(``max_failures``) is then the restart policy that ``replicaft-launch --max-restarts`` is
locally. The backend starts the job's lighthouse (lighthouse_actor.py) once and gives each
worker, before its training function runs, what the launcher gives a group's rank:
``REPLICAFT_LIGHTHOUSE``, a replica id that a replacement keeps (``<prefix><world rank>``), the
job's token, its node's address and interface, and ``RANK``/``WORLD_SIZE`` of its group (Ray Train
sets them to the job's, which replicaft would read as the group's). Each group also gets its own
torch.distributed default group, as torchrun would give it.

Ray Train 2.58 makes replica groups of one worker each, so a group here is one rank (W = 1); a
group of W > 1 ranks (FSDP inside a group) needs torchrun or Slurm (deploy/).
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import ray
import ray.train
from ray.train.torch import TorchConfig
from ray.train.torch.config import _TorchBackend

from lighthouse.__main__ import parse_options
from replicaft.launch.children import free_port
from replicaft.ray.host import interface_of
from replicaft.ray.lighthouse_actor import START_TIMEOUT_S, start_lighthouse

_GROUP_OF_ONE = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"}


@dataclass
class ReplicaftConfig(TorchConfig):
    """Ray Train's configuration for a replicaft job (module docstring)."""

    lighthouse_args: Sequence[str] = ()
    """``replicaft-lighthouse`` flags for the job's lighthouse, e.g. ``("--min-replicas", "2")``;
    its host and port are chosen here."""
    replica_prefix: str = "g"
    """Replica ids are this and the worker's world rank: ``g0``, ``g1``, ..."""
    token: str | None = field(default=None, repr=False)
    """The job's shared secret (lighthouse, state servers); default ``$REPLICAFT_TOKEN``, else a
    new one per job, as ``replicaft-launch`` makes."""

    def __post_init__(self) -> None:
        self.lighthouse_args = [str(a) for a in self.lighthouse_args]
        parse_options(self.lighthouse_args)  # a bad flag fails here, in the driver, not in an actor
        if self.token is None:
            self.token = os.environ.get("REPLICAFT_TOKEN") or secrets.token_urlsafe(32)

    @property
    def backend_cls(self) -> type[_ReplicaftBackend]:
        return _ReplicaftBackend


class _ReplicaftBackend(_TorchBackend):
    has_replica_groups = True

    def __init__(self) -> None:
        super().__init__()
        self._lighthouse: Any = None
        self._lighthouse_address = ""

    def on_start(self, worker_group: Any, backend_config: ReplicaftConfig) -> None:  # type: ignore[override]
        address = self._start_lighthouse(backend_config)
        # A whole worker group at the start; one replica group when Ray replaces a failed one.
        groups = worker_group.get_replica_groups() if hasattr(worker_group, "get_replica_groups") else [worker_group]
        start_torch = super().on_start  # bound here: zero-argument super() does not work in the pool's threads

        def start(group: Any) -> None:
            start_torch(group, backend_config)
            group.execute(_enter_group, address, backend_config.replica_prefix, backend_config.token, len(group))

        with ThreadPoolExecutor(max_workers=max(1, len(groups))) as pool:
            for done in [pool.submit(start, g) for g in groups]:
                done.result()

    def _start_lighthouse(self, config: ReplicaftConfig) -> str:
        if self._lighthouse is None:
            host = ray.util.get_node_ip_address()
            args = [*config.lighthouse_args, "--token", str(config.token)]
            self._lighthouse = start_lighthouse(host, free_port(host), args, ray.get_runtime_context().get_node_id())
            self._lighthouse_address = ray.get(self._lighthouse.address.remote(), timeout=START_TIMEOUT_S)
        return self._lighthouse_address


def _enter_group(lighthouse: str, replica_prefix: str, token: str, group_size: int) -> None:
    """In a worker, before its training function: the variables that make it one replica group."""
    if group_size != 1:
        raise RuntimeError(f"replicaft under Ray Train runs one worker per replica group; Ray gave {group_size}")
    os.environ.update(
        _GROUP_OF_ONE,
        REPLICAFT_LIGHTHOUSE=lighthouse,
        REPLICAFT_REPLICA_ID=f"{replica_prefix}{ray.train.get_context().get_world_rank()}",
        REPLICAFT_TOKEN=token,
    )
    host = os.environ.setdefault("REPLICAFT_HOST", ray.util.get_node_ip_address())
    interface = interface_of(host)
    if interface is not None:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", interface)
        os.environ.setdefault("NCCL_SOCKET_IFNAME", interface)
