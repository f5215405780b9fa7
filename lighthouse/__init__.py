"""replicaft's quorum service and its client. Torch-free: importing it never imports torch.

The servers (``LighthouseServer``, ``ReplicatedLighthouse``, ``ReplicationOptions``) load on
first use: every training process imports this package for its client and errors, and the
server side (its metrics registry, prometheus-client, the etcd client) cost a restarted group
about a tenth of a second before its first step.

Importing it also turns gRPC's fork support off for this process and its children, unless the
environment says otherwise (``GRPC_ENABLE_FORK_SUPPORT``, read when gRPC loads, which the
client below is the first to do): with it on, a fork beside gRPC's threads (a DataLoader
worker, under torchrun as under any launcher) skips gRPC's fork handlers and left the child
in a state that segfaulted (issue 43: one of three groups of torchft's ``train_ddp.py``). No
process of a job uses gRPC in a forked child; a program that imported gRPC first keeps its own.
"""

import os

os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "0")

from typing import TYPE_CHECKING, Any

from lighthouse.client.async_client import AsyncLighthouseClient as AsyncLighthouseClient
from lighthouse.client.blocking_client import LighthouseClient as LighthouseClient
from lighthouse.config.options import LighthouseOptions as LighthouseOptions
from lighthouse.config.options import MembershipOptions as MembershipOptions
from lighthouse.errors import DuplicateReplica as DuplicateReplica
from lighthouse.errors import EtcdUnavailable as EtcdUnavailable
from lighthouse.errors import LighthouseError as LighthouseError
from lighthouse.errors import LighthouseUnavailable as LighthouseUnavailable
from lighthouse.errors import NotLeader as NotLeader
from lighthouse.errors import OptionsError as OptionsError
from lighthouse.errors import ProtocolError as ProtocolError
from lighthouse.errors import QuorumTimeout as QuorumTimeout
from lighthouse.errors import QuorumTooLarge as QuorumTooLarge
from lighthouse.errors import Unauthenticated as Unauthenticated
from lighthouse.errors import VersionMismatch as VersionMismatch
from lighthouse.rules.plan import StepPlan as StepPlan
from lighthouse.rules.plan import plan_step as plan_step
from lighthouse.wire.envelope import PROTOCOL_VERSION as PROTOCOL_VERSION
from lighthouse.wire.protocol import Member as Member
from lighthouse.wire.protocol import Quorum as Quorum
from lighthouse.wire.replica_id import check_replica_id as check_replica_id

if TYPE_CHECKING:
    from lighthouse.replicated.server import ReplicatedLighthouse as ReplicatedLighthouse
    from lighthouse.replicated.server import ReplicationOptions as ReplicationOptions
    from lighthouse.server.grpc_server import LighthouseServer as LighthouseServer

_SERVERS = {
    "LighthouseServer": "lighthouse.server.grpc_server",
    "ReplicatedLighthouse": "lighthouse.replicated.server",
    "ReplicationOptions": "lighthouse.replicated.server",
}


def __getattr__(name: str) -> Any:
    if name in _SERVERS:
        import importlib

        value = getattr(importlib.import_module(_SERVERS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'lighthouse' has no attribute {name!r}")


__all__ = [
    "PROTOCOL_VERSION",
    "AsyncLighthouseClient",
    "DuplicateReplica",
    "EtcdUnavailable",
    "LighthouseClient",
    "LighthouseError",
    "LighthouseOptions",
    "LighthouseServer",
    "LighthouseUnavailable",
    "Member",
    "NotLeader",
    "MembershipOptions",
    "OptionsError",
    "ProtocolError",
    "Quorum",
    "QuorumTimeout",
    "QuorumTooLarge",
    "ReplicatedLighthouse",
    "ReplicationOptions",
    "StepPlan",
    "Unauthenticated",
    "VersionMismatch",
    "check_replica_id",
    "plan_step",
]
