"""Errors the lighthouse and its clients raise; each message names the value and the fix."""

from __future__ import annotations

import reprlib
from typing import Any


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


_SHOWN = reprlib.Repr()
_SHOWN.maxlevel = 3
_SHOWN.maxstring = _SHOWN.maxother = 80
_SHOWN.maxlist = _SHOWN.maxtuple = _SHOWN.maxdict = _SHOWN.maxset = 5


def shown(value: Any) -> str:
    """``value`` as an error message shows it: at most a few hundred characters, and never an
    error of its own. Values in messages come off a wire or a disk: ``repr`` of a megabyte
    string made a megabyte log line and gRPC status (whose metadata is capped at 8 KiB), and
    of a list nested 1000 deep (msgpack allows 1024) raised RecursionError (issue 19)."""
    try:
        return _SHOWN.repr(value)
    except ValueError:  # an int over 4300 digits, which repr refuses
        return f"<{type(value).__name__} too long to show>"
