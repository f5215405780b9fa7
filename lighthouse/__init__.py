"""replicaft's quorum service and its client. Torch-free: importing it never imports torch."""

from lighthouse.blocking_client import LighthouseClient as LighthouseClient
from lighthouse.client import AsyncLighthouseClient as AsyncLighthouseClient
from lighthouse.envelope import PROTOCOL_VERSION as PROTOCOL_VERSION
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
from lighthouse.membership import MembershipOptions as MembershipOptions
from lighthouse.options import LighthouseOptions as LighthouseOptions
from lighthouse.plan import StepPlan as StepPlan
from lighthouse.plan import plan_step as plan_step
from lighthouse.protocol import Member as Member
from lighthouse.protocol import Quorum as Quorum
from lighthouse.replica_id import check_replica_id as check_replica_id
from lighthouse.replicated import ReplicatedLighthouse as ReplicatedLighthouse
from lighthouse.replicated import ReplicationOptions as ReplicationOptions
from lighthouse.server import LighthouseServer as LighthouseServer

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
