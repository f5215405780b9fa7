"""The non-blocking heal's bookkeeping (replicaft/heal/catchup.py, healer.py): no processes."""

from __future__ import annotations

import concurrent.futures
import time

import pytest
import torch

from lighthouse.rules.plan import StepPlan, plan_step
from lighthouse.wire.protocol import Member, Quorum
from replicaft.config.options import ManagerOptions
from replicaft.errors import HealError
from replicaft.heal.catchup import CatchUp
from replicaft.heal.healer import ETA_SLACK, Healer, donors_own_step_s, fetch_wait_s
from replicaft.state.registry import StateRegistry, StepHooks
from replicaft.transfer.client import HealResult
from replicaft.transfer.progress import FetchProgress


def test_a_tensor_written_while_it_was_received_in_place_is_named() -> None:
    weight, moment = torch.zeros(10), torch.zeros(10)
    targets = {"state.model.w": weight, "state.optimizer.m": moment}
    cu = CatchUp(3, concurrent.futures.Future(), targets=targets, versions={n: t._version for n, t in targets.items()})
    weight.add_(1.0)  # e.g. a module updating a large buffer in its forward
    assert cu.written_meanwhile(frozenset(targets)) == ["state.model.w"]
    assert cu.written_meanwhile(frozenset({"state.optimizer.m"})) == []  # received elsewhere: no matter


def test_recorded_steps_must_lead_from_the_base_to_the_donors_step() -> None:
    cu = CatchUp(10, concurrent.futures.Future())
    assert cu.record(10, ["step 10"]) == "recorded" and cu.record(11, ["step 11"]) == "recorded"
    assert cu.record(13, ["a step the donors did not commit after 11"]) == "does not follow"
    assert cu.leads_to(12) and not cu.leads_to(13)


def test_small_records_go_past_the_step_count_large_ones_stop_at_it() -> None:
    small = CatchUp(0, concurrent.futures.Future(), max_records=16, max_record_bytes=1000)
    for step in range(16 + 5):  # 40 bytes a step: the byte budget allows more
        assert small.record(step, [[torch.zeros(10)]]) == "recorded"
    large = CatchUp(0, concurrent.futures.Future(), max_records=16, max_record_bytes=1000)
    for step in range(16):  # always allowed, whatever their size
        assert large.record(step, [[torch.zeros(100)], {"buffers": (torch.zeros(5),)}]) == "recorded"
    assert large.record_bytes == 16 * 420
    assert large.record(16, [[torch.zeros(100)]]) == "full"


def test_a_healer_bounds_its_wait_by_the_shortest_own_step_its_donors_published() -> None:
    """The healer's wait for its fetch holds its donors, so it is bounded by their own time
    (manager.HEAL_WAIT_FRACTION); what they published came over the wire, so junk is ignored."""

    def member(rid: str, step: int, *own: object) -> Member:
        return Member(rid, f"host-{rid}", step, len(own), {"ranks": [{"own_step_s": v} for v in own]})

    q = Quorum.of(4, 1, 0.0, [member("a", 9, 0.8, 0.3), member("b", 9, 0.5, "fast"), member("c", 2, 0.01, 0.01)])
    plan = plan_step(q, "c")
    assert plan.donors == ("a", "b")
    assert donors_own_step_s(plan, 0) == 0.5  # the healer's own published time does not count
    assert donors_own_step_s(plan, 1) == 0.3
    junk = Quorum.of(
        4,
        1,
        0.0,
        [
            member("a", 9, float("nan")),
            member("b", 9, True),
            member("c", 2, -1.0),
            Member("d", "host-d", 9, 1, {"ranks": "none"}),
        ],
    )
    assert donors_own_step_s(plan_step(junk, "c"), 0) is None


class _RecordingHealer(Healer):
    """A healer whose fetch records that it ran instead of reaching donors (no processes)."""

    def __init__(self, registry: StateRegistry) -> None:
        super().__init__(ManagerOptions(lighthouse="127.0.0.1:1", replica_id="c"), registry, lambda *_, **__: None)
        self.fetched_at: list[str] = []

    def _fetch(self, *args: object) -> HealResult:
        self.fetched_at.append("fetch")
        raise HealError("no donors in this test")


class _SyncHooks(StepHooks):
    fetch_beside_collectives = False


def _healing_plan() -> StepPlan:
    return plan_step(Quorum.of(4, 1, 0.0, [Member("a", "host-a", 9, 1, {}), Member("c", "host-c", 2, 1, {})]), "c")


def test_a_hook_that_keeps_fetches_off_the_collectives_defers_the_fetch_to_the_steps_end_issue_21() -> None:
    """DiLoCo's sync all-reduce and a heal's fetch share the healer's link: the donors waited
    for both, so the fetch starts only once the step's collectives are over."""
    registry = StateRegistry()
    registry.register_hooks(_SyncHooks())
    healer = _RecordingHealer(registry)
    try:
        assert healer.begin(_healing_plan(), withdrawn=lambda base: False)
        assert not healer.begin(_healing_plan(), withdrawn=lambda base: False)  # the same catch-up, still deferred
        assert healer.fetching and healer.fetched_at == []
        assert healer.start_deferred()
        healer.wait(_healing_plan(), own_s=10.0)  # bounded by 10 s: the fetch runs on the heal thread
        assert healer.fetched_at == ["fetch"] and isinstance(healer.ready(_healing_plan()), HealError)
        assert not healer.start_deferred()
    finally:
        healer.close()


def test_a_heal_at_step_0_fetches_beside_the_first_sync_even_with_such_a_hook_issue_21() -> None:
    """Nothing was trained before step 0: a group joining there (init_sync) takes the weights
    with the first sync and commits it with the others, as torchft's programs count on."""
    registry = StateRegistry()
    registry.register_hooks(_SyncHooks())
    healer = _RecordingHealer(registry)
    at_start = plan_step(
        Quorum.of(4, 1, 0.0, [Member("a", "host-a", 0, 1, {}), Member("c", "host-c", 0, 1, {})]), "c"
    ).with_one_donor()
    try:
        assert healer.begin(at_start, withdrawn=lambda base: False)
        healer.wait(at_start, own_s=10.0)
        assert healer.fetched_at == ["fetch"] and not healer.start_deferred()
    finally:
        healer.close()


def test_without_such_a_hook_the_fetch_starts_with_the_plan() -> None:
    healer = _RecordingHealer(StateRegistry())
    try:
        assert healer.begin(_healing_plan(), withdrawn=lambda base: False)
        healer.wait(_healing_plan(), own_s=10.0)
        assert healer.fetched_at == ["fetch"] and not healer.start_deferred()
    finally:
        healer.close()


def test_a_fetch_about_to_arrive_is_waited_for_beyond_the_donors_own_time() -> None:
    """healer.fetch_wait_s: the donors' own time bounds the wait, unless the fetch is expected
    within the healer's own time; then up to ETA_SLACK times its estimate, never past own."""
    own, donors = 0.30, 0.05
    assert fetch_wait_s(own, donors, None) == donors  # no estimate yet
    assert fetch_wait_s(own, None, None) == own  # no donor published its time
    assert fetch_wait_s(own, donors, 0.01) == donors  # twice the estimate is within the bound anyway
    assert fetch_wait_s(own, donors, 0.08) == ETA_SLACK * 0.08
    assert fetch_wait_s(own, donors, 0.25) == own  # the slack is cut at the healer's own time
    assert fetch_wait_s(own, donors, 0.31) == donors  # not about to arrive: the donors' bound
    assert fetch_wait_s(own, 1.0, 0.5) == own  # faster donors never lengthen it past own


def test_fetch_progress_estimates_the_rest_at_the_rate_so_far() -> None:
    progress = FetchProgress()
    assert progress.eta_s() is None  # not begun
    progress.begin(1000)
    assert progress.eta_s() is None  # no chunk yet: no rate
    began = time.monotonic()
    progress.add(250)
    assert progress.eta_s(began + 1.0) == pytest.approx(3.0, rel=0.01)  # 750 bytes at ~250 B/s
    progress.add(750)
    assert progress.eta_s(began + 1.0) == 0.0
