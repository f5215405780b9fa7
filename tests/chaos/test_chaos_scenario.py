"""Scenario files: the fault kinds' fields and rules, what a scenario needs from the machine, the
arming of self-inflicted faults, and randomly timed faults (chaos/scenario.py, chaos/random_faults.py)."""

from __future__ import annotations

import math
import re
import statistics
import typing
from pathlib import Path
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
    (
        {"kind": "fault_point", "target": "g1", "point": "heal", "at_step": 2},
        {"ranks_per_group": 2},
        "ranks_per_group = 1",
    ),
    (
        {"kind": "sigkill", "target": "g1", "at_step": 2},
        {"ranks_per_group": 2, "checkpoint_interval_steps": 5},
        "W > 1 checkpoints",
    ),
    (
        {"kind": "sigkill", "target": "g1", "at_step": 2},
        {"ranks_per_group": 2, "warm_standby": True},
        "warm_standby = true with ranks_per_group=2",
    ),
    (
        {"kind": "partition", "target": "g1", "at_step": 2, "duration_s": 3.0},
        {"warm_standby": True},
        "partition/slow_link faults",
    ),
]


@pytest.mark.parametrize(("fault", "fields", "message"), BAD, ids=[m for _, _, m in BAD])
def test_invalid_fault_is_rejected_naming_the_field_and_the_fix(
    fault: dict[str, Any], fields: dict[str, Any], message: str
) -> None:
    with pytest.raises(ScenarioError) as info:
        scenario(fault, **fields)
    assert message in str(info.value)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"script": "/nonexistent/train.py"}, "is not a file"),
        ({"script_args": ["--steps", "3"]}, "script_args without script"),
        ({"script": __file__, "script_args": ["--steps", 3]}, "script_args must be an array of strings"),
        ({"loss_window": 0}, "loss_window=0"),
    ],
)
def test_invalid_script_or_loss_window_is_rejected(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ScenarioError, match=message):
        scenario_from_dict({"name": "x", **fields})


def test_two_self_armed_faults_on_one_group_are_rejected() -> None:
    with pytest.raises(ScenarioError, match="only one fault_point or kill_donor_mid_heal per target"):
        scenario(
            {"kind": "fault_point", "target": "g2", "point": "commit", "at_step": 3},
            {"kind": "kill_donor_mid_heal", "target": "g2", "healer": "g1", "at_step": 20},
        )


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
    s = scenario(
        {"kind": "slow_link", "target": "g1", "at_step": 2, "duration_s": 3.0, "rate_mbit": 2.0},
        {"kind": "kill_donor_mid_heal", "target": "g2", "healer": "g1", "at_step": 20},
    )
    assert [f.describe() for f in s.faults[:2]] == [
        "slow_link g1 2 Mbit/s for 3s at step 2",
        "kill_donor_mid_heal g2 (healing g1) at step 20",
    ]


def test_every_kind_is_documented_in_the_module_docstring() -> None:
    import chaos.scenario

    doc = chaos.scenario.__doc__ or ""
    assert all(f"``{kind}``" in doc for kind in FAULT_KINDS)


@pytest.mark.parametrize(
    "name",
    [
        "every_fault",
        "every_fault_w2",
        "catastrophe",
        "partition",
        "soak",
        "gpt",
        "lighthouse_ha",
        "cold_start",
        "lifecycle",
        "commit_lease",
        "commit_lease_w2",
        "standing",
    ],
)
def test_shipped_scenarios_state_their_shape(name: str) -> None:
    s = load_scenario(name)
    assert s.description and s.groups >= 2 and s.hang_bound_s > 0 and s.loss_tolerance > 0


def test_every_fault_pair_and_lighthouse_ha_cover_every_kind() -> None:
    kinds = {f.kind for name in ("every_fault", "every_fault_w2", "lifecycle") for f in load_scenario(name).faults}
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
    s = scenario_from_dict(
        {
            "name": "r",
            "steps": 50,
            "faults": [{"kind": "sigkill", "target": "g0", "at_step": 3}],
            "random_faults": {"every_s": 10.0, "until_s": 60.0, "kinds": ["sigstop"], "seed": 1},
        }
    )
    assert s.faults[0].kind == "sigkill"
    assert len(s.faults) > 1 and {f.kind for f in s.faults[1:]} == {"sigstop"}


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"every_s": 0, "until_s": 60.0}, "every_s=0"),
        ({"every_s": 5.0, "until_s": 60.0, "kinds": ["partition"]}, "choose among"),
        ({"every_s": 5.0, "until_s": 60.0, "often": True}, "unknown keys ['often']"),
    ],
)
def test_invalid_random_faults_are_rejected(table: dict[str, Any], message: str) -> None:
    with pytest.raises(ScenarioError) as info:
        scenario_from_dict({"name": "r", "random_faults": table}, source="r.toml")
    assert message in str(info.value)


# -- every field's type and range (bug 6, issue 19) -------------------------------------------------


def _numeric_fields(cls: type) -> list[tuple[str, type]]:
    """``cls``'s fields annotated ``int`` or ``float`` (optional or not), from its annotations."""
    out = []
    for name, hint in typing.get_type_hints(cls).items():
        kinds = set(typing.get_args(hint)) - {type(None)} or {hint}
        if kinds in ({int}, {float}):
            out.append((name, kinds.pop()))
    return out


SCENARIO_NUMBERS = _numeric_fields(Scenario)
FAULT_NUMBERS = _numeric_fields(FaultSpec)
HOSTILE_NUMBERS: list[tuple[str, Any]] = [
    ("nan", math.nan),
    ("inf", math.inf),
    ("-inf", -math.inf),
    ("negative", -1),
    ("huge", 10**12),
    ("huge_float", 1e300),
    ("string", "3"),
    ("boolean", True),
    ("array", [1]),
    ("table", {"a": 1}),
]


def test_every_numeric_field_is_covered() -> None:
    assert {"groups", "steps", "heartbeat_timeout_s", "loss_tolerance", "global_batch"} <= dict(SCENARIO_NUMBERS).keys()
    assert dict(FAULT_NUMBERS).keys() == {"at_s", "at_step", "duration_s", "rank", "rate_mbit", "delay_ms"}


def _bad_values(kind: type) -> list[tuple[str, Any]]:
    return HOSTILE_NUMBERS + ([("fractional", 2.5)] if kind is int else [])


@pytest.mark.parametrize(
    ("field", "label", "value"),
    [(name, label, value) for name, kind in SCENARIO_NUMBERS for label, value in _bad_values(kind)],
)
def test_scenario_number_out_of_type_or_range_is_refused_naming_file_and_field(
    field: str, label: str, value: Any
) -> None:
    with pytest.raises(ScenarioError, match=rf"^scenario x\.toml: {field} must be a (whole|finite) number from "):
        scenario_from_dict({"name": "x", field: value}, source="x.toml")


@pytest.mark.parametrize(
    ("field", "label", "value"),
    [(name, label, value) for name, kind in FAULT_NUMBERS for label, value in _bad_values(kind)],
)
def test_fault_number_out_of_type_or_range_is_refused_naming_file_and_field(field: str, label: str, value: Any) -> None:
    fault = {"kind": "sigkill", "target": "g1", "at_step": 2, field: value}
    with pytest.raises(
        ScenarioError, match=rf"^scenario x\.toml: faults\[0\]\.{field} must be a (whole|finite) number from "
    ):
        scenario_from_dict({"name": "x", "faults": [fault]}, source="x.toml")


@pytest.mark.parametrize("cls", [Scenario, FaultSpec])
def test_direct_construction_checks_types_too(cls: type) -> None:
    fields = {"name": "x", "steps": "50"} if cls is Scenario else {"kind": "sigkill", "at_step": math.nan}
    with pytest.raises(ScenarioError, match="must be a whole number"):
        cls(**fields)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"faults": 5}, r"^scenario x\.toml: faults must be an array of tables \(\[\[faults\]\]\), got integer 5"),
        ({"faults": {"kind": "sigkill"}}, r"faults must be an array of tables"),
        ({"faults": [{"target": "g1", "at_step": 2}]}, r"faults\[0\] has no kind"),
        (
            {"faults": [{"kind": 3, "target": "g1", "at_step": 2}]},
            r"faults\[0\]\.kind must be one of .*, got integer 3",
        ),
        ({"faults": [{"kind": "sigkill", "target": 1, "at_step": 2}]}, r"faults\[0\]\.target must be a string"),
        ({"name": 5}, r"name must be a string, got integer 5"),
        ({"deterministic": "yes"}, r"deterministic must be a boolean \(true or false\), got string 'yes'"),
        ({"script_args": "--steps 3"}, r"script_args must be an array of strings, got string"),
        ({"groups": 1000}, r"groups must be a whole number from 1 to 256, got integer 1000"),
    ],
)
def test_wrong_shape_is_refused_naming_file_and_field(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ScenarioError, match=message) as info:
        scenario_from_dict({"name": "x", **fields}, source="x.toml")
    assert "x.toml" in str(info.value)


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"every_s": math.nan, "until_s": 60.0}, "every_s=nan"),
        ({"every_s": 5.0, "until_s": math.inf}, "until_s=inf"),
        ({"every_s": 1e-9, "until_s": 1e6}, "expects 1e+15 faults; at most 10000"),
        ({"every_s": True, "until_s": 60.0}, "every_s=True"),
        ({"every_s": 5.0, "until_s": 60.0, "kinds": 5}, "kinds=5; it must be an array"),
        ({"every_s": 5.0, "until_s": 60.0, "kinds": "sigkill"}, "kinds='sigkill'; it must be an array"),
        ({"every_s": 5.0, "until_s": 60.0, "seed": 1.5}, "seed=1.5"),
    ],
)
def test_random_faults_out_of_type_or_range_are_refused(table: dict[str, Any], message: str) -> None:
    with pytest.raises(ScenarioError, match="^r.toml: random_faults") as info:
        scenario_from_dict({"name": "r", "random_faults": table}, source="r.toml")
    assert message in str(info.value)


def test_scenario_file_that_is_not_utf8_is_refused_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "latin1.toml"
    path.write_bytes('name = "caf\u00e9"\n'.encode("latin-1"))
    with pytest.raises(
        ScenarioError,
        match=rf"scenario file {re.escape(str(path))} is not UTF-8 text \(byte 0xe9 at "
        "offset 11\\)",
    ):
        load_scenario(str(path))


def test_scenario_file_with_faults_not_an_array_is_refused_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "x.toml"
    path.write_text('name = "x"\nfaults = 5\n')
    with pytest.raises(ScenarioError, match=rf"^scenario {re.escape(str(path))}: faults must be an array of tables"):
        load_scenario(str(path))
