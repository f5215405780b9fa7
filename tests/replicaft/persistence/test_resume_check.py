"""Resume verification (replicaft/persistence/resume_check.py): the verdict as a table, then the shell
that records the trajectory and judges a resume, driven step by step with fakes."""

from __future__ import annotations

from typing import Any

import pytest

from replicaft.checkpoint.labels import CheckpointLabels
from replicaft.persistence.resume_check import (
    TRAJECTORY_STEPS,
    ResumeCheck,
    ResumeDiverged,
    decide_resume,
)


def falling(first_step: int, last_step: int, start: float = 1.0, per_step: float = 0.01) -> list[tuple[int, float]]:
    """A healthy trajectory: the loss falls by ``per_step`` each step."""
    return [(s, start - per_step * (s - first_step)) for s in range(first_step, last_step + 1)]


VERDICTS = [
    # (trajectory, checkpoint step, new losses, num_steps, tolerance, verdict, (deviation, allowed) or None).
    # falling(1, 20) ends 0.86, 0.85, ..., 0.81 at steps 15-20: mean 0.835, spread 0.05; a curve
    # that keeps falling at the same rate is off by 0.045 three steps on, within the spread alone.
    pytest.param(
        falling(1, 20), 20, [0.80, 0.79, 0.78], 3, 0.1, "ok", (0.045, 0.1335), id="falling_curve_continues_ok"
    ),
    pytest.param(
        [(s, 1.0) for s in range(1, 11)],
        10,
        [1.0, 1.0],
        2,
        0.0,
        "ok",
        (0.0, 0.0),
        id="flat_curve_equal_losses_ok_even_at_zero_tolerance",
    ),
    pytest.param(falling(1, 20), 20, [3.2, 3.16, 3.12], 3, 0.5, "diverged", (2.325, 0.4675), id="scaled_loss_diverged"),
    pytest.param(
        falling(1, 20), 20, [0.1, 0.1, 0.1], 3, 0.1, "diverged", (0.735, 0.1335), id="sudden_drop_is_a_divergence_too"
    ),
    pytest.param(falling(1, 20), 20, [0.8, 0.79], 3, 0.5, "not_enough_data", None, id="fewer_new_losses_than_asked"),
    pytest.param(
        [(20, 0.9)], 20, [0.9, 0.9], 2, 0.5, "not_enough_data", None, id="one_loss_before_the_checkpoint_has_no_spread"
    ),
    pytest.param([], 20, [0.9, 0.9], 2, 0.5, "not_enough_data", None, id="checkpoint_without_a_trajectory"),
    pytest.param(
        falling(1, 30),
        20,
        [0.80, 0.79],
        2,
        0.1,
        "ok",
        (0.03, 0.1125),
        id="losses_after_the_checkpoint_step_are_no_reference",
    ),
]


@pytest.mark.parametrize(
    ("trajectory", "checkpoint_step", "new", "num_steps", "tolerance", "verdict", "numbers"), VERDICTS
)
def test_verdict_table(
    trajectory: list[tuple[int, float]],
    checkpoint_step: int,
    new: list[float],
    num_steps: int,
    tolerance: float,
    verdict: str,
    numbers: tuple[float, float] | None,
) -> None:
    v = decide_resume(trajectory, checkpoint_step, new, num_steps=num_steps, tolerance=tolerance)
    assert v.verdict == verdict, v.reason
    if numbers is None:
        assert v.deviation is None and v.allowed is None
    else:
        assert v.deviation == pytest.approx(numbers[0], abs=1e-9) and v.allowed == pytest.approx(
            numbers[1], abs=1e-9
        ), v
        assert max(v.reference_steps) <= checkpoint_step
        assert len(v.reference_steps) == min(2 * num_steps, len([p for p in trajectory if p[0] <= checkpoint_step]))
    assert v.reason


def test_reason_names_the_steps_and_the_numbers() -> None:
    v = decide_resume(falling(1, 20), 20, [3.2, 3.16, 3.12], num_steps=3, tolerance=0.5)
    assert "steps 21-23" in v.reason and "steps 15-20" in v.reason and "beyond the 0.4675 allowed" in v.reason


class Driver:
    """The manager's side of a ResumeCheck: the step count, healing, the events."""

    def __init__(self, **options: Any) -> None:
        self.step = 0
        self.healing = False
        self.events: list[dict[str, Any]] = []
        self.labels = CheckpointLabels()
        self.check = ResumeCheck(
            num_steps=options.get("num_steps", 3),
            tolerance=options.get("tolerance", 0.5),
            action=options.get("action", "warn"),
            current_step=lambda: self.step,
            healing=lambda: self.healing,
            labels=self.labels,
            emit=lambda event, **fields: self.events.append({"event": event, **fields}),
            context="g0/0",
        )

    def run(self, *losses: float, commit: bool = True) -> None:
        for loss in losses:
            self.check.on_step_start()
            self.check.report_loss(loss)
            if commit:
                self.check.on_commit()
                self.step += 1
            else:
                self.check.on_abort()


def test_trajectory_records_committed_steps_only_with_the_step_after_the_commit() -> None:
    d = Driver()
    d.run(1.0, 0.9)
    d.run(5.0, commit=False)
    d.healing = True
    d.run(7.0)  # a healing step's loss was computed on the state before the heal
    d.healing = False
    d.run(0.8)
    assert d.check.state_dict() == {"steps": [1, 2, 4], "losses": [1.0, 0.9, 0.8]}


def test_trajectory_keeps_the_last_steps_only() -> None:
    d = Driver()
    d.run(*[float(i) for i in range(TRAJECTORY_STEPS + 5)])
    state = d.check.state_dict()
    assert state["steps"] == list(range(6, TRAJECTORY_STEPS + 6)) and len(state["losses"]) == TRAJECTORY_STEPS


def resumed(d: Driver, trajectory: list[tuple[int, float]]) -> None:
    """The resume: replicaft/persistence/duties.py calls ``resumed``, then the registry loads the state."""
    d.check.resumed(trajectory[-1][0])
    d.check.load_state_dict({"steps": [s for s, _ in trajectory], "losses": [x for _, x in trajectory]})
    d.step = trajectory[-1][0]
    d.run(9.9, commit=False)  # the step that loaded does not commit


def test_resume_emits_one_verdict_after_the_asked_steps_and_reports_the_metric() -> None:
    d = Driver()
    resumed(d, falling(1, 20))
    d.run(0.80, 0.79)
    assert d.events == []
    d.run(0.78, 0.77, 0.76)
    [event] = d.events
    assert event["event"] == "resume_verdict" and event["verdict"] == "ok" and event["checkpoint_step"] == 20
    assert event["new_losses"] == [0.8, 0.79, 0.78] and event["action"] == "warn"
    assert d.labels.take()["metrics"] == {"resume_loss_deviation": pytest.approx(0.045)}


def test_diverged_resume_warns_and_trains_on(caplog: pytest.LogCaptureFixture) -> None:
    d = Driver()
    resumed(d, falling(1, 20))
    d.run(3.2, 3.16, 3.12, 3.1)
    assert [e["verdict"] for e in d.events] == ["diverged"]
    assert "the loss diverged after the resume" in caplog.text


def test_diverged_resume_with_action_stop_raises_naming_the_checkpoint_and_the_fix() -> None:
    d = Driver(action="stop")
    resumed(d, falling(1, 20))
    with pytest.raises(ResumeDiverged, match=r"checkpoint step 20 the loss diverged.*resume_verify_action=warn"):
        d.run(3.2, 3.16, 3.12)
    assert d.events[0]["verdict"] == "diverged" and d.events[0]["action"] == "stop"


@pytest.mark.parametrize("blown", [float("inf"), float("nan"), float("-inf")], ids=repr)
def test_non_finite_loss_after_a_resume_is_diverged_at_once_issue_37(blown: float) -> None:
    v = decide_resume(falling(1, 20), 20, [0.8, blown, 0.7], num_steps=3, tolerance=0.5)
    assert v.verdict == "diverged" and v.deviation is None, v
    assert f"the loss of step 22, 2 after the resume from step 20, is {blown!r}" in v.reason
    assert v.fields()["new_losses"] == [0.8, repr(blown), 0.7]  # JSON has no number for it
    d = Driver()
    resumed(d, falling(1, 20))
    d.run(0.8, blown)  # judged without waiting for the third step
    [event] = d.events
    assert event["verdict"] == "diverged" and event["new_losses"] == [0.8, repr(blown)], event
    assert "resume_loss_deviation" not in d.labels.take().get("metrics", {})


def test_non_finite_losses_stay_out_of_the_trajectory_issue_37() -> None:
    d = Driver()
    d.run(1.0, float("nan"), float("inf"), 0.9)
    assert d.check.state_dict() == {"steps": [1, 4], "losses": [1.0, 0.9]}


def test_checkpoint_labels_keep_a_non_finite_metric_off_and_withdraw_its_last_value_issue_37() -> None:
    labels = CheckpointLabels()
    labels.report_metrics(loss=0.5, accuracy=0.9)
    assert labels.report_metrics(loss=float("nan"), lr=0.1) == ["loss"]
    assert labels.take()["metrics"] == {"accuracy": 0.9, "lr": 0.1}
    with pytest.raises(ValueError, match=r"metric loss='x' must be a finite number"):
        labels.report_metrics(loss="x")  # type: ignore[arg-type]  # no number: still the script's mistake


def test_verification_off_with_zero_steps() -> None:
    d = Driver(num_steps=0)
    resumed(d, falling(1, 20))
    d.run(3.2, 3.16, 3.12)
    assert d.events == []


@pytest.mark.parametrize(
    "state",
    [
        {"steps": [1, 2], "losses": [0.5]},
        {"steps": [1], "losses": [float("nan")]},
        {"steps": ["1"], "losses": [0.5]},
        "junk",
        {},
    ],
    ids=repr,
)
def test_malformed_trajectory_is_dropped_not_raised(state: Any) -> None:
    d = Driver()
    d.run(1.0)
    d.check.load_state_dict(state)
    assert d.check.state_dict() == {"steps": [], "losses": []}
