"""The shape a state skeleton must have (replicaft/state/skeleton.py), checked before a heal trusts it."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from replicaft.state.flat import flatten
from replicaft.state.skeleton import MAX_DEPTH, SkeletonError, check_skeleton


def test_every_skeleton_flatten_makes_passes() -> None:
    flat = flatten(
        {"m": {"w": torch.zeros(2)}, "t": (1, torch.ones(1)), "k": {3: "x", None: [torch.zeros(1)]}, "s": "v"}
    )
    check_skeleton(flat.skeleton, len(flat.tensors))


def _deep(levels: int) -> dict[str, Any]:
    value: Any = 1
    for _ in range(levels):
        value = [value]
    return {"deep": value}


@pytest.mark.parametrize(
    ("skeleton", "num_tensors", "message"),
    [
        ([], 0, "must be a map, got list"),
        ({"w": {"__tensor__": 1}}, 1, "state.w: tensor reference"),
        ({"w": {"__tensor__": True}}, 1, "state.w: tensor reference"),
        ({"w": {"__tensor__": 0, "x": 1}}, 1, "state.w: tensor reference"),
        ({"a": {"__tensor__": 0}, "b": {"__tensor__": 0}}, 1, "tensor reference"),
        ({"w": {"__tensor__": 0}}, 2, "names 1 of its 2 tensors"),
        ({"t": {"__tuple__": 5}}, 0, "state.t: a tuple must be"),
        ({"d": {"__dict__": [[1]]}}, 0, "state.d: a keyed map must be"),
        ({"d": {"__dict__": [[[1], 2]]}}, 0, "state.d: a keyed map must be"),
        ({"p": {1: 2}}, 0, "key 1 of a plain map is not a string"),
        (_deep(MAX_DEPTH + 5), 0, f"nests deeper than {MAX_DEPTH} levels"),
    ],
)
def test_malformed_skeleton_rejected_naming_where(skeleton: Any, num_tensors: int, message: str) -> None:
    with pytest.raises(SkeletonError, match=message):
        check_skeleton(skeleton, num_tensors)
