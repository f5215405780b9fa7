"""When to save and whether the disk can take it (replicaft/checkpoint/policy.py). Pure, fake clock."""

from __future__ import annotations

import pytest

from replicaft.checkpoint.policy import enough_space, estimate_checkpoint_bytes, should_save
from replicaft.errors import OptionsError

SAVE_CASES = [
    # (step, now, last step, last time, interval_steps, interval_s, in progress, action, reason fragment)
    pytest.param(500, 99.0, 0, 0.0, 0, 0.0, False, "not_due", "disabled", id="both_intervals_zero_disabled"),
    pytest.param(
        100,
        0.0,
        0,
        0.0,
        100,
        0.0,
        False,
        "save",
        "crossed a multiple of interval_steps=100",
        id="step_multiple_reached",
    ),
    pytest.param(99, 0.0, 0, 0.0, 100, 0.0, False, "not_due", "no interval", id="step_multiple_not_reached"),
    pytest.param(410, 0.0, 390, 0.0, 100, 0.0, False, "save", "since step 390", id="heal_jumped_over_the_multiple"),
    pytest.param(450, 0.0, 401, 0.0, 100, 0.0, False, "not_due", "no interval", id="same_interval_as_last_save"),
    pytest.param(400, 0.0, 400, 0.0, 100, 0.0, False, "not_due", "not after the last save point", id="same_step_twice"),
    pytest.param(300, 0.0, 400, 0.0, 100, 0.0, False, "not_due", "not after", id="step_went_back_after_restart"),
    pytest.param(
        7, 60.0, 3, 0.0, 0, 60.0, False, "save", "60.0s since the last save point", id="time_interval_elapsed"
    ),
    pytest.param(7, 59.9, 3, 0.0, 0, 60.0, False, "not_due", "no interval", id="time_interval_not_elapsed"),
    pytest.param(7, 61.0, 3, 0.0, 100, 60.0, False, "save", "interval_s=60", id="either_trigger_suffices"),
    pytest.param(200, 0.0, 100, 0.0, 100, 0.0, True, "skip", "still being written", id="due_while_saving_is_skipped"),
    pytest.param(150, 0.0, 100, 0.0, 100, 0.0, True, "not_due", "no interval", id="not_due_while_saving_is_not_a_skip"),
]


@pytest.mark.parametrize(
    ("step", "now", "last_step", "last_time", "interval_steps", "interval_s", "in_progress", "action", "fragment"),
    SAVE_CASES,
)
def test_should_save_table(
    step: int,
    now: float,
    last_step: int,
    last_time: float,
    interval_steps: int,
    interval_s: float,
    in_progress: bool,
    action: str,
    fragment: str,
) -> None:
    decision = should_save(
        step=step,
        now=now,
        last_saved_step=last_step,
        last_saved_time=last_time,
        interval_steps=interval_steps,
        interval_s=interval_s,
        save_in_progress=in_progress,
    )
    assert decision.action == action
    assert fragment in decision.reason
    assert decision.save == (action == "save")


def test_skip_reason_says_training_is_not_blocked() -> None:
    decision = should_save(
        step=200,
        now=0.0,
        last_saved_step=100,
        last_saved_time=0.0,
        interval_steps=100,
        interval_s=0.0,
        save_in_progress=True,
    )
    assert decision.reason.startswith("checkpoint of step 200 due")
    assert "rather than blocking training" in decision.reason


@pytest.mark.parametrize(
    ("interval_steps", "interval_s", "field"), [(-1, 0.0, "interval_steps=-1"), (0, -2.0, "interval_s=-2.0")]
)
def test_negative_interval_rejected_with_the_value(interval_steps: int, interval_s: float, field: str) -> None:
    with pytest.raises(OptionsError, match=field):
        should_save(
            step=1,
            now=0.0,
            last_saved_step=0,
            last_saved_time=0.0,
            interval_steps=interval_steps,
            interval_s=interval_s,
            save_in_progress=False,
        )


SPACE_CASES = [
    # (free, estimated, margin, ok, required)
    pytest.param(1000, 1000, 0.0, True, 1000, id="exactly_enough_without_margin"),
    pytest.param(999, 1000, 0.0, False, 1000, id="one_byte_short"),
    pytest.param(1100, 1000, 0.1, True, 1100, id="margin_met"),
    pytest.param(1099, 1000, 0.1, False, 1100, id="margin_not_met"),
    pytest.param(0, 0, 0.5, True, 0, id="empty_state_fits_anywhere"),
]


@pytest.mark.parametrize(("free", "estimated", "margin", "ok", "required"), SPACE_CASES)
def test_enough_space_table(free: int, estimated: int, margin: float, ok: bool, required: int) -> None:
    decision = enough_space(free, estimated, margin)
    assert (decision.ok, decision.required_bytes) == (ok, required)


def test_not_enough_space_reason_gives_needed_and_free_bytes() -> None:
    decision = enough_space(2_000_000, 3_000_000, 0.1)
    assert decision.reason == "needs 3300000 bytes (3000000 estimated + 10% margin) but only 2000000 are free"


def test_negative_margin_rejected() -> None:
    with pytest.raises(OptionsError, match="margin=-0.1"):
        enough_space(10, 1, -0.1)


def test_estimate_grows_with_tensor_bytes_count_and_skeleton() -> None:
    base = estimate_checkpoint_bytes(num_tensor_bytes=0, num_tensors=0, num_skeleton_bytes=0)
    assert estimate_checkpoint_bytes(num_tensor_bytes=10, num_tensors=0, num_skeleton_bytes=0) == base + 10
    assert estimate_checkpoint_bytes(num_tensor_bytes=0, num_tensors=2, num_skeleton_bytes=5) > base + 5
