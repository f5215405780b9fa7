"""ManagerOptions.from_env over arbitrary environments: it builds options or raises OptionsError,
never anything else (issue 19: values the options accepted failed later with a traceback).

The environment is the one input of a training process nobody types twice, so every string
any variable may hold is fair game: numbers in every spelling (``nan``, ``1e999``, ``-0``,
``1_000``, non-ASCII digits), paths with NUL bytes, empty strings, misspelt names.
"""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from replicaft.config.option_ranges import NUMBER_RANGES
from replicaft.config.options import KNOWN_VARIABLES, ManagerOptions
from replicaft.errors import OptionsError

NAMES = sorted(KNOWN_VARIABLES) + [
    "RANK",
    "WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "REPLICAFT_QUORUM_TIMEOUT",
    "REPLICAFT_",
    "REPLICAFT_TOKENS",
]
"""Every variable from_env reads, plus misspellings of them."""

NUMBERISH = st.sampled_from(
    [
        "nan",
        "-nan",
        "inf",
        "-inf",
        "1e999",
        "1e6",
        "1e12",
        "-1",
        "0",
        "-0",
        "0.0",
        "1",
        "2",
        "10",
        "65536",
        "86400",
        "86401",
        str(2**63),
        "1_000",
        "\u0661\u0662",
        " 7 ",
        "0x10",
        "1.5",
        "true",
        "1e-9",
    ]
)
VALUES = st.one_of(
    NUMBERISH,
    st.text(max_size=40),
    st.sampled_from(["", "127.0.0.1:1", "g0", "gloo", "auto", "s3://bucket/p", "/tmp", "allreduce@5"]),
)
ENVIRONMENTS = st.dictionaries(st.sampled_from(NAMES), VALUES, max_size=8)


@settings(max_examples=400, deadline=None)
@given(env=ENVIRONMENTS, required=st.booleans())
def test_from_env_over_arbitrary_variables_builds_or_raises_options_error(env: dict[str, str], required: bool) -> None:
    if required:
        env = {"REPLICAFT_LIGHTHOUSE": "127.0.0.1:29510", "REPLICAFT_REPLICA_ID": "g0", **env}
    try:
        options = ManagerOptions.from_env(env)
    except OptionsError:
        return
    for name, (lo, hi, _) in NUMBER_RANGES.items():
        value = getattr(options, name)
        assert math.isfinite(value) and lo <= value <= hi, (name, value)
