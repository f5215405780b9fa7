"""replicaft's errors. Every message says what was wrong, where, and what to change."""

from __future__ import annotations

from lighthouse.errors import LighthouseError, OptionsError, ProtocolError

__all__ = [
    "CheckpointCorrupt",
    "GroupError",
    "HealError",
    "LighthouseError",
    "OptionsError",
    "ProtocolError",
    "ReplicaftError",
    "StateError",
    "StepMismatch",
]


class ReplicaftError(Exception):
    """Base of the errors raised by the replicaft library (not the lighthouse)."""


class GroupError(ReplicaftError):
    """The ranks of one replica group disagree or cannot reach their manager server."""


class StepMismatch(GroupError):
    """A rank called the group's manager with a step other than its peers'."""


class GroupBroken(GroupError):
    """A rank of this replica group is gone: the group cannot commit again and must be
    restarted whole (by torchrun or the orchestrator), then heals from its peers."""


class StateError(ReplicaftError, ValueError):
    """Training state cannot be captured, sent or applied (unsupported type, shape mismatch)."""


class HealError(ReplicaftError):
    """A heal failed: no donor could serve a range, or what arrived did not verify."""


class CheckpointCorrupt(ReplicaftError):
    """A persistent checkpoint is partial or fails its checksums."""
