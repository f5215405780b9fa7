"""What the environment sets (replicaft/config/environment.py), read without building options:
values parsed by the field's type, torchrun's variables only where ours are unset, and a value
that does not parse refused naming the variable."""

from __future__ import annotations

import pytest

from replicaft import OptionsError
from replicaft.config.environment import check_environment, environment_values

TYPES = {
    "seed": "int",
    "quorum_timeout_s": "float",
    "deterministic": "bool",
    "group_rank": "int",
    "group_store": "str | None",
}


def test_values_are_parsed_by_type_and_named_by_their_variable() -> None:
    env = {"REPLICAFT_SEED": "7", "REPLICAFT_QUORUM_TIMEOUT_S": "2.5", "REPLICAFT_DETERMINISTIC": "yes", "HOME": "/"}
    values, sources = environment_values(env, TYPES)
    assert values == {"seed": 7, "quorum_timeout_s": 2.5, "deterministic": True}
    assert sources["seed"] == "REPLICAFT_SEED"


def test_torchrun_variables_fill_only_what_ours_leave_unset() -> None:
    torchrun = {"RANK": "3", "MASTER_ADDR": "h", "MASTER_PORT": "29500"}
    assert environment_values(torchrun, TYPES)[0] == {"group_rank": 3, "group_store": "h:29500"}
    ours = {**torchrun, "REPLICAFT_GROUP_RANK": "1", "REPLICAFT_GROUP_STORE": "s:1"}
    values, sources = environment_values(ours, TYPES)
    assert values == {"group_rank": 1, "group_store": "s:1"}
    assert sources["group_rank"] == "REPLICAFT_GROUP_RANK"


def test_an_empty_variable_means_unset() -> None:
    assert environment_values({"REPLICAFT_SEED": ""}, TYPES) == ({}, {})


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"REPLICAFT_SEED": "x"}, "REPLICAFT_SEED='x' is not an integer"),
        ({"REPLICAFT_QUORUM_TIMEOUT_S": "soon"}, "REPLICAFT_QUORUM_TIMEOUT_S='soon' is not a number"),
        ({"REPLICAFT_DETERMINISTIC": "maybe"}, "REPLICAFT_DETERMINISTIC='maybe' is not a boolean"),
        ({"RANK": "zero"}, "RANK='zero' is not an integer"),
    ],
)
def test_a_value_that_does_not_parse_is_refused_naming_the_variable(env: dict[str, str], message: str) -> None:
    with pytest.raises(OptionsError, match=message):
        environment_values(env, TYPES)


def test_an_empty_token_is_refused_before_any_value_is_read() -> None:
    # An unknown REPLICAFT_* name is refused here too; test_manager_options.py covers it, and
    # is where the repository's scan for unknown names allows misspellings on purpose.
    with pytest.raises(OptionsError, match="REPLICAFT_TOKEN"):
        check_environment({"REPLICAFT_TOKEN": ""}, frozenset({"REPLICAFT_TOKEN"}))
