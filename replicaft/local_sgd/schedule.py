"""When each fragment of a (streaming) DiLoCo model syncs: a pure function of the step.

A sync is one manager step (quorum, all-reduce, commit), so the manager's committed step
names the sync and travels with a heal: the schedule needs no state of its own. Step 0 is the
*join* sync: it carries no pseudo-gradient but the first contributor's weights, so every
group starts from the same ones; step ``s >= 1`` syncs fragment ``(s - 1) % F``.

With ``F`` fragments and ``sync_every = H``, a sync falls every ``H / F`` inner steps, so each
fragment still syncs every ``H`` inner steps (Streaming DiLoCo, arXiv 2501.18512). A sync
*starts* ``fragment_sync_delay`` inner steps before it is due (its all-reduce runs under
those inner steps) and is committed when due; the delay must end before the next sync starts.
"""

from __future__ import annotations

from dataclasses import dataclass

from replicaft.errors import OptionsError


@dataclass(frozen=True, slots=True)
class SyncSchedule:
    sync_every: int
    """Inner steps between two syncs of the same fragment (DiLoCo's H)."""
    num_fragments: int = 1
    fragment_sync_delay: int = 0
    """Inner steps a fragment's all-reduce overlaps before its sync commits (the paper's tau)."""

    def __post_init__(self) -> None:
        if self.sync_every < 1:
            raise OptionsError(f"sync_every={self.sync_every}; DiLoCo syncs every H >= 1 inner steps")
        if self.num_fragments < 1:
            raise OptionsError(f"{self.num_fragments} model fragments; pass at least one module")
        if self.sync_every % self.num_fragments:
            evenly = self.sync_every // self.num_fragments * self.num_fragments or self.num_fragments
            raise OptionsError(
                f"sync_every={self.sync_every} is not a multiple of the {self.num_fragments} fragments, so the "
                f"fragments cannot sync at evenly spaced steps; use sync_every={evenly} or change the fragment count"
            )
        if not 0 <= self.fragment_sync_delay < self.interval:
            raise OptionsError(
                f"fragment_sync_delay={self.fragment_sync_delay} must be >= 0 and below the {self.interval} inner "
                f"steps between two syncs (sync_every={self.sync_every} / {self.num_fragments} fragments), or one "
                "fragment's sync would still run when the next starts"
            )

    @property
    def interval(self) -> int:
        """Inner steps between two consecutive syncs (of different fragments)."""
        return self.sync_every // self.num_fragments

    @property
    def start_at(self) -> int:
        """Inner steps after the last committed sync at which the next sync starts."""
        return self.interval - self.fragment_sync_delay

    def fragment_of(self, step: int) -> int | None:
        """The fragment the sync at manager step ``step`` carries; None for the join sync."""
        if step < 0:
            raise ValueError(f"step={step}; manager steps are >= 0")
        return None if step == 0 else (step - 1) % self.num_fragments
