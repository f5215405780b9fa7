"""replicaft's errors. Every message says what was wrong, where, and what to change."""

from __future__ import annotations

from lighthouse import errors as lighthouse_errors
from lighthouse.errors import LighthouseError, ProtocolError

__all__ = [
    "CheckpointCorrupt",
    "CheckpointKeyError",
    "CheckpointStoreUnavailable",
    "GroupError",
    "HealError",
    "LighthouseError",
    "ObjectStoreError",
    "ObjectStoreRefused",
    "OptionsError",
    "ProtocolError",
    "ReplicaftError",
    "StateError",
    "StepMismatch",
]


class ReplicaftError(Exception):
    """Base of the errors raised by the replicaft library (not the lighthouse)."""


class OptionsError(ReplicaftError, lighthouse_errors.OptionsError):
    """A setting is invalid or inconsistent with another one. Also a lighthouse
    ``OptionsError`` (the lighthouse package raises its own, torch-free), so one ``except``
    of that type takes both; ``except replicaft.ReplicaftError`` takes replicaft's."""


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


class CheckpointKeyError(ReplicaftError):
    """An encrypted checkpoint cannot be read with the key given (none, or another one).
    Not corruption: the checkpoint is intact, and an older one would need the same key, so a
    resume stops with this error rather than falling back."""


class ObjectStoreError(ReplicaftError):
    """The object-store tier refused or failed a request (credentials, bucket, server)."""


class ObjectStoreRefused(ObjectStoreError):
    """The store answered, and said no (credentials, permissions, no such bucket): asking again
    gives the same answer, so nothing retries it."""


class CheckpointStoreUnavailable(ObjectStoreError):
    """A checkpoint may be in the object store, and the store cannot be asked (down, black-holed,
    refusing the credentials). A starting group stops with this rather than train from step 0:
    that would begin a second history beside the stored one, and upload it there."""
