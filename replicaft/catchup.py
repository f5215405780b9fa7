"""Non-blocking heal: fetch a donor snapshot in the background, replay the steps missed meanwhile.

A healer joins the quorum at once as a zero-contributing participant and fetches the donors'
snapshot of step ``b`` (the base) on a background thread. Donors serve that snapshot from host
memory and keep stepping: nobody waits for the transfer. Until it has arrived and verified,
every step the healer takes part in is *recorded* instead of committed: the averaged
gradient it received, the averaged buffers, and the data it consumed (each hook's
``capture_step``). When the fetch is done, the group applies base state ``b`` and replays the
recorded steps in order (``replay_prepare`` sets the gradients, ``replay_apply`` steps the
optimizer and scheduler, writes buffers, advances the data cursor), which is exactly what the
donors did, so the healer arrives at the donors' step bit for bit and commits the current
step with them.

Why replay rather than refetch a newer snapshot: a refetch races the donors forever when a
transfer takes longer than a step; replaying costs one optimizer step per missed step and
one gradient copy per missed step in memory (bounded by ``max_records``; beyond it the
catch-up restarts from a newer base).

In place: the fetch receives large tensors straight into the healer's own (transfer/placement.py),
which only its optimizer step writes, and that runs only on commit, which a healer does not do
before the heal is applied. Anything else writing them (a module updating a large buffer in
forward, user code) bumps their version counter; ``written_meanwhile`` catches it and the
heal is redone with those tensors received into new memory.

Safety: a recorded step is replayed only if the donors committed it, which the healer checks
when applying: ``base + len(records)`` must equal the quorum's ``max_step``; otherwise (the
donors aborted a step the healer recorded, e.g. they were fenced) the catch-up is discarded
and restarted. Nothing is applied until the whole snapshot verified.
"""

from __future__ import annotations

import concurrent.futures
from dataclasses import dataclass, field
from typing import Any

import torch

from replicaft.transfer.client import HealResult

MAX_RECORDS = 16
"""Steps recorded before the catch-up gives up and restarts from a newer base (memory bound:
one gradient copy per step)."""


@dataclass
class CatchUp:
    base_step: int
    future: concurrent.futures.Future[HealResult]
    records: list[list[Any]] = field(default_factory=list)
    targets: dict[str, torch.Tensor] = field(default_factory=dict)
    """The healer's own tensors the fetch may receive into in place, by manifest name."""
    versions: dict[str, int] = field(default_factory=dict)
    """Their version counters when the fetch started."""

    def written_meanwhile(self, in_place: frozenset[str]) -> list[str]:
        """Tensors received in place that the healer's own steps wrote while the fetch ran:
        their received bytes may have been overwritten, so the heal must not be applied."""
        return sorted(n for n in in_place if self.targets[n]._version != self.versions[n])

    @property
    def fetched(self) -> bool:
        return self.future.done()

    def leads_to(self, max_step: int) -> bool:
        """Whether base + recorded steps reach the donors' current step exactly."""
        return self.base_step + len(self.records) == max_step

    def record(self, max_step: int, captured: list[Any]) -> bool:
        """Record the step the donors are taking at ``max_step``; False if it does not follow."""
        if not self.leads_to(max_step) or len(self.records) >= MAX_RECORDS:
            return False
        self.records.append(captured)
        return True
