"""The lighthouses a client knows, which one to talk to next, and how their errors read.

A job runs one lighthouse (the default) or a replicated set (lighthouse/replicated/server.py); a client is
given one address or all of them, comma-separated (``host:port,host:port``), or one name
that a Kubernetes Service spreads over the set. :class:`Targets` decides where the session
goes next, as a pure object:

* a lighthouse that is not the leader says so and names the leader ("not the leader
  (leader: X)"): go to X at once;
* a lighthouse that could not be reached, or whose session broke: try the next address at
  once; only after a whole round of failures pause, doubling from 50 ms to 1 s while no
  lighthouse answers at all, back to 50 ms as soon as one does (a follower), so a leader
  that is being elected is found within about 50 ms of its election.

With a single address nothing rotates, and the backoff is the single lighthouse's: it is
waited for while it restarts.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass

import grpc

from lighthouse.errors import (
    DuplicateReplica,
    LighthouseUnavailable,
    NotLeader,
    OptionsError,
    ProtocolError,
    QuorumTimeout,
    QuorumTooLarge,
    TlsRefused,
    Unauthenticated,
    VersionMismatch,
)
from lighthouse.tls.files import tls_refusal
from lighthouse.wire import envelope

logger = logging.getLogger(__name__)

RECONNECT_INITIAL_S = 0.05
RECONNECT_MAX_S = 1.0
NOT_LEADER_PAUSE_S = 0.01

CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", envelope.MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", envelope.MAX_MESSAGE_BYTES),
    # grpc's default reconnect backoff starts at 1 s and grows to 2 min; a lighthouse that
    # restarts must be found again within a fraction of a second: its first quorum forms as soon
    # as the last one's members are back (lighthouse/rules/reconnects.py), so the members' wait
    # between attempts is most of what a restart costs. Restarted 1 s after its SIGKILL, as the
    # demo does, three groups had their first quorum 0.55-0.90 s after it was up with attempts
    # at most 1 s apart, 0.15-0.29 s with 250 ms. A refused attempt costs the lighthouse's host
    # nothing to speak of: four a second per group while it is down.
    ("grpc.initial_reconnect_backoff_ms", 50),
    ("grpc.min_reconnect_backoff_ms", 50),
    ("grpc.max_reconnect_backoff_ms", 250),
    ("grpc.keepalive_time_ms", 2000),
    ("grpc.keepalive_timeout_ms", 2000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
    ("grpc.enable_retries", 0),
]

_LEADER = re.compile(r"not the leader \(leader: ([^\s()]+)\)")


def parse_addresses(text: str) -> tuple[str, ...]:
    """``host:port[,host:port...]`` as a tuple; raises OptionsError naming a bad entry."""
    addresses = tuple(a.strip() for a in text.split(","))
    for a in addresses:
        host, sep, port = a.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise OptionsError(f"lighthouse address {a!r} in {text!r} is not host:port (e.g. 127.0.0.1:29510)")
    return addresses


def translate(e: grpc.aio.AioRpcError, address: str = "the lighthouse") -> Exception:
    """The lighthouse's error for a gRPC status (each code means one thing on its wire);
    ``address`` is the lighthouse called, for a failed TLS handshake's message."""
    code, details = e.code(), e.details() or ""
    if code == grpc.StatusCode.UNAVAILABLE and (refused := tls_refusal(details, address)) is not None:
        return refused
    if code == grpc.StatusCode.UNAUTHENTICATED:
        return Unauthenticated(details)
    if code == grpc.StatusCode.FAILED_PRECONDITION:
        return VersionMismatch(details)
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        return ProtocolError(details)
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return QuorumTimeout(details)
    if code == grpc.StatusCode.ALREADY_EXISTS:
        return DuplicateReplica(details)
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        return QuorumTooLarge(details)
    if code == grpc.StatusCode.UNAVAILABLE and "not the leader" in details:
        return NotLeader(details)
    return LighthouseUnavailable(f"{code.name}: {details}")


FATAL = (Unauthenticated, VersionMismatch, ProtocolError, QuorumTooLarge, TlsRefused)
"""Errors retrying cannot help."""


@dataclass(slots=True)
class Targets:
    """Where the next session goes; ``after_*`` return how long to pause first."""

    addresses: tuple[str, ...]
    current: str = ""
    _failures: int = 0
    _backoff: float = RECONNECT_INITIAL_S

    def __post_init__(self) -> None:
        self.current = self.current or self.addresses[0]

    @property
    def replicated(self) -> bool:
        return len(self.addresses) > 1

    @property
    def first_attempt(self) -> bool:
        """No session has failed or ended yet. The client's first one does not wait for a ready
        channel: a lighthouse that closes it (TLS there, plaintext here) is then heard of at once
        and looked into (handshake_refusal.py), where a waiting call would hear nothing at all."""
        return self._failures == 0

    def after_session(self) -> float:
        """A session was registered (and has now ended): start afresh from here."""
        self._failures, self._backoff = 0, RECONNECT_INITIAL_S
        return self.after_failure()

    def after_not_leader(self, details: str) -> float:
        """``current`` is a follower; go to the leader it named, else to the next one. A
        lighthouse answered, so the set is up (a leader is being elected): the backoff starts
        afresh, or rounds of "not the leader" during an election would grow it to seconds."""
        self._backoff = RECONNECT_INITIAL_S
        named = _LEADER.search(details)
        if named is not None and named.group(1) != self.current:
            self.current = named.group(1)
            return NOT_LEADER_PAUSE_S
        return self.after_failure()

    def after_failure(self) -> float:
        """``current`` could not be reached or its session broke: the next address now, and
        a pause only once a whole round has failed."""
        self._failures += 1
        if self.replicated:
            i = self.addresses.index(self.current) + 1 if self.current in self.addresses else 0
            self.current = self.addresses[i % len(self.addresses)]
            if self._failures % len(self.addresses):
                return 0.0
        pause = self._backoff
        self._backoff = min(self._backoff * 2, RECONNECT_MAX_S)
        return pause


@dataclass(slots=True)
class Reconnect:
    """What a failed session means for the next: the pause before it (Targets says where it
    goes), or None when retrying cannot help. A refusal because another process holds the
    replica id is retried for ``duplicate_patience_s`` (async_client.DUPLICATE_PATIENCE_S)."""

    targets: Targets
    replica_id: str
    duplicate_patience_s: float
    refused_since: float | None = None

    def after_session(self, registered: bool) -> float:
        self.refused_since = None
        return self.targets.after_session() if registered else self.targets.after_failure()

    def after_error(self, error: Exception, now: float, registered: bool = False) -> float | None:
        """``error``: the session's, translated (``translate``); ``now``: monotonic; ``registered``:
        the session had registered before it broke. A lighthouse killed under a registered session
        breaks it with an error, not an end of stream: that starts the backoff afresh too, or each
        restart of the job's lighthouse found its members one doubling later (0.05 s, then 0.1,
        0.2, ... up to 1 s after it was back)."""
        if isinstance(error, NotLeader):
            pause = self.targets.after_not_leader(str(error))
            logger.debug("%s: %s; trying %s", self.replica_id, error, self.targets.current)
            return pause
        if isinstance(error, DuplicateReplica):
            self.refused_since = now if self.refused_since is None else self.refused_since
            if now - self.refused_since >= self.duplicate_patience_s:
                return None
            logger.warning(
                "lighthouse refused the session of %s, retrying for up to %gs: %s",
                self.replica_id,
                self.duplicate_patience_s,
                error,
            )
            return self.targets.after_failure()
        if isinstance(error, FATAL):
            return None
        logger.debug("lighthouse session of %s at %s broke: %s", self.replica_id, self.targets.current, error)
        return self.after_session(registered)
