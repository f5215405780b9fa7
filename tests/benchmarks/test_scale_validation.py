"""The simulator's validation against real chaos runs (benchmarks/scale/validation.py): the
pure parts (where a run's faults struck, what each becomes, the error and the table) on
records built by hand with known answers, then the committed runs replayed."""

from __future__ import annotations

import pytest

from benchmarks.scale import validation
from benchmarks.scale.faults import Fault
from benchmarks.scale.params import Costs


def record(faults: list[dict], *, useful_s: float = 50.0, steps: int = 500) -> dict:
    return {"faults": faults, "goodput_detail": {"useful_step_seconds": useful_s}, "committed_steps": steps}


def fault(kind: str, target: str, label: str, at_s: float, step: int) -> dict:
    return {"kind": kind, "target": target, "label": label, "at_s": at_s, "step": step}


def test_faults_planned_at_times_count_from_the_earliest_planned_minus_struck():
    # Planned 10 s and 20 s after the first commit; the second waited 1.5 s for its target.
    r = record(
        [
            fault("sigkill", "g1", "sigkill g1 at t+10.0s", 14.0, 20),
            fault("sigstop", "g0", "sigstop g0 for 3s at t+20.0s", 25.5, 40),
        ]
    )
    assert validation.origin_s(r) == pytest.approx(4.0)
    assert validation.replay_faults(r) == [
        Fault(pytest.approx(10.0), "kill", (1,), 0.0),
        Fault(pytest.approx(21.5), "sigstop", (0,), 3.0),
    ]


def test_faults_planned_at_steps_count_from_the_first_fault_less_its_steps():
    # Useful step 0.1 s; the first fault, at step 100, struck 13 s into the run: step 0 at 3 s.
    r = record(
        [
            fault("partition", "g2", "partition g2 for 2s at step 1000", 106.0, 1000),
            fault("sigstop", "g2", "sigstop g2 for 0.3s at step 100", 13.0, 100),
            fault("kill_lighthouse", "lighthouse", "kill_lighthouse at step 300", 35.0, 300),
        ]
    )
    assert validation.step_s(r) == pytest.approx(0.1)
    assert validation.origin_s(r) == pytest.approx(3.0)
    faults = validation.replay_faults(r)
    assert [(f.kind, f.groups, f.duration_s) for f in faults] == [
        ("sigstop", (2,), 0.3),
        ("lighthouse", (), 0.0),
        ("sigstop", (2,), 2.0),  # a partition is a freeze of its duration
    ]
    assert [f.at_s for f in faults] == pytest.approx([10.0, 32.0, 103.0])


def test_sigterm_is_a_preemption_and_only_freezes_have_a_duration():
    r = record([fault("sigterm", "g0", "sigterm g0 for 9s at t+1.0s", 2.0, 3)])
    assert validation.replay_faults(r) == [Fault(pytest.approx(1.0), "preempt", (0,), 0.0)]  # planned at t+1 s


def test_a_fault_kind_the_simulator_has_no_model_for_is_refused():
    r = record([fault("fill_disk", "g0", "fill_disk at step 3", 2.0, 3)])
    with pytest.raises(KeyError):
        validation.replay_faults(r)


def test_error_is_relative_to_the_measurement_and_the_table_has_a_row_per_replay():
    assert validation.relative_error(0.868, 0.889) == pytest.approx(-0.0236, abs=1e-4)
    assert validation.relative_error(1.0, 0.8) == pytest.approx(0.25)
    replays = [
        {
            "scenario": "a",
            "faults": {"sigkill": 2, "sigstop": 3},
            "step_s": 0.1,
            "measured_goodput_vs_fault_free": 0.9,
            "simulated_goodput": 0.88,
            "error": -0.0222,
        }
    ]
    assert validation.table(replays) == [validation.TABLE_HEADER, ["a", 5, 0.1, 0.9, 0.88, -0.0222]]


def test_a_run_without_a_reference_has_nothing_to_be_compared_with(tmp_path):
    path = tmp_path / "soak.json"
    path.write_text('{"goodput_vs_fault_free": null}')
    with pytest.raises(ValueError, match="--reference"):
        validation.replay("soak", Costs(), path)


@pytest.mark.parametrize(
    ("name", "faults"),
    [
        ("soak", {"kill_lighthouse": 10, "sigkill": 9, "sigstop": 10, "sigterm": 7}),
        ("commit_lease", {"partition": 1, "sigkill": 1, "sigstop": 4}),
    ],
)
def test_each_committed_run_replayed_predicts_its_measured_goodput_within_five_percent(name, faults):
    """The real chaos runs' faults at their recorded times (chaos/results/NAME.json)."""
    replayed = validation.replay(name, Costs())
    assert replayed["faults"] == faults
    assert abs(replayed["error"]) <= 0.05, replayed
