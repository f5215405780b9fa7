"""Retention (replicaft/checkpoint/retention.py): newest K plus milestones, never the newest."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from replicaft.checkpoint.retention import decide_retention
from replicaft.errors import OptionsError

CASES = [
    # (published steps, keep_last, milestone_every, expected deleted)
    pytest.param([], 3, 0, [], id="nothing_published_nothing_deleted"),
    pytest.param([100, 200], 3, 0, [], id="fewer_than_keep_last_all_kept"),
    pytest.param([100, 200, 300, 400, 500], 2, 0, [100, 200, 300], id="keeps_newest_k"),
    pytest.param([100, 200, 300, 400, 500], 2, 200, [100, 300], id="keeps_milestones_outside_recent_window"),
    pytest.param([500, 100, 300, 200, 400], 2, 200, [100, 300], id="input_order_does_not_matter"),
    pytest.param([100, 100, 200, 300], 1, 0, [100, 200], id="duplicates_count_once"),
    pytest.param([100, 200, 300], 0, 0, [100, 200], id="keep_last_zero_still_keeps_newest"),
    pytest.param([100, 200, 300], 0, 100, [], id="keep_last_zero_keeps_milestones"),
    pytest.param([1000, 1100, 1200, 2000], 1, 1000, [1100, 1200], id="newest_is_milestone"),
    pytest.param([0, 50, 100], 1, 1000, [50], id="step_zero_is_a_milestone"),
    pytest.param([7], 0, 0, [], id="single_checkpoint_never_deleted"),
]


@pytest.mark.parametrize(("steps", "keep_last", "milestone_every", "deleted"), CASES)
def test_retention_table(steps: list[int], keep_last: int, milestone_every: int, deleted: list[int]) -> None:
    decision = decide_retention(steps, keep_last=keep_last, milestone_every=milestone_every)
    assert list(decision.delete) == deleted
    assert sorted(set(decision.keep) | set(decision.delete)) == sorted(set(steps))
    assert not set(decision.keep) & set(decision.delete)


def test_retention_reason_names_kept_milestones_and_deleted_steps() -> None:
    decision = decide_retention([100, 200, 300, 400, 500], keep_last=2, milestone_every=200)
    assert decision.reason == "keep newest 2 [400, 500] and milestones every 200 [200]; delete [100, 300]"


@pytest.mark.parametrize(("keep_last", "milestone_every", "field"), [(-1, 0, "keep_last=-1"), (1, -5, "milestone_every=-5")])
def test_negative_options_rejected_with_the_value(keep_last: int, milestone_every: int, field: str) -> None:
    with pytest.raises(OptionsError, match=field):
        decide_retention([1, 2], keep_last=keep_last, milestone_every=milestone_every)


@given(
    steps=st.lists(st.integers(0, 10_000), max_size=30),
    keep_last=st.integers(0, 10),
    milestone_every=st.integers(0, 500),
)
def test_retention_never_deletes_newest_recent_or_milestones(steps: list[int], keep_last: int, milestone_every: int) -> None:
    decision = decide_retention(steps, keep_last=keep_last, milestone_every=milestone_every)
    if steps:
        assert max(steps) in decision.keep
    recent = sorted(set(steps))[-keep_last:] if keep_last else []
    assert set(recent) <= set(decision.keep)
    assert all(milestone_every == 0 or s % milestone_every for s in decision.delete)
    assert len(decision.keep) <= max(keep_last, 1) + sum(1 for s in set(steps) if milestone_every and s % milestone_every == 0)
