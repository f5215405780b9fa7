"""Scenario files: the fault kinds' fields and rules, what a scenario needs from the machine, the
arming of self-inflicted faults, and randomly timed faults (chaos/scenario.py, chaos/random_faults.py)."""

from __future__ import annotations

import statistics
from typing import Any

import pytest

from chaos.random_faults import DRAWABLE_KINDS, RandomFaults
from chaos.scenario import (
    FAULT_KINDS,
    OBJECT_STORE_KINDS,
    REPLICATED_LIGHTHOUSE_KINDS,
    FaultSpec,
    Scenario,
    ScenarioError,
    load_scenario,
    scenario_from_dict,
)


def scenario(*faults: dict[str, Any], **fields: Any) -> Any:
    return scenario_from_dict({"name": "x", "steps": 100, **fields, "faults": list(faults)}, source="test.toml")


BAD = [
    ({"kind": "sigkill_rank", "target": "g1", "rank": 1, "at_step": 2}, {}, "ranks_per_group = 2"),
    ({"kind": "sigkill_rank", "target": "g1", "rank": 2, "at_step": 2}, {"ranks_per_group": 2}, "rank=2"),
    ({"kind": "sigkill_rank", "target": "g1", "at_step": 2}, {"ranks_per_group": 2}, "rank=None"),
    ({"kind": "sigkill", "target": "g1", "rank": 0, "at_step": 2}, {}, "rank applies to sigkill_rank only"),
    ({"kind": "kill_all_groups", "at_step": 2}, {}, "set checkpoint_interval_steps"),
    ({"kind": "corrupt_checkpoint", "at_step": 2}, {}, "set checkpoint_interval_steps"),
    ({"kind": "fill_disk", "at_step": 2, "duration_s": 5.0}, {}, "set checkpoint_interval_steps"),
    ({"kind": "fill_disk", "at_step": 2}, {"checkpoint_interval_steps": 5}, "needs how long it lasts"),
    ({"kind": "kill_all_groups", "target": "g0", "at_step": 2}, {"checkpoint_interval_steps": 5}, "takes no target"),
    ({"kind": "partition", "target": "g1", "at_step": 2}, {}, "needs how long it lasts"),
    ({"kind": "slow_link", "target": "g1", "at_step": 2, "duration_s": 3.0}, {}, "rate_mbit"),
    ({"kind": "slow_link", "target": "g1", "at_step": 2, "duration_s": 3.0, "rate_mbit": 0.0}, {}, "rate_mbit=0.0"),
    ({"kind": "partition", "target": "g1", "at_step": 2, "duration_s": 3.0, "delay_ms": 5.0}, {}, "slow_link only"),
    ({"kind": "kill_donor_mid_heal", "target": "g2", "at_step": 2}, {}, "healer=None"),
    ({"kind": "kill_donor_mid_heal", "target": "g2", "healer": "g2", "at_step": 2}, {}, "healer='g2'"),
    ({"kind": "kill_donor_mid_heal", "target": "g1", "healer": "g0", "at_step": 2}, {"groups": 2}, "needs 3 groups"),
    ({"kind": "kill_donor_mid_heal", "target": "g2", "healer": "g1", "at_s": 5.0}, {}, "use at_step"),
    ({"kind": "fault_point", "target": "g1", "point": "heal", "at_step": 2}, {"ranks_per_group": 2}, "ranks_per_group = 1"),
    ({"kind": "sigkill", "target": "g1", "at_step": 2}, {"ranks_per_group": 2, "checkpoint_interval_steps": 5},
     "W > 1 checkpoints"),
]


@pytest.mark.parametrize(("fault", "fields", "message"), BAD, ids=[m for _, _, m in BAD])
def test_invalid_fault_is_rejected_naming_the_field_and_the_fix(fault: dict[str, Any], fields: dict[str, Any],
                                                                 message: str) -> None:
    with pytest.raises(ScenarioError) as info:
        scenario(fault, **fields)
    assert message in str(info.value)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"script": "/nonexistent/train.py"}, "is not a file"),
        ({"script_args": ["--steps", "3"]}, "script_args without script"),
        ({"script": __file__, "script_args": ["--steps", 3]}, "list of strings"),
        ({"loss_window": 0}, "loss_window=0"),
    ],
)
def test_invalid_script_or_loss_window_is_rejected(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ScenarioError, match=message):
        scenario_from_dict({"name": "x", **fields})


def test_two_self_armed_faults_on_one_group_are_rejected() -> None:
    with pytest.raises(ScenarioError, match="only one fault_point or kill_donor_mid_heal per target"):
        scenario({"kind": "fault_point", "target": "g2", "point": "commit", "at_step": 3},
                 {"kind": "kill_donor_mid_heal", "target": "g2", "healer": "g1", "at_step": 20})


def test_donor_is_armed_to_die_serving_any_heal_from_the_kill_on() -> None:
    s = scenario({"kind": "kill_donor_mid_heal", "target": "g2", "healer": "g1", "at_step": 95})
    assert s.fault_points_for("g2") == "serve@95,serve@96,serve@97,serve@98,serve@99"
    assert s.fault_points_for("g1") is None


def test_scenario_says_what_it_needs_from_the_machine() -> None:
    plain = scenario({"kind": "sigkill", "target": "g1", "at_step": 2})
    assert not plain.needs_network and not plain.needs_disk
    net = scenario({"kind": "slow_link", "target": "g1", "at_step": 2, "duration_s": 3.0, "delay_ms": 20.0})
    assert net.needs_network and not net.needs_disk
    disk = scenario({"kind": "fill_disk", "at_step": 2, "duration_s": 3.0}, checkpoint_interval_steps=5)
    assert disk.needs_disk and not disk.needs_network


def test_describe_names_kind_target_parameters_and_moment() -> None:
    s = scenario({"kind": "slow_link", "target": "g1", "at_step": 2, "duration_s": 3.0, "rate_mbit": 2.0},
                 {"kind": "kill_donor_mid_heal", "target": "g2", "healer": "g1", "at_step": 20})
    assert [f.describe() for f in s.faults[:2]] == ["slow_link g1 2 Mbit/s for 3s at step 2",
                                                     "kill_donor_mid_heal g2 (healing g1) at step 20"]


def test_every_kind_is_documented_in_the_module_docstring() -> None:
    import chaos.scenario

    doc = chaos.scenario.__doc__ or ""
    assert all(f"``{kind}``" in doc for kind in FAULT_KINDS)


@pytest.mark.parametrize("name", ["every_fault", "every_fault_w2", "catastrophe", "partition", "soak", "gpt",
                                  "lighthouse_ha", "cold_start"])
def test_shipped_scenarios_state_their_shape(name: str) -> None:
    s = load_scenario(name)
    assert s.description and s.groups >= 2 and s.hang_bound_s > 0 and s.loss_tolerance > 0


def test_every_fault_pair_and_lighthouse_ha_cover_every_kind() -> None:
    kinds = {f.kind for name in ("every_fault", "every_fault_w2") for f in load_scenario(name).faults}
    assert kinds == set(FAULT_KINDS) - REPLICATED_LIGHTHOUSE_KINDS - OBJECT_STORE_KINDS
    assert {f.kind for f in load_scenario("lighthouse_ha").faults} == REPLICATED_LIGHTHOUSE_KINDS
    assert {f.kind for f in load_scenario("cold_start").faults} == OBJECT_STORE_KINDS


def test_replicated_lighthouse_fault_needs_a_replicated_lighthouse() -> None:
    with pytest.raises(ScenarioError, match="needs a replicated lighthouse; set lighthouse_replicas = 3"):
        Scenario(name="x", faults=(FaultSpec(kind="kill_lighthouse_leader", at_step=1),))
    with pytest.raises(ScenarioError, match="lighthouse_replicas=2; use 1"):
        Scenario(name="x", lighthouse_replicas=2)


# -- random faults ---------------------------------------------------------------------------------

def test_random_faults_are_a_seeded_poisson_process() -> None:
    drawn = RandomFaults(every_s=15.0, until_s=6000.0, seed=7)
    faults = drawn.expand(("g0", "g1", "g2"))
    assert faults == drawn.expand(("g0", "g1", "g2")), "same seed, same faults"
    times = [f["at_s"] for f in faults]
    assert times == sorted(times) and times[-1] <= 6000.0
    gaps = [b - a for a, b in zip([0.0, *times], times, strict=False)]
    assert 12.0 < statistics.mean(gaps) < 18.0
    assert {f["kind"] for f in faults} == set(DRAWABLE_KINDS)
    assert all(("target" in f) == (f["kind"] != "kill_lighthouse") for f in faults)
    assert all(f["duration_s"] == 3.0 for f in faults if f["kind"] == "sigstop")


def test_random_faults_table_expands_into_the_scenario() -> None:
    s = scenario_from_dict({"name": "r", "steps": 50, "faults": [{"kind": "sigkill", "target": "g0", "at_step": 3}],
                            "random_faults": {"every_s": 10.0, "until_s": 60.0, "kinds": ["sigstop"], "seed": 1}})
    assert s.faults[0].kind == "sigkill"
    assert len(s.faults) > 1 and {f.kind for f in s.faults[1:]} == {"sigstop"}


@pytest.mark.parametrize(("table", "message"), [
    ({"every_s": 0, "until_s": 60.0}, "every_s=0"),
    ({"every_s": 5.0, "until_s": 60.0, "kinds": ["partition"]}, "choose among"),
    ({"every_s": 5.0, "until_s": 60.0, "often": True}, "unknown keys ['often']"),
])
def test_invalid_random_faults_are_rejected(table: dict[str, Any], message: str) -> None:
    with pytest.raises(ScenarioError) as info:
        scenario_from_dict({"name": "r", "random_faults": table}, source="r.toml")
    assert message in str(info.value)
