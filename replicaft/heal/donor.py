"""The donor side of a heal: serve this rank's state to the healers of the quorum, live.

A group at the quorum's ``max_step`` with healers in the quorum is a donor. The step driver
(replicaft/step/driver.py) calls this module twice a step, on the training thread:

1. ``serve`` (the plan is applied): publish the snapshot the healers need on this rank's state
   server, served from the live tensors (transfer/live.py: no copy first), and keep serving
   the bases of heals still in progress;
2. ``seal`` (the step's end, before anything writes the state): stop serving from the live
   tensors, after a bounded wait for the healers to be sent the rest; what they have not been
   sent is copied. If the state changed while it was served (user code writing it in place
   during forward or backward), what went out may mix two states: the snapshot is withdrawn,
   and healers fetching it are told through the next quorum request (``rank_data``), before
   any could apply it at a commit (the failed step commits nowhere).

Returns outcomes (the reason a snapshot was withdrawn) and emits the ``serve_end`` event
through the sink it is given; never calls back into the manager.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from lighthouse.rules.plan import StepPlan
from lighthouse.wire.progress import Progress
from replicaft.heal import HEAL_WAIT_FRACTION
from replicaft.process.faults import reached, write_served_due
from replicaft.state.flat import Flat
from replicaft.state.registry import StateRegistry
from replicaft.transfer.live import LiveSnapshot
from replicaft.transfer.server import StateServer
from replicaft.transfer.spare import SpareBuffer

Emit = Callable[..., None]
DRAIN_REPORTED_S = 0.05
"""A drain at stop that waited at least this long is reported (a ``drain`` event)."""


class DonorSide:
    """One rank's donor side. Training thread only."""

    def __init__(
        self,
        replica_id: str,
        group_rank: int,
        registry: StateRegistry,
        server: StateServer,
        spare: SpareBuffer,
        emit: Emit,
        faults: frozenset[tuple[str, int]],
    ) -> None:
        self._replica_id = replica_id
        self._group_rank = group_rank
        self._registry = registry
        self._server = server
        self._spare = spare
        self._emit = emit
        self._faults = faults
        self._serving: LiveSnapshot | None = None
        """The snapshot this step serves from the live state, until sealed."""
        self._withdrawn: int | None = None
        """The step of the last snapshot withdrawn because the state changed while it was served."""

    def rank_data(self) -> dict[str, int]:
        """What this rank tells its healers with its quorum request."""
        return {} if self._withdrawn is None else {"withdrawn": self._withdrawn}

    def withdrew(self, plan: StepPlan, base: int) -> bool:
        """Whether a donor of ``plan`` said it withdrew its snapshot of step ``base`` (a healer's
        question, answered from what the donors published with the quorum)."""
        return any(plan.rank_entry(rid, self._group_rank).get("withdrawn") == base for rid in plan.donors)

    def serve(self, plan: StepPlan, step: int) -> None:
        """Publish the snapshot ``plan``'s healers need; keep serving the bases of heals in
        progress (a healer tells its base with its quorum request, ``heal_base``).

        A step already published is published afresh when a healer starts a fetch of it (one
        that tells no base): sealed, it keeps only the bytes its own healers had not been sent,
        and a donor whose step did not commit meets new healers at the same step (a group
        restarted beside a heal that had just ended was refused every byte and failed its
        first heal; a healer retrying a failed heal would be too). The live state is still that
        step's, so a healer continuing its fetch is sent the same bytes."""
        bases: dict[str, int] = {}
        starting = False
        for rid in plan.healers:
            base = plan.rank_entry(rid, self._group_rank).get("heal_base")
            starting |= not isinstance(base, int)
            bases[rid] = base if isinstance(base, int) else plan.max_step
        if starting or (plan.max_step in bases.values() and plan.max_step not in self._server.published_steps):
            readers = frozenset(rid for rid, base in bases.items() if base == plan.max_step)
            self._serving = LiveSnapshot(
                self._registry.flat(healed_only=True),
                step=plan.max_step,
                quorum_id=plan.quorum_id,
                replica_id=self._replica_id,
                readers=readers,
                spare=self._spare,
            )
            self._server.publish(self._serving)
            reached(self._faults, "serve", step)
            if write_served_due(self._faults, step):
                self._faults = frozenset(p for p in self._faults if p[0] != "write_served")
                _write_largest_optimizer_tensor(self._registry.flat(healed_only=True))
        self._server.retain(set(bases.values()))

    def seal(self, own_s: float) -> str | None:
        """Stop serving from the live state, after waiting up to ``HEAL_WAIT_FRACTION`` of the
        step's own time ``own_s`` for the healers; returns why the snapshot was withdrawn, or None.

        No wait when healers fetch only after the collectives (``StepHooks.fetch_beside_collectives``):
        their fetch starts after this seal, so it is never about to arrive, and waiting (then
        for the sends a fetch begun beside it had in flight) held the donors' DiLoCo sync
        0.5-0.67 s for a copy of 22 MB that takes milliseconds (issue 21)."""
        served, self._serving = self._serving, None
        if served is None:
            return None
        why = served.seal(HEAL_WAIT_FRACTION * own_s if self._registry.fetch_beside_collectives(served.step) else 0.0)
        self._emit(
            "serve_end",
            served_step=served.step,
            readers=sorted(served.readers),
            waited_s=served.waited_s,
            kept_bytes=served.kept_bytes,
            reused_buffer=served.reused_buffer,
            shut=served.shut,
            ok=not why,
            error=why or None,
        )
        if not why:
            if self._withdrawn == served.step:
                self._withdrawn = None  # served again, whole this time
            return None
        self._withdrawn = served.step
        self._server.retain(self._server.published_steps - {served.step})
        return f"snapshot of step {served.step} withdrawn from healers: {why}"

    def drain(self, timeout_s: float, gone: Callable[[], frozenset[str]], progress: Progress) -> None:
        """Before the rank stops: keep serving, up to ``timeout_s``, until every healer still
        expected has been sent its state or is ``gone()`` (its session ended); see
        ``StateServer.drain``. A healer abandoned here fails its heal, as if this donor died.
        Each look records ``progress``: the heartbeats must say the rank progresses meanwhile,
        or the progress deadline fences it (it did, serving a slow healer for 10 s)."""

        def polled() -> frozenset[str]:
            progress.record(progress.step)
            return gone()

        started = time.monotonic()
        abandoned = self._server.drain(started + timeout_s, polled)
        waited_s = time.monotonic() - started
        if abandoned or waited_s >= DRAIN_REPORTED_S:
            self._emit("drain", waited_s=round(waited_s, 3), abandoned=sorted(abandoned))


def _write_largest_optimizer_tensor(flat: Flat) -> None:
    """The ``write_served`` fault (faults.py): state written in place while it is served."""
    candidates = [
        t
        for n, t in zip(flat.names, flat.tensors, strict=True)
        if n.startswith("state.optimizer") and t.is_floating_point()
    ]
    if candidates:
        with torch.no_grad():
            max(candidates, key=torch.Tensor.numel).add_(1.0)
