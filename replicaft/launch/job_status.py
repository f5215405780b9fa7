"""The launcher's one-line job status, from the groups' structured events. Pure.

The status reads the event logs (``replicaft.telemetry.events``), never the children's log text.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

GroupState = Literal["running", "waiting", "done", "down"]
"""running: its process is up; waiting: it died and restarts after the delay; done: it exited
0; down: it failed more often than --max-restarts allows and stays down."""


@dataclass(frozen=True, slots=True)
class GroupStatus:
    replica_id: str
    state: GroupState
    num_restarts: int
    step: int | None
    """The step after its last commit, from its events; None before the first."""


def render_status(groups: Sequence[GroupStatus], *, num_replicas: int | None, elapsed_s: float) -> str:
    """One line: elapsed time, furthest step, last quorum size, groups per state, restarts."""
    steps = [g.step for g in groups if g.step is not None]
    counts = Counter(g.state for g in groups)
    states = ", ".join(f"{counts[s]} {s}" for s in ("running", "waiting", "done", "down") if counts[s])
    restarted = " ".join(f"{g.replica_id}:{g.num_restarts}" for g in groups if g.num_restarts)
    return (
        f"{elapsed_s:.0f}s | step {max(steps) if steps else '-'} | quorum "
        f"{num_replicas if num_replicas is not None else '-'}"
        f" | groups {states} | restarts {sum(g.num_restarts for g in groups)}"
        + (f" ({restarted})" if restarted else "")
    )


class EventProgress:
    """What the event logs have said so far: each group's step and the last quorum's size."""

    def __init__(self) -> None:
        self.steps: dict[str, int] = {}
        self.num_replicas: int | None = None
        self._quorum_ts = float("-inf")

    def apply(self, event: Mapping[str, Any]) -> None:
        """Fold one event in; events of other kinds, or missing the fields used, change nothing."""
        kind, replica_id, step = event.get("event"), event.get("replica_id"), event.get("step")
        ts, num_replicas = event.get("ts"), event.get("num_replicas")
        if kind == "commit" and event.get("committed") and isinstance(replica_id, str) and isinstance(step, int):
            # The latest commit, not the highest: a restarted group starts again from 0.
            self.steps[replica_id] = step
        elif (
            kind == "quorum"
            and isinstance(ts, (int, float))
            and isinstance(num_replicas, int)
            and ts >= self._quorum_ts
        ):
            self._quorum_ts = ts
            self.num_replicas = num_replicas
