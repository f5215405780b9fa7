"""The history guard: a quorum never forms behind a member that holds later committed steps.

Every member of a quorum starts its step at the quorum's ``max_step``: the members behind it
heal to it. A quorum formed of members that are all behind another member, one that is alive
or may come back, starts a second history of the steps that member already committed: both
are committed, and when the two meet, one heals to the other and the loser's steps are undone
(data consumed twice, digests that differ at one step). The majority guard (quorum.py) rules
this out where ``min_replicas`` is a majority; below one it happened. Ray Train's own torchft
example runs with ``min_replicas=1``: under load both of its two survivors were declared hung
within a second (tests/replicaft/ray/test_ray.py); the first, alone in its quorum, committed
steps 577 to 586 and froze, then the second came back at step 576, alone too, and formed a
quorum there; ten steps later the first healed to the second's 605, and step 577 had two
histories.

So a quorum that would start below the step of a member outside it waits for that member:

* a healthy member that is not asking (in the middle of its step, say) until it asks; if it
  stops progressing, the progress deadline drops it, and the next rule applies;
* a member declared hung (silent, or not progressing, with its connection open) for
  ``join_timeout_s`` after its loss, the time a straggler is given to join: a SIGSTOPped or
  frozen group that resumes re-registers with its step and joins. After that its later
  steps are given up for lost (as they are when its process died), and a warning says so.

A member that left on purpose is not waited for; one whose stream closed is taken for dead
(SIGKILL, its host gone), its steps with it, so survivors never wait for it; and a restarted
one reports its own step when it registers again. But a quorum that forms behind the step a
member left at (the others finished their run while this one was frozen, say) starts a second
history of steps already committed, and that is said: a warning names the member and both
steps, once. Pure: the callers pass the time.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class LostAt:
    """A member declared hung: the step it had reached and when it was lost."""

    step: int
    lost_at: float


class LostSteps:
    """The steps of members declared hung, kept until they come back or their wait runs out."""

    def __init__(self) -> None:
        self._lost: dict[str, LostAt] = {}
        self._left: dict[str, int] = {}
        """Members that left on purpose, and the step each left at."""

    def left(self, replica_id: str, step: int) -> None:
        self._left[replica_id] = step

    def lost(self, replica_id: str, step: int, now: float) -> None:
        self._lost[replica_id] = LostAt(step, now)

    def back(self, replica_id: str) -> None:
        """The member registered again: its new session reports the step it holds."""
        self._lost.pop(replica_id, None)
        self._left.pop(replica_id, None)

    def holdout(
        self,
        reach: int,
        others: Iterable[tuple[str, int]],
        now: float,
        wait_s: float,
    ) -> str | None:
        """Why a quorum whose members reach ``reach`` must not form now, or None.

        ``others``: the healthy members that are not asking, with their steps. A lost member
        whose wait ran out is forgotten here, with a warning if it was ahead."""
        for rid, step in others:
            if step > reach:
                return (
                    f"waiting for {rid!r}, at step {step}, ahead of every member asking (they reach step {reach}): "
                    "a quorum without it would start a second history of its steps (history.py)"
                )
        for rid, lost in list(self._lost.items()):
            if lost.step <= reach:
                continue
            left_s = lost.lost_at + wait_s - now
            if left_s > 0:
                return (
                    f"waiting up to {left_s:.2f}s more for {rid!r}, lost at step {lost.step}, ahead of every member "
                    f"asking (they reach step {reach}), to come back (join_timeout {wait_s:g}s after its loss)"
                )
            del self._lost[rid]
            logger.warning(
                "replica %s, lost at step %d, did not come back within %gs: forming a quorum at step %d, "
                "its steps after that are given up",
                rid,
                lost.step,
                wait_s,
                reach,
            )
        return None

    def passed(self, reach: int) -> None:
        """A quorum formed at ``reach``: lost members not ahead of it can no longer fork it, and
        one that left ahead of it is named (once) for the second history this quorum starts."""
        self._lost = {rid: lost for rid, lost in self._lost.items() if lost.step > reach}
        for rid, step in sorted(self._left.items()):
            if step > reach:
                logger.warning(
                    "a quorum formed at step %d, behind step %d that replica %s left at: steps %d to %d are "
                    "trained a second time, apart from the history it committed",
                    reach,
                    step,
                    rid,
                    reach + 1,
                    step,
                )
        self._left.clear()
