"""The non-blocking heal's bookkeeping (replicaft/heal/catchup.py, healer.py): pure, no processes."""

from __future__ import annotations

import concurrent.futures

import torch

from lighthouse.plan import plan_step
from lighthouse.protocol import Member, Quorum
from replicaft.heal.catchup import CatchUp
from replicaft.heal.healer import donors_own_step_s


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
    junk = Quorum.of(4, 1, 0.0, [member("a", 9, float("nan")), member("b", 9, True), member("c", 2, -1.0),
                                 Member("d", "host-d", 9, 1, {"ranks": "none"})])
    assert donors_own_step_s(plan_step(junk, "c"), 0) is None
