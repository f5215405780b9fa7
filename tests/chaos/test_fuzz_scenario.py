"""Hostile scenario files against the chaos loader (chaos/scenario.py, chaos/random_faults.py).
Issue 19 and bug 6.

A scenario file is typed by a person; whatever it holds, ``load_scenario`` and
``scenario_from_dict`` return a Scenario or raise ``ScenarioError`` naming the file, never
a traceback from deeper in (TypeError from a comparison, UnicodeDecodeError, a hang in the
random-fault expansion).
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from support.fuzz_support import (
    FUZZ,
    call_decoder,
    damaged_bytes,
    mutated_map,
    shallow_hostile_values,
    without_bytes,
)

from chaos.scenario import SCENARIO_DIR, Scenario, ScenarioError, load_scenario, scenario_from_dict

SHIPPED = (SCENARIO_DIR / "every_fault.toml").read_bytes()
VALID: dict[str, Any] = {
    "name": "fuzz",
    "groups": 3,
    "steps": 60,
    "step_delay_s": 0.1,
    "checkpoint_interval_steps": 10,
    "faults": [
        {"kind": "sigkill", "target": "g1", "at_step": 3},
        {"kind": "slow_link", "target": "g2", "at_s": 5.0, "duration_s": 2.0, "rate_mbit": 10.0},
    ],
    "random_faults": {"every_s": 10.0, "until_s": 60.0, "kinds": ["sigstop"], "seed": 1},
}


@st.composite
def hostile_scenario(draw: st.DrawFn) -> dict[str, Any]:
    """VALID with one change: at the top, in one fault, or in the random-fault table."""
    body = {**VALID, "faults": [dict(f) for f in VALID["faults"]], "random_faults": dict(VALID["random_faults"])}
    where = draw(st.sampled_from(["top", "fault", "random"]))
    if where == "fault":
        i = draw(st.integers(0, len(body["faults"]) - 1))
        body["faults"][i] = draw(mutated_map(body["faults"][i], values=shallow_hostile_values))
    elif where == "random":
        body["random_faults"] = draw(mutated_map(body["random_faults"], values=shallow_hostile_values))
    else:
        body = draw(mutated_map(body, protected=frozenset({"name"}), values=shallow_hostile_values))
    return without_bytes(body)


def test_valid_example_loads() -> None:
    assert isinstance(scenario_from_dict(VALID), Scenario)


@FUZZ
@given(data=st.one_of(hostile_scenario(), st.dictionaries(st.text(max_size=20), shallow_hostile_values, max_size=4)))
def test_scenario_table_builds_or_raises_scenario_error_naming_the_source(data: dict[str, Any]) -> None:
    def build() -> Scenario:
        try:
            return scenario_from_dict(without_bytes(data), source="fuzz.toml")
        except ScenarioError as e:
            assert "fuzz.toml" in str(e), f"{e} does not name the file"
            raise

    call_decoder(build, ScenarioError, "scenario_from_dict")


@FUZZ
@given(raw=st.one_of(st.binary(max_size=200), damaged_bytes(SHIPPED)))
def test_scenario_file_loads_or_raises_scenario_error_naming_the_file(raw: bytes) -> None:
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "fuzz.toml"
        path.write_bytes(raw)

        def load() -> Scenario:
            try:
                return load_scenario(str(path))
            except ScenarioError as e:
                assert str(path) in str(e), f"{e} does not name the file"
                raise

        call_decoder(load, ScenarioError, "load_scenario", len(raw))


def test_scenario_file_nested_too_deep_for_the_parser_is_a_scenario_error_issue_19(tmp_path: Path) -> None:
    path = tmp_path / "deep.toml"
    path.write_text('name = "x"\ndescription = ' + "[" * 5000 + "]" * 5000 + "\n")
    with pytest.raises(ScenarioError, match=r"deep.toml nests arrays or tables deeper than Python can parse"):
        load_scenario(str(path))


def test_unknown_keys_are_shown_briefly_issue_19() -> None:
    with pytest.raises(ScenarioError) as info:
        scenario_from_dict({"name": "x", "k" * 100_000: 1}, source="x.toml")
    assert str(info.value).startswith("x.toml: unknown keys ['kkkkk") and len(str(info.value)) < 2000
