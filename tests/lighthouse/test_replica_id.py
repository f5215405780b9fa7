"""The replica id rule (lighthouse/wire/replica_id.py): one alphabet, checked where an id enters."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lighthouse.errors import OptionsError, ProtocolError
from lighthouse.wire.replica_id import (
    MAX_REPLICA_ID_CHARS,
    check_replica_id,
    check_replica_id_column,
    replica_id_problem,
)


@pytest.mark.parametrize(
    "value",
    ["g0", "group-3", "job.7:rank-0", "_x", "A" * MAX_REPLICA_ID_CHARS, "train_ddp_0:6f1c9e2a-1b2c", "pod@host"],
)
def test_ordinary_ids_accepted(value: str) -> None:
    assert check_replica_id(value) == value


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("", "is empty"),
        ("A" * (MAX_REPLICA_ID_CHARS + 1), f"is {MAX_REPLICA_ID_CHARS + 1} characters long"),
        ("g0\nINFO lighthouse: quorum 9 formed", "is 'g0\\nINFO lighthouse: quorum 9 formed'"),
        ("g0\r", "is 'g0\\r'"),
        ("g\t0", "is 'g\\t0'"),
        ("g\x1b[31m", "is 'g\\x1b[31m'"),
        ("g 0", "is 'g 0'"),
        ("a/b", "is 'a/b'"),
        ("-g0", "is '-g0'"),
        (".hidden", "is '.hidden'"),
        ("gé", "is 'gé'"),
        (7, "is int 7; expected a string"),
        (None, "is NoneType None; expected a string"),
    ],
)
def test_bad_id_rejected_naming_where_value_and_rule(value: object, expected: str) -> None:
    assert replica_id_problem(value) is not None
    with pytest.raises(OptionsError) as raised:
        check_replica_id(value, where="--replica-id", error=OptionsError)
    message = str(raised.value)
    assert message.startswith(f"--replica-id {expected}; a replica id is 1-{MAX_REPLICA_ID_CHARS} characters")
    assert "\n" not in message and "\r" not in message


def test_wire_errors_are_protocol_errors_by_default() -> None:
    with pytest.raises(ProtocolError, match=r"^Register.replica_id is 'a\\nb'"):
        check_replica_id("a\nb", where="Register.replica_id")


@given(st.lists(st.text(max_size=6), max_size=6))
def test_column_check_agrees_with_the_scalar_rule(ids: list[str]) -> None:
    column = tuple(ids)
    if all(replica_id_problem(rid) is None for rid in column):
        assert check_replica_id_column("Quorum", "replica_ids", column) == column
    else:
        with pytest.raises(ProtocolError, match=r"^Quorum.replica_ids\[\d+\] "):
            check_replica_id_column("Quorum", "replica_ids", column)
