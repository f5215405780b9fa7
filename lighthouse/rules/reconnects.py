"""The restart grace: a lighthouse that replaced another waits for the last quorum's members.

A member reporting a previous quorum id means this incarnation replaced another. Its peers
reconnect with backoff, and a first quorum formed without them could commit a step some of
them had already committed in the previous incarnation, making two different histories of
one step that nobody would heal. So the first quorum of a restarted lighthouse waits for the
members of the last quorum, and only for them: each member reports the last quorum it was in
(its id and, while it knows of nothing after it, its replica ids: ``Register.last_quorum_members``),
and the quorum with the highest id reported is the last one. Once every member it listed has
registered and asks to join, the first quorum forms at once; a member that is missing is waited
for ``join_timeout_s`` after the first reporter registered (at a fresh start nobody reports an
id, and nothing waits).

Why the highest id is enough. Quorum ids only grow, so a member reporting a lower id was left
out of that quorum: it is behind, and the first quorum heals it (history.py keeps a quorum from
forming behind a member holding later steps). A later quorum that committed a step had every
one of its members hold it, and they would report it: it can be missing from the reports only
if every member of the highest one reported was left out of it. A member left out because its
session ended (dropped, its stream broken) registered again since, and then reports the id
alone (lighthouse/client/last_quorum.py); when no reporter of the highest id names its members,
the grace waits the join timeout as it always did, and so it does when reports of one id name
different members (they cannot both be true). What no report shows is a last quorum whose
members were all left out with their sessions open, and told of it too late or not at all (all
of them stragglers beyond the join timeout, or all declared hung while stopped, the lighthouse
dying before they read their ``fenced`` notice) while other members went on: the first quorum
may then form before those others are back. It takes every member of the last quorum stalled or
hung and the lighthouse killed before they hear of it, two faults at once.

A replicated lighthouse's new leader knows the last quorum's members from etcd
(:meth:`ReconnectGrace.restore`), so it waits only until those have registered again, or the
same timeout for one that is gone.

Never before ``max_commit_lease_s`` after the first reporter registered: a commit lease the
dead incarnation granted may still run (commit_lease.py), and this one knows none of them.
Pure: the callers pass the time.
"""

from __future__ import annotations

from collections.abc import Collection


class ReconnectGrace:
    """Whether the first quorum of this incarnation must still wait for reconnecting members."""

    def __init__(self, join_timeout_s: float, max_commit_lease_s: float) -> None:
        self.grace_s = max(join_timeout_s, max_commit_lease_s)
        self._join_timeout_s = join_timeout_s
        self._max_commit_lease_s = max_commit_lease_s
        self._reconnecting_since: float | None = None
        """When the first member of a previous incarnation's quorum registered (restart only)."""
        self._last_id = -1
        """The highest quorum id a member reported."""
        self._last_members: tuple[str, ...] | None = None
        """The members of quorum ``_last_id`` (sorted) as its reporters named them; None: unknown or disputed."""
        self._disputed = False
        """Reporters of ``_last_id`` named different members: none of their lists is trusted."""
        self._restored: tuple[str, ...] | None = None
        """A replicated lighthouse's new leader: the last quorum's members (sorted), as etcd recorded them."""
        self._restored_at = 0.0

    def restore(self, last_quorum: tuple[str, ...] | None, now: float) -> None:
        """Take over from a replicated lighthouse's previous leader, which last formed ``last_quorum``
        (none recorded: wait as a restarted single lighthouse does)."""
        if last_quorum is not None:
            self._restored = tuple(sorted(last_quorum))
            self._restored_at = now

    def registered(self, last_quorum_id: int, last_quorum_members: Collection[str], now: float) -> None:
        """A member registered before this incarnation's first quorum, reporting the last quorum it
        was in: its id, and its members (empty: unknown)."""
        if last_quorum_id < 0:
            return
        if self._reconnecting_since is None:
            self._reconnecting_since = now
        if last_quorum_id > self._last_id:
            self._last_id, self._last_members, self._disputed = last_quorum_id, None, False
        if last_quorum_id < self._last_id or not last_quorum_members or self._disputed:
            return
        members = tuple(sorted(last_quorum_members))
        if self._last_members is None:
            self._last_members = members
        elif members != self._last_members:
            self._last_members, self._disputed = None, True

    def previous(self, current: tuple[str, ...] | None) -> tuple[str, ...] | None:
        """The previous quorum of the rules (quorum.py's fast path): ``current``, this incarnation's
        last; before its first, the last one's members where known (etcd's record, or the reports)."""
        if current is not None:
            return current
        return self._restored if self._restored is not None else self._last_members

    def holdout(self, members: Collection[str], participants: Collection[str], now: float) -> str | None:
        """Why the first quorum must not form yet, with ``members`` registered and ``participants``
        about to form it; None once it may."""
        if self._restored is not None:
            missing = set(self._restored).difference(members)
            if not missing or now - self._restored_at >= self.grace_s:
                return None
            return (
                f"new leader: waiting for the last quorum's members {sorted(missing)} to "
                f"reconnect (at most join_timeout {self._join_timeout_s:g}s) before forming the first quorum"
            )
        if self._reconnecting_since is None:
            return None
        waited_s = now - self._reconnecting_since
        if waited_s >= self.grace_s:
            return None
        last = None if self._last_members is None else set(self._last_members)
        if last is not None and last <= set(participants):
            if waited_s >= self._max_commit_lease_s:
                return None
            return (
                f"this lighthouse restarted: every member of the last quorum {self._last_id} is back; waiting "
                f"{self._max_commit_lease_s - waited_s:.3f}s more for a commit lease the last incarnation granted"
            )
        missing = "its members unknown" if last is None else f"missing {sorted(last - set(participants))}"
        return (
            f"this lighthouse restarted: waiting join_timeout {self._join_timeout_s:g}s for the members of the "
            f"last quorum {self._last_id} to reconnect ({missing}) before forming the first one"
        )
