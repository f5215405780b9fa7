"""The restart grace: a lighthouse that replaced another waits for the last quorum's members.

A member reporting a previous quorum id means this incarnation replaced another. Its peers
reconnect with backoff, and a first quorum formed without them could commit a step some of
them had already committed in the previous incarnation, making two different histories of
one step that nobody would heal. So the first quorum of a restarted lighthouse forms only
once ``join_timeout_s`` has passed since the first such member registered (at a fresh start
nobody reports an id, and nothing waits). A replicated lighthouse's new leader knows the last
quorum's members from etcd (:meth:`ReconnectGrace.restore`), so it waits only until those
have registered again, or the same timeout for one that is gone. Never shorter than a commit
lease the last incarnation granted (commit_lease.py). Pure: the callers pass the time.
"""

from __future__ import annotations

from collections.abc import Collection


class ReconnectGrace:
    """Whether the first quorum of this incarnation must still wait for reconnecting members."""

    def __init__(self, join_timeout_s: float, max_commit_lease_s: float) -> None:
        self.grace_s = max(join_timeout_s, max_commit_lease_s)
        self._join_timeout_s = join_timeout_s
        self._reconnecting_since: float | None = None
        """When the first member of a previous incarnation's quorum registered (restart only)."""
        self._restored: frozenset[str] | None = None
        """A replicated lighthouse's new leader: the last quorum's members, as etcd recorded them."""
        self._restored_at = 0.0

    def restore(self, last_quorum: tuple[str, ...] | None, now: float) -> None:
        """Take over from a replicated lighthouse's previous leader, which last formed ``last_quorum``
        (none recorded: wait as a restarted single lighthouse does)."""
        if last_quorum is not None:
            self._restored = frozenset(last_quorum)
            self._restored_at = now

    def registered(self, last_quorum_id: int, now: float) -> None:
        """A member registered before this incarnation's first quorum, reporting the last id it saw."""
        if last_quorum_id >= 0 and self._reconnecting_since is None:
            self._reconnecting_since = now

    def holdout(self, members: Collection[str], now: float) -> str | None:
        """Why the first quorum must not form yet, with ``members`` registered; None once it may."""
        if self._restored is not None:
            if self._restored <= set(members) or now - self._restored_at >= self.grace_s:
                return None
            return (
                f"new leader: waiting for the last quorum's members {sorted(self._restored - set(members))} to "
                f"reconnect (at most join_timeout {self._join_timeout_s:g}s) before forming the first quorum"
            )
        if self._reconnecting_since is None or now - self._reconnecting_since >= self.grace_s:
            return None
        return (
            f"this lighthouse restarted: waiting join_timeout {self._join_timeout_s:g}s for the members of the "
            "last quorum to reconnect before forming the first one"
        )
