"""Non-blocking heal: fetch a donor snapshot in the background, replay the steps missed meanwhile.

A healer joins the quorum at once as a zero-contributing participant and fetches the donors'
snapshot of step ``b`` (the base) on a background thread. Donors serve that snapshot from their
live state, keep a host copy of what is still unsent when they step (transfer/live.py), and
keep stepping: nobody waits for the transfer beyond a bounded wait at the step's end
(``Manager``'s ``HEAL_WAIT_FRACTION``). Until it has arrived and verified,
every step the healer takes part in is *recorded* instead of committed: the averaged
gradient it received, the averaged buffers, and the data it consumed (each hook's
``capture_step``). When the fetch is done, the group applies base state ``b`` and replays the
recorded steps in order (``replay_prepare`` sets the gradients, ``replay_apply`` steps the
optimizer and scheduler, writes buffers, advances the data cursor), which is exactly what the
donors did, so the healer arrives at the donors' step bit for bit and commits the current
step with them.

Why replay rather than refetch a newer snapshot: a refetch races the donors forever when a
transfer takes longer than a step; replaying costs one optimizer step per missed step and
one gradient copy per missed step in memory, bounded by ``ManagerOptions.heal_replay_steps``
steps or ``heal_replay_bytes`` bytes (whichever allows more). Beyond both the catch-up restarts
from a newer base, and that next catch-up **holds the donors**: the healer vetoes every step
(the donors abort it, without counting it as a failure) until its fetch has arrived, so it
needs no records at all. That is torchft's blocking heal, as a fallback for state too large,
or links too slow, for replay; it guarantees the heal ends.

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
from typing import Any, Literal

import torch

from replicaft.transfer.client import HealResult
from replicaft.transfer.progress import FetchProgress

Recorded = Literal["recorded", "does not follow", "full"]


@dataclass
class CatchUp:
    base_step: int
    future: concurrent.futures.Future[HealResult]
    records: list[list[Any]] = field(default_factory=list)
    targets: dict[str, torch.Tensor] = field(default_factory=dict)
    """The healer's own tensors the fetch may receive into in place, by manifest name."""
    versions: dict[str, int] = field(default_factory=dict)
    """Their version counters when the fetch started."""
    record_bytes: int = 0
    max_records: int = 16
    """Steps that may always be recorded (one gradient copy each)."""
    max_record_bytes: int = 1 << 30
    """Beyond ``max_records`` steps, more are recorded while all records together stay within
    this many bytes: a count alone made a heal of small state that outlasts 16 fast steps
    restart forever."""
    donors: tuple[str, ...] = ()
    """The donors of the plan the fetch started in (departure.py: whether they all left)."""
    hold: bool = False
    """The donors are held (every step vetoed) until the fetch has arrived: nothing is recorded."""
    progress: FetchProgress = field(default_factory=FetchProgress)
    """The fetch's verified bytes so far: whether it is about to arrive (healer.py's ``wait``)."""

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

    def record(self, max_step: int, captured: list[Any]) -> Recorded:
        """Record the step the donors are taking at ``max_step``, unless it does not follow the
        records or they are full; either way the catch-up must then restart."""
        if not self.leads_to(max_step):
            return "does not follow"
        size = _tensor_bytes(captured)
        if len(self.records) >= self.max_records and self.record_bytes + size > self.max_record_bytes:
            return "full"
        self.records.append(captured)
        self.record_bytes += size
        return "recorded"


def _tensor_bytes(value: Any) -> int:
    """Bytes of every tensor in a nest of lists, tuples and dicts (a hook's capture)."""
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, (list, tuple)):
        return sum(_tensor_bytes(v) for v in value)
    if isinstance(value, dict):
        return sum(_tensor_bytes(v) for v in value.values())
    return 0
