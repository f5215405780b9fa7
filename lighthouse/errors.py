"""Errors the lighthouse and its clients raise; each message names the value and the fix."""

from __future__ import annotations


class LighthouseError(Exception):
    """Base of every error raised by the lighthouse package."""


class ProtocolError(LighthouseError, ValueError):
    """A message off the wire is malformed: wrong type, out of range, too large, not msgpack."""


class VersionMismatch(ProtocolError):
    """The peer speaks another protocol version (gRPC status FAILED_PRECONDITION)."""


class OptionsError(LighthouseError, ValueError):
    """A configuration value is invalid or inconsistent with another one."""


class LighthouseUnavailable(LighthouseError, ConnectionError):
    """The lighthouse could not be reached before the call's deadline."""


class QuorumTimeout(LighthouseError, TimeoutError):
    """No quorum containing this replica formed before the deadline."""


class Unauthenticated(LighthouseError, PermissionError):
    """The lighthouse rejected this client's token (gRPC status UNAUTHENTICATED)."""


class DuplicateReplica(LighthouseError):
    """Another live process holds this replica id (gRPC status ALREADY_EXISTS)."""


class QuorumTooLarge(LighthouseError):
    """A join would make the quorum larger than one message may be (gRPC RESOURCE_EXHAUSTED)."""


class EtcdUnavailable(LighthouseError, ConnectionError):
    """No etcd endpoint answered (or none could reach etcd's own quorum) before the deadline."""


class NotLeader(LighthouseError):
    """This lighthouse of a replicated set is not the leader (gRPC UNAVAILABLE naming the leader)."""


class TlsRefused(LighthouseError, ConnectionError):
    """A TLS handshake failed: the peer's certificate is not the job CA's, or one side runs plaintext."""
