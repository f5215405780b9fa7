"""How many connections a state server holds, and for how long: the limits and the admission rule.

A state server (server.py) spends a thread per connection, and a peer need not have the
token to hold one: until its first request is in, a connection is unauthenticated. So:

* ``max_connections`` bounds the threads; ``max_unauthenticated`` (smaller) bounds what peers
  without a token can hold.
* ``admit`` decides what becomes of a new connection: accepted while both caps allow; else
  the oldest unauthenticated connection is closed to make room for it; refused at once
  (an error frame with code ``busy``) only when every open connection is authenticated.
  Refusing the newcomer whenever the unauthenticated cap is reached was the obvious rule and
  the wrong one: ``max_unauthenticated`` clients trickling their handshake, reconnecting as
  each is cut, would lock every healer out for as long as they cared to. A healer sends its
  first request with its connection, so it is unauthenticated for about one round trip; to
  evict it, a flood must open more than ``max_unauthenticated`` connections within that time.
* The handshake (TLS, then the first request in full) has one deadline counted from the
  accept, and each later request frame one from its first byte: a deadline per ``recv``
  bounded nothing, since one byte every few seconds kept a thread for ever (issue 19).

Pure: no sockets, no clock; server.py applies it under its lock.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from lighthouse.tls.files import HANDSHAKE_TIMEOUT_S
from replicaft.config.options import HEAL_CONNECTIONS

IDLE_TIMEOUT_S = 30.0
"""A connection idle this long between requests is closed, so a stalled healer cannot pin a
server thread. Also the most one ``sendall`` of a reply (a piece of a range) may take."""
REQUEST_TIMEOUT_S = 10.0
"""A request frame (under 200 bytes plus the token) must be whole this long after its first byte."""
MAX_HEALERS_SERVED = 16
"""Healers one rank's state server is sized to serve at once: one per other replica group that
heals from this group in the same quorum."""
MAX_CONNECTIONS = MAX_HEALERS_SERVED * (HEAL_CONNECTIONS + 2)
"""A healer holds at most ``heal_connections`` pulling connections to one donor (all of them
when the donor's host is its only donor host, client.streams_by_donor), plus one for its
manifest request and one for a done notice to a spare: ``HEAL_CONNECTIONS + 2`` (4 by
default), 64 in all. A healer whose connection is refused drops this donor for the attempt
and retries at the next quorum, so the cap trades a slower heal beyond 16 healers for a
bounded number of threads."""
MAX_UNAUTHENTICATED = MAX_HEALERS_SERVED * HEAL_CONNECTIONS
"""Connections whose first request is not yet in (32): room for every healer's pulling
connections opening in the same instant, as they do once the manifests are in; past it the
oldest is evicted (see the module docstring)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ServerLimits:
    """What one peer may hold of a state server (see the module docstring); tests shorten them."""

    max_connections: int = MAX_CONNECTIONS
    max_unauthenticated: int = MAX_UNAUTHENTICATED
    """At most ``max_connections``; a connection is unauthenticated until its first request is in."""
    handshake_timeout_s: float = HANDSHAKE_TIMEOUT_S
    """From the accept to the first request in full (TLS handshake included), in total."""
    request_timeout_s: float = REQUEST_TIMEOUT_S
    """From a request frame's first byte to its last."""
    idle_timeout_s: float = IDLE_TIMEOUT_S
    """Between requests; and the most one ``sendall`` of a reply may take."""

    def __post_init__(self) -> None:
        if not 1 <= self.max_unauthenticated <= self.max_connections:
            raise ValueError(
                f"max_unauthenticated={self.max_unauthenticated} with max_connections="
                f"{self.max_connections}; it must be between 1 and max_connections"
            )
        for name in ("handshake_timeout_s", "request_timeout_s", "idle_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name}={getattr(self, name)}; it must be positive")


@dataclass(frozen=True, slots=True)
class Admission:
    """What to do with a connection just accepted, and why (for the log and the error frame)."""

    action: Literal["accept", "evict_oldest", "refuse"]
    reason: str


def admit(num_open: int, num_unauthenticated: int, limits: ServerLimits) -> Admission:
    """Admit a new connection, given the open ones (``num_unauthenticated`` of them without
    their first request yet): accept it while both caps allow; else evict the oldest
    unauthenticated connection for it; refuse it only when every open connection is
    authenticated (a newcomer cannot be told from an attacker, an old unauthenticated
    connection is either one that trickles or one far slower than any healer)."""
    if num_open < limits.max_connections and num_unauthenticated < limits.max_unauthenticated:
        return Admission("accept", "")
    if num_unauthenticated > 0:
        which = (
            ("max_unauthenticated", limits.max_unauthenticated)
            if num_unauthenticated >= limits.max_unauthenticated
            else ("max_connections", limits.max_connections)
        )
        return Admission(
            "evict_oldest",
            f"{num_unauthenticated} of {num_open} open connections have not sent a "
            f"request; the limit {which[0]}={which[1]} is reached, so the oldest of "
            "them is closed for a newer one",
        )
    return Admission(
        "refuse",
        f"the state server holds {num_open} authenticated connections, its limit "
        f"(max_connections={limits.max_connections}); retry at the next quorum",
    )


@dataclass(frozen=True, slots=True)
class ServerStatistics:
    """Counters of a state server (``StateServer.statistics``), since it started."""

    num_open: int
    num_unauthenticated: int
    num_refused: int
    """Connections refused at once: every open connection was authenticated and the cap reached."""
    num_evicted: int
    """Unauthenticated connections closed to make room for a newer one."""
    num_handshake_timeouts: int
    num_request_timeouts: int
    num_rejected: int
    """First requests refused as malformed, of another version or without the right token."""
