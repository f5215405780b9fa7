"""LighthouseOptions and MembershipOptions (lighthouse/config/options.py, membership.py): every value
checked once, when built, naming the value and the fix (issue 19: a NaN timeout left hung
members never dropped and quorums never formed)."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest

from lighthouse.__main__ import main
from lighthouse.config.options import LighthouseOptions, MembershipOptions
from lighthouse.errors import OptionsError

BAD_NUMBERS = [math.nan, math.inf, -math.inf, -1, -0.5, 0, 1e18, True, "2"]
"""Fed to every numeric option: none is a usable value for any of them."""

MEMBERSHIP_NUMBERS = [f.name for f in dataclasses.fields(MembershipOptions)]
LIGHTHOUSE_NUMBERS = [
    f.name for f in dataclasses.fields(LighthouseOptions) if f.name not in ("host", "membership", "token", "tls")
]


def test_every_option_field_is_covered_by_the_class_tests() -> None:
    assert set(MEMBERSHIP_NUMBERS) == {
        "min_replicas",
        "join_timeout_s",
        "heartbeat_timeout_s",
        "progress_timeout_s",
        "hung_factor",
        "hung_min_s",
        "max_commit_lease_s",
    }
    assert set(LIGHTHOUSE_NUMBERS) == {
        "port",
        "status_port",
        "tick_s",
        "outbox_max_messages",
        "outbox_max_bytes",
        "max_connections",
        "handshake_timeout_s",
    }


@pytest.mark.parametrize(
    ("name", "value"),
    # A commit lease of 0 is valid (none: every commit asks the fence), so that pair is left out.
    [
        (n, v)
        for n in MEMBERSHIP_NUMBERS
        for v in BAD_NUMBERS
        if not (n == "max_commit_lease_s" and v == 0 and v is not False)
    ],
    ids=repr,
)
def test_every_membership_number_rejects_nonfinite_negative_huge_and_wrong_types(name: str, value: Any) -> None:
    with pytest.raises(OptionsError) as raised:
        MembershipOptions(**{name: value})
    assert str(raised.value).startswith(f"{name}={value!r} "), str(raised.value)


@pytest.mark.parametrize(
    ("name", "value"),
    # Port 0 is valid (any free port), so it is the one pair left out.
    [(n, v) for n in LIGHTHOUSE_NUMBERS for v in BAD_NUMBERS if not (n.endswith("port") and v == 0 and v is not False)],
    ids=repr,
)
def test_every_lighthouse_number_rejects_nonfinite_negative_huge_and_wrong_types(name: str, value: Any) -> None:
    with pytest.raises(OptionsError) as raised:
        LighthouseOptions(**{name: value})
    assert str(raised.value).startswith(f"{name}={value!r} "), str(raised.value)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"port": 65536}, "port=65536 is outside [0, 65535]"),
        ({"status_port": 70000}, "status_port=70000 is outside [0, 65535]"),
        (
            {"tick_s": 0.5, "membership": MembershipOptions(heartbeat_timeout_s=1.0)},
            "tick_s=0.5 is too coarse for heartbeat_timeout_s=1.0",
        ),
        ({"token": ""}, "token is empty"),
        ({"host": ""}, "host=''; give an address to bind"),
    ],
)
def test_invalid_options_rejected_naming_the_value(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(OptionsError) as raised:
        LighthouseOptions(**fields)
    assert str(raised.value).startswith(message)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (
            {"heartbeat_timeout_s": 5.0, "progress_timeout_s": 5.0},
            "progress_timeout_s=5.0 is not above heartbeat_timeout_s=5.0",
        ),
        (
            {"heartbeat_timeout_s": 0.2, "progress_timeout_s": 5.0, "hung_min_s": 0.25},
            "hung_min_s=0.25 is above heartbeat_timeout_s=0.2",
        ),
        ({"join_timeout_s": 1e6}, "join_timeout_s=1000000.0 is outside [0.001, 86400]"),
    ],
)
def test_inconsistent_membership_options_rejected(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(OptionsError) as raised:
        MembershipOptions(**fields)
    assert str(raised.value).startswith(message)


@pytest.mark.parametrize(("heartbeat_timeout_s", "hung_min_s"), [(2.0, 0.25), (0.25, 0.25), (0.1, 0.1), (0.02, 0.02)])
def test_the_default_hung_floor_never_exceeds_the_heartbeat_timeout(
    heartbeat_timeout_s: float, hung_min_s: float
) -> None:
    """torchft's own lighthouse test runs with ``heartbeat_timeout_ms=100``: a fixed 0.25 s floor refused it."""
    options = MembershipOptions(heartbeat_timeout_s=heartbeat_timeout_s)
    assert options.hung_min_s == hung_min_s and options.liveness.hung_min_s == hung_min_s


def test_coarse_tick_allowed_with_long_timeouts() -> None:
    membership = MembershipOptions(heartbeat_timeout_s=2.5, progress_timeout_s=5.0, hung_min_s=1.25)
    assert LighthouseOptions(tick_s=0.5, membership=membership).tick_s == 0.5


def test_token_read_from_given_environment_only() -> None:
    assert LighthouseOptions.token_from_env({"REPLICAFT_TOKEN": "t"}) == "t"
    assert LighthouseOptions.token_from_env({}) is None


def test_empty_token_variable_is_an_error_not_authentication_off() -> None:
    with pytest.raises(OptionsError, match="REPLICAFT_TOKEN is set but empty"):
        LighthouseOptions.token_from_env({"REPLICAFT_TOKEN": ""})


@pytest.mark.parametrize(
    ("flag", "value", "field"),
    [
        ("--heartbeat-timeout", "nan", "heartbeat_timeout_s=nan"),
        ("--progress-timeout", "inf", "progress_timeout_s=inf"),
        ("--join-timeout", "-1", "join_timeout_s=-1.0"),
        ("--hung-factor", "nan", "hung_factor=nan"),
        ("--hung-min", "1e30", "hung_min_s=1e+30"),
        ("--min-replicas", "0", "min_replicas=0"),
        ("--port", "99999", "port=99999"),
    ],
)
def test_cli_refuses_bad_numbers_with_one_line_and_code_2(
    flag: str, value: str, field: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([flag, value]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"replicaft-lighthouse: error: {field} ") and err.count("\n") == 1, err
