"""What a member reports of its last quorum when it registers: the quorum's id and members.

A restarted lighthouse continues quorum ids above every id reported, and forms its first quorum
as soon as every member of the highest one reported is back (lighthouse/rules/reconnects.py).
That is safe only while the quorum's members are all the member knows of what came after it:
once it has registered again with a lighthouse, that lighthouse may have formed quorums without
it (it was dropped, its stream broke), so from then until its next quorum it reports the id
alone, and a restarted lighthouse waits the join timeout for whoever may hold later steps.
"""

from __future__ import annotations

from lighthouse.wire.protocol import Quorum


class LastQuorum:
    """The last quorum this member was in, as it reports it on (re-)registration."""

    def __init__(self) -> None:
        self.quorum_id = -1
        """The highest quorum id seen, reported on every registration (ids never repeat)."""
        self._members: tuple[str, ...] = ()
        self._seen_in_session = 0
        """The session (client session epoch) that was answered with that quorum."""

    def seen(self, quorum: Quorum, session_epoch: int) -> None:
        """The lighthouse answered, on session ``session_epoch``, with ``quorum``."""
        if quorum.quorum_id >= self.quorum_id:
            self.quorum_id, self._members, self._seen_in_session = quorum.quorum_id, quorum.replica_ids, session_epoch

    def report(self, session_epoch: int) -> tuple[int, tuple[str, ...]]:
        """``Register``'s (last_quorum_id, last_quorum_members) after session ``session_epoch``:
        the quorum's members only while no session registered since the one it answered."""
        return self.quorum_id, self._members if session_epoch == self._seen_in_session else ()
