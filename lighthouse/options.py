"""Configuration of the lighthouse server, checked once when it is built."""

from __future__ import annotations

import hmac
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from lighthouse.errors import OptionsError
from lighthouse.membership import MembershipOptions

TOKEN_ENV = "REPLICAFT_TOKEN"
"""The shared secret; the only environment variable the lighthouse reads (in ``from_env``)."""

TOKEN_METADATA_KEY = "x-replicaft-token"


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
    tick_s: float = 0.02
    """How often time-based rules (heartbeat, progress and join deadlines) are evaluated.

    Event-driven transitions (a join, a session closing) are decided at once; the tick only
    bounds how late a deadline is noticed, so 20 ms keeps that error far below the deadlines.
    """

    def __post_init__(self) -> None:
        for name in ("port", "status_port"):
            value = getattr(self, name)
            if value is not None and not 0 <= value <= 65535:
                raise OptionsError(f"{name}={value} is not a TCP port; use 0..65535 (0 = any free)")
        if not 0 < self.tick_s <= 1.0:
            raise OptionsError(f"tick_s={self.tick_s}; use a value in (0, 1]")
        if self.tick_s * 5 > self.membership.heartbeat_timeout_s:
            raise OptionsError(
                f"tick_s={self.tick_s} is too coarse for heartbeat_timeout_s="
                f"{self.membership.heartbeat_timeout_s}; use a tick at most a fifth of it"
            )
        if self.token is not None and not self.token:
            raise OptionsError("token is empty; pass a non-empty token or none at all")

    @staticmethod
    def token_from_env(environ: Mapping[str, str] = os.environ) -> str | None:
        return environ.get(TOKEN_ENV) or None
