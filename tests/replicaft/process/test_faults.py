"""Named fault points (replicaft/process/faults.py): parsed strictly; reaching one is a real SIGKILL."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest
from conftest import REPO_ROOT
from hypothesis import given, settings
from hypothesis import strategies as st

from replicaft.errors import OptionsError
from replicaft.process.faults import POINTS, parse_fault_points


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        (None, frozenset()),
        ("", frozenset()),
        ("allreduce@5", frozenset({("allreduce", 5)})),
        ("heal@0", frozenset({("heal", 0)})),
        ("allreduce@5,heal@0", frozenset({("allreduce", 5), ("heal", 0)})),
        (" serve@3 , commit@12 ", frozenset({("serve", 3), ("commit", 12)})),
        ("commit@1,commit@1", frozenset({("commit", 1)})),
        ("commit@007", frozenset({("commit", 7)})),
    ],
)
def test_valid_spec_parsed_to_points(spec: str | None, expected: frozenset[tuple[str, int]]) -> None:
    assert parse_fault_points(spec) == expected


@pytest.mark.parametrize(
    ("spec", "bad_item"),
    [
        ("allreduce", "'allreduce'"),
        ("allreduce@", "'allreduce@'"),
        ("allreduce@-1", "'allreduce@-1'"),
        ("allreduce@1.5", "'allreduce@1.5'"),
        ("allreduce@x", "'allreduce@x'"),
        ("explode@3", "'explode@3'"),
        ("ALLREDUCE@3", "'ALLREDUCE@3'"),
        ("@3", "'@3'"),
        ("heal@1,", "''"),
        ("heal@1,,commit@2", "''"),
        ("heal@²", "'heal@²'"),
        ("heal@٣", "'heal@٣'"),
    ],
)
def test_malformed_spec_rejected_naming_the_item_and_the_form(spec: str, bad_item: str) -> None:
    with pytest.raises(OptionsError) as raised:
        parse_fault_points(spec)
    message = str(raised.value)
    assert f"fault point {bad_item} is not point@step" in message
    assert all(point in message for point in POINTS)
    assert "e.g. allreduce@5" in message


@settings(deadline=None)
@given(st.text(max_size=30))
def test_any_text_parses_or_raises_options_error(spec: str) -> None:
    try:
        points = parse_fault_points(spec)
    except OptionsError:
        return
    assert all(name in POINTS and step >= 0 for name, step in points)


@settings(deadline=None)
@given(st.sets(st.tuples(st.sampled_from(sorted(POINTS)), st.integers(0, 10**9)), max_size=6))
def test_formatted_points_parse_back(points: set[tuple[str, int]]) -> None:
    spec = ",".join(f"{name}@{step}" for name, step in points)
    assert parse_fault_points(spec) == points


_CHILD = """
from replicaft.process.faults import parse_fault_points, reached
points = parse_fault_points("commit@3")
reached(points, "commit", 2)
reached(points, "allreduce", 3)
print("passed the points not armed", flush=True)
reached(points, "commit", 3)
print("survived an armed point", flush=True)
"""


def test_reaching_an_armed_point_kills_the_process_with_sigkill() -> None:
    child = subprocess.run([sys.executable, "-c", _CHILD], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert child.returncode == -signal.SIGKILL, child.stderr
    assert child.stdout.splitlines() == ["passed the points not armed"]
