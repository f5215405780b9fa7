"""LighthouseOptions (lighthouse/options.py): checked once, when built."""

from __future__ import annotations

from typing import Any

import pytest

from lighthouse.errors import OptionsError
from lighthouse.membership import MembershipOptions
from lighthouse.options import LighthouseOptions


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"port": 65536}, "port=65536 is not a TCP port; use 0..65535"),
        ({"port": -1}, "port=-1 is not a TCP port"),
        ({"status_port": 70000}, "status_port=70000 is not a TCP port"),
        ({"tick_s": 0.0}, "tick_s=0.0; use a value in (0, 1]"),
        ({"tick_s": 0.5, "membership": MembershipOptions(heartbeat_timeout_s=1.0)},
         "tick_s=0.5 is too coarse for heartbeat_timeout_s=1.0"),
        ({"token": ""}, "token is empty"),
    ],
)
def test_invalid_options_rejected_naming_the_value(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(OptionsError) as raised:
        LighthouseOptions(**fields)
    assert str(raised.value).startswith(message)


def test_coarse_tick_allowed_with_long_heartbeat_timeout() -> None:
    options = LighthouseOptions(tick_s=0.5, membership=MembershipOptions(heartbeat_timeout_s=2.5, progress_timeout_s=5.0))
    assert options.tick_s == 0.5


def test_token_read_from_given_environment_only() -> None:
    assert LighthouseOptions.token_from_env({"REPLICAFT_TOKEN": "t"}) == "t"
    assert LighthouseOptions.token_from_env({"REPLICAFT_TOKEN": ""}) is None
    assert LighthouseOptions.token_from_env({}) is None
