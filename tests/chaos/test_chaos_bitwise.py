"""Invariant bitwise_equal_to_reference (chaos/bitwise.py) over hand-written event logs."""

from __future__ import annotations

from typing import Any

import pytest

from chaos.bitwise import BITWISE_EQUAL, check_bitwise_equal, step_digests
from chaos.scenario import ScenarioError, scenario_from_dict

GROUPS = ("g0", "g1", "g2")


def committed(group: str, step: int, digest: str, ts: float | None = None, rank: int = 0) -> dict[str, Any]:
    return {
        "ts": float(step) if ts is None else ts,
        "event": "committed",
        "step": step,
        "quorum_id": 1,
        "replica_id": group,
        "group_rank": rank,
        "digest": digest,
    }


def run(steps: int, digest_of: Any = lambda step: f"d{step}", groups: tuple[str, ...] = GROUPS) -> list[dict[str, Any]]:
    return [committed(g, step, digest_of(step)) for step in range(1, steps + 1) for g in groups]


REFERENCE = step_digests(run(10))


def test_run_with_the_reference_states_holds() -> None:
    v = check_bitwise_equal(run(10, groups=("g0", "g2")), REFERENCE, deterministic=True, target_steps=10)
    assert v.status == "held"
    assert "10 (step, rank) digests compared" in v.note and "final step 10 included" in v.note


def test_perturbed_run_is_violated_at_each_differing_step() -> None:
    perturbed = run(10, lambda step: f"d{step}" if step < 7 else f"x{step}")
    v = check_bitwise_equal(perturbed, REFERENCE, deterministic=True, target_steps=10)
    assert v.status == "violated"
    assert [(x.invariant, x.step) for x in v.violations] == [
        (BITWISE_EQUAL, 7),
        (BITWISE_EQUAL, 8),
        (BITWISE_EQUAL, 9),
        (BITWISE_EQUAL, 10),
    ]
    assert "the fault-free run's is d10" in v.violations[-1].detail


def test_run_that_stops_short_of_the_final_step_is_violated() -> None:
    v = check_bitwise_equal(run(8), REFERENCE, deterministic=True, target_steps=10)
    assert v.status == "violated"
    assert "this run reported no digest for the final step 10 (last: 8)" in v.violations[0].detail


def test_redone_steps_after_a_resume_from_disk_replace_the_lost_ones() -> None:
    events = run(6, lambda step: f"d{step}" if step < 5 else f"lost{step}")
    events += [committed(g, step, f"d{step}", ts=100.0 + step) for step in range(5, 11) for g in GROUPS]
    assert (
        check_bitwise_equal(events, REFERENCE, deterministic=True, target_steps=10, epoch_starts=(50.0,)).status
        == "held"
    )
    assert check_bitwise_equal(events, REFERENCE, deterministic=True, target_steps=10).status == "violated"


def test_not_checked_without_the_mode_or_a_reference() -> None:
    assert check_bitwise_equal(run(10), REFERENCE, deterministic=False, target_steps=10).status == "not_checked"
    assert check_bitwise_equal(run(10), None, deterministic=True, target_steps=10).status == "not_checked"


def test_many_differing_steps_are_counted_not_all_listed() -> None:
    v = check_bitwise_equal(run(10, lambda step: f"x{step}"), REFERENCE, deterministic=True, target_steps=10)
    assert len(v.violations) == 5 and "10 differ, the first 5 reported" in v.note


def test_standing_digest_is_the_majority_of_the_latest_epoch() -> None:
    events = [committed("g0", 1, "a"), committed("g1", 1, "a"), committed("g2", 1, "b")]
    assert step_digests(events) == {(1, 0): "a"}


def test_deterministic_scenario_needs_a_shard_per_group_and_a_divisible_batch() -> None:
    with pytest.raises(ScenarioError, match="virtual_shards=2, global_batch=48 with groups=3"):
        scenario_from_dict({"name": "d", "groups": 3, "deterministic": True, "virtual_shards": 2})
    with pytest.raises(ScenarioError, match="global batch that the shards divide"):
        scenario_from_dict({"name": "d", "deterministic": True, "virtual_shards": 5, "global_batch": 48})
