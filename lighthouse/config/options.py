"""Configuration of the lighthouse server, checked once when it is built."""

from __future__ import annotations

import hmac
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from lighthouse.config.option_checks import check_number, check_seconds
from lighthouse.errors import OptionsError
from lighthouse.rules.commit_lease import MAX_COMMIT_LEASE_S
from lighthouse.rules.liveness import LivenessRules
from lighthouse.tls.files import TlsFiles
from lighthouse.wire.envelope import MAX_MESSAGE_BYTES

TOKEN_ENV = "REPLICAFT_TOKEN"
"""The shared secret; the only environment variable the lighthouse reads (in ``from_env``)."""

TOKEN_METADATA_KEY = "x-replicaft-token"

MAX_MEMBERS = 65536
HUNG_MIN_S = 0.25
"""The shortest silence a member is declared hung on, by default."""


def token_problem(metadata: Sequence[tuple[str, str | bytes]] | None, token: str | None) -> str | None:
    """What is wrong with a call's token ("missing" / "wrong"), or None if it may proceed.

    Shared by every server that speaks the lighthouse's plumbing (the lighthouse itself and
    each group's manager server); compared in constant time.
    """
    if token is None:
        return None
    given = dict(metadata or ()).get(TOKEN_METADATA_KEY)
    if given is None:
        return "missing"
    if not hmac.compare_digest(str(given).encode(), token.encode()):
        return "wrong"
    return None


@dataclass(frozen=True, slots=True)
class MembershipOptions:
    min_replicas: int = 1
    join_timeout_s: float = 2.0
    heartbeat_timeout_s: float = 2.0
    """The longest silence any member may keep; liveness.py adapts a shorter one per member."""
    progress_timeout_s: float = 10.0
    hung_factor: float = 3.0
    """A member silent for its longest recent gap between messages plus ``hung_factor - 1``
    of its heartbeat intervals (at least ``hung_factor`` intervals) is hung (liveness.py)."""
    hung_min_s: float | None = None
    """No member is declared hung on a silence shorter than this. Default: ``HUNG_MIN_S``, or
    ``heartbeat_timeout_s`` where that is shorter (torchft's own tests run its lighthouse with
    a 100 ms heartbeat timeout, which a fixed 0.25 s floor refused); always a number once built."""
    max_commit_lease_s: float = 0.1
    """The longest commit lease a member is granted with a quorum (commit_lease.py); 0: none."""

    def __post_init__(self) -> None:
        check_number(
            "min_replicas",
            self.min_replicas,
            1,
            MAX_MEMBERS,
            integer=True,
            fix="the fewest groups a quorum may have, e.g. 1",
        )
        for name in ("join_timeout_s", "heartbeat_timeout_s", "progress_timeout_s"):
            check_seconds(name, getattr(self, name))
        check_number(
            "hung_factor",
            self.hung_factor,
            1.5,
            100.0,
            fix="how many times its longest gap a member may stay silent, e.g. 3",
        )
        if self.hung_min_s is None:
            object.__setattr__(self, "hung_min_s", min(HUNG_MIN_S, self.heartbeat_timeout_s))
        check_seconds("hung_min_s", self.hung_min_s, min(0.05, self.heartbeat_timeout_s))
        if self.hung_min_s > self.heartbeat_timeout_s:
            raise OptionsError(
                f"hung_min_s={self.hung_min_s} is above heartbeat_timeout_s={self.heartbeat_timeout_s}: "
                f"the floor of the silence limit must not exceed its ceiling; set --hung-min at most "
                f"{self.heartbeat_timeout_s:g}"
            )
        check_number(
            "max_commit_lease_s",
            self.max_commit_lease_s,
            0.0,
            MAX_COMMIT_LEASE_S,
            fix="how long a member may commit without asking the fence, e.g. 0.1, or 0 for never",
        )
        if self.progress_timeout_s <= self.heartbeat_timeout_s:
            raise OptionsError(
                f"progress_timeout_s={self.progress_timeout_s} is not above heartbeat_timeout_s="
                f"{self.heartbeat_timeout_s}: progress is only seen through heartbeats; set "
                f"--progress-timeout above {self.heartbeat_timeout_s}"
            )

    @property
    def liveness(self) -> LivenessRules:
        assert self.hung_min_s is not None, "set in __post_init__"
        return LivenessRules(self.heartbeat_timeout_s, self.hung_factor, self.hung_min_s)


@dataclass(frozen=True, kw_only=True, slots=True)
class LighthouseOptions:
    host: str = "127.0.0.1"
    """Loopback by default: serving other hosts is an explicit decision (``--host 0.0.0.0``)."""
    port: int = 29510
    """gRPC port; 0 picks a free one (the server reports the one it bound)."""
    status_port: int | None = None
    """HTTP status page and /metrics; None = no status page, 0 = pick a free port."""
    membership: MembershipOptions = MembershipOptions()
    token: str | None = None
    """When set, every RPC must carry it; a missing or wrong token gets UNAUTHENTICATED."""
    tls: TlsFiles | None = None
    """When set, gRPC and the status page are served over TLS, and gRPC callers must present
    a certificate the job's CA signed (lighthouse/tls/files.py); None = plaintext."""
    tick_s: float = 0.02
    """How often time-based rules (heartbeat, progress and join deadlines) are evaluated.

    Event-driven transitions (a join, a session closing) are decided at once; the tick only
    bounds how late a deadline is noticed, so 20 ms keeps that error far below the deadlines.
    """
    outbox_max_messages: int = 1024
    """Messages waiting to be sent on one session before the member is judged not to read."""
    outbox_max_bytes: int = 8 * MAX_MESSAGE_BYTES
    """Bytes waiting on one session, likewise: room for a few full-size quorums."""
    max_connections: int | None = None
    """Incoming gRPC connections served at once; past it a new one is closed as it is accepted.
    None: what the open-file limit leaves after the lighthouse's own files (binding.py)."""
    handshake_timeout_s: float = 10.0
    """A connection that has not finished its TLS and HTTP/2 handshake by then is closed: a
    real member finishes in milliseconds, a stuck or hostile one would hold a descriptor."""

    def __post_init__(self) -> None:
        if not isinstance(self.host, str) or not self.host:
            raise OptionsError(f"host={self.host!r}; give an address to bind, e.g. 127.0.0.1 or 0.0.0.0")
        check_number("port", self.port, 0, 65535, integer=True, fix="a TCP port, 0 for any free one")
        if self.status_port is not None:
            check_number("status_port", self.status_port, 0, 65535, integer=True, fix="a TCP port, 0 for any free one")
        check_number("tick_s", self.tick_s, 0.001, 1.0, fix="seconds between deadline checks, e.g. 0.02")
        check_number("outbox_max_messages", self.outbox_max_messages, 16, 2**20, integer=True)
        check_number(
            "outbox_max_bytes",
            self.outbox_max_bytes,
            MAX_MESSAGE_BYTES,
            2**34,
            integer=True,
            fix="at least one full message",
        )
        if self.max_connections is not None:
            check_number(
                "max_connections",
                self.max_connections,
                1,
                1 << 20,
                integer=True,
                fix="incoming connections, at least one per member",
            )
        check_number(
            "handshake_timeout_s",
            self.handshake_timeout_s,
            0.1,
            600.0,
            fix="seconds a new connection has to finish its handshake, e.g. 10",
        )
        if self.tick_s * 5 > min(self.membership.heartbeat_timeout_s, self.membership.hung_min_s * 2):
            raise OptionsError(
                f"tick_s={self.tick_s} is too coarse for heartbeat_timeout_s="
                f"{self.membership.heartbeat_timeout_s} and hung_min_s={self.membership.hung_min_s}; use a "
                "tick at most a fifth of the first and two fifths of the second"
            )
        if self.token is not None and not self.token:
            raise OptionsError("token is empty; pass a non-empty token or none at all")

    @staticmethod
    def token_from_env(environ: Mapping[str, str] = os.environ) -> str | None:
        """The token in ``$REPLICAFT_TOKEN``; None when unset. Set but empty is an error: it
        used to turn authentication off without a word, while ``--token ''`` was refused."""
        token = environ.get(TOKEN_ENV)
        if token is not None and not token:
            raise OptionsError(
                f"{TOKEN_ENV} is set but empty; unset it to run without a token, or set the shared secret"
            )
        return token
