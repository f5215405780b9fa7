"""The shape a state skeleton must have (replicaft/state/skeleton.py), checked before a heal trusts it."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from replicaft.state.flat import flatten
from replicaft.state.skeleton import MAX_DEPTH, TENSOR, SkeletonError, check_skeleton, misplaced_tensor


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


def test_every_tensor_flatten_makes_is_named_by_its_place() -> None:
    flat = flatten(
        {
            "model": {"w": torch.zeros(2), "layers": [torch.ones(1), (torch.ones(1), 3)]},
            "optimizer": {"state": {0: {"exp_avg": torch.zeros(2)}}, "groups": [{"lr": 0.1}]},
            "keyed": {1.5: torch.zeros(1), "it's": torch.ones(1), None: torch.ones(1), True: torch.ones(1)},
        }
    )
    assert misplaced_tensor(flat.skeleton, flat.names) is None


@pytest.mark.parametrize(
    ("skeleton", "names", "found"),
    [
        ({"m": {"v": {TENSOR: 0}}}, ["state.m.w"], (0, "state.m.v")),
        ({"m": {"w": {TENSOR: 1}, "b": {TENSOR: 0}}}, ["state.m.w", "state.m.b"], (0, "state.m.b")),
        ({"m": [{TENSOR: 0}]}, ["state.m.0"], (0, "state.m[0]")),
        ({"m": {"__dict__": [[0, {TENSOR: 0}]]}}, ["state.m['0']"], (0, "state.m[0]")),
        ({"m": {"__tuple__": [1, {TENSOR: 0}]}}, ["state.m[0]"], (0, "state.m[1]")),
        ({"k" * 10_000: {TENSOR: 0}}, ["state.w"], (0, "state.k")),
    ],
    ids=["renamed", "swapped", "list_index", "keyed_by_repr", "tuple_index", "long_key_cut_short"],
)
def test_a_tensor_placed_elsewhere_than_its_name_is_found(
    skeleton: Any, names: list[str], found: tuple[int, str]
) -> None:
    check_skeleton(skeleton, len(names))
    index, place = misplaced_tensor(skeleton, names) or (None, "")
    assert (index, place[: len(found[1])]) == found
    assert len(place) <= len(names[index]) + 1
