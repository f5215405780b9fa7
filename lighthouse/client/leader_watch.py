"""Leaving a leader of a replicated set whose lease has run out (issue 37, bug 5).

A leader that dies is left at once (its sessions break), and one cut off from etcd ends its
sessions itself when its lease runs out (lighthouse/replicated/server.py). A frozen one
(SIGSTOP, a stalled host) does neither: its members' sessions stay open, the kernel still
acknowledges their bytes, and a member waited for its quorum request to time out, 60 s with
30 s timeouts, although a follower had taken the lead within two seconds.

So the leader tells each member its lease as the session opens and again with every renewal
(``Notice.lease_s``: how long it holds at least, from when it was sent), and the member arms a
timer at each: if no newer lease arrives before the last one runs out, the leader has lost
it by its own clock, the member cancels the session and the client moves on to the next
lighthouse. Before the first lease of a session, the wait for the leader's answer to the
registration is bounded the same way (the last lease's length, at least ``FIRST_ANSWER_S``), so
a reconnect to the frozen leader does not hang either. One timer per renewal, nothing per message.
"""

from __future__ import annotations

import asyncio
import logging

import grpc

logger = logging.getLogger(__name__)

FIRST_ANSWER_S = 2.0
"""The least time a replicated lighthouse has to answer a session's registration."""


class LeaderWatch:
    """Owned by one client, on its event loop; ``lapsed`` says why it cancelled the session."""

    def __init__(self, replica_id: str) -> None:
        self._replica_id = replica_id
        self._lease_s = 0.0
        """The longest lease seen from a leader: how long a new session may wait for its answer."""
        self._timer: asyncio.TimerHandle | None = None
        self._call: grpc.aio.StreamStreamCall | None = None
        self._address = ""
        self.lapsed: str | None = None

    def begin(self, call: grpc.aio.StreamStreamCall, address: str) -> None:
        """A session is opening on ``call`` with the lighthouse at ``address``."""
        self._call, self._address, self.lapsed = call, address, None
        wait_s = max(self._lease_s, FIRST_ANSWER_S)
        self._arm(wait_s, f"did not answer the session's registration within {wait_s:g}s")

    def renewed(self, lease_s: float) -> None:
        """The leader said its lease holds ``lease_s`` longer; 0: it has none (watch no more)."""
        if lease_s <= 0:
            self.end()
            return
        self._lease_s = max(self._lease_s, lease_s)
        self._arm(lease_s, f"renewed no lease within the {lease_s:.2f}s its last one had left")

    def end(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _arm(self, after_s: float, why: str) -> None:
        self.end()
        self._timer = asyncio.get_running_loop().call_later(after_s, self._lapse, why)

    def _lapse(self, why: str) -> None:
        self._timer = None
        self.lapsed = f"the lighthouse at {self._address} {why}"
        logger.warning("%s leaves the leader: %s (frozen or cut off?)", self._replica_id, self.lapsed)
        if self._call is not None:
            self._call.cancel()
