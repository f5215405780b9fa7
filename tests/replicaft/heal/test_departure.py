"""The rule for a heal whose donors all left (replicaft/heal/departure.py), as a table."""

from __future__ import annotations

import pytest

from replicaft.heal.departure import departed_at


@pytest.mark.parametrize(
    ("donors", "left", "reached", "expected"),
    [
        (("g0",), {"g0": 20}, 20, 20),  # the one donor left where base + records reach
        (("g0", "g1"), {"g0": 20, "g1": 20}, 20, 20),
        (("g0", "g1"), {"g0": 20}, 20, None),  # g1 still trains: it will step with the healer
        (("g0",), {"g0": 21}, 20, None),  # a step the healer did not record: it lacks it
        (("g0",), {"g0": 19}, 20, None),  # a recorded step the donor did not commit
        (("g0", "g1"), {"g0": 20, "g1": 19}, 20, None),  # donors disagree
        (("g0",), {"g0": -1}, -1, None),  # a lighthouse that did not say the step
        (("g0",), {"g0": -1}, 20, None),
        ((), {"g0": 20}, 20, None),  # no donor: nothing was fetched from anyone
        (("g0",), {}, 20, None),
    ],
)
def test_departed_at(donors: tuple[str, ...], left: dict[str, int], reached: int, expected: int | None) -> None:
    assert departed_at(donors, left, reached) == expected
