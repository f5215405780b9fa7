"""The shape of a state skeleton (state.py): plain values, with tensors, tuples and
non-string-keyed dicts as tagged maps. Torch-free, so the heal manifest (transfer/manifest.py)
can check a donor's skeleton when it decodes it, before any vote or allocation.
"""

from __future__ import annotations

from typing import Any

TENSOR = "__tensor__"
TUPLE = "__tuple__"
DICT = "__dict__"
MAX_DEPTH = 200
"""Nesting deeper than this is refused: no state dict nests that deep, and a checker that
recursed would raise RecursionError on a hostile skeleton instead of saying what is wrong."""


class SkeletonError(ValueError):
    """A skeleton that no ``flatten`` could have produced."""


def check_skeleton(skeleton: Any, num_tensors: int) -> None:
    """Raise SkeletonError unless ``skeleton`` is a map of plain values whose tensor references
    name each of ``num_tensors`` tensors exactly once."""
    if not isinstance(skeleton, dict):
        raise SkeletonError(f"the state skeleton must be a map, got {type(skeleton).__name__}")
    seen: set[int] = set()
    stack: list[tuple[Any, str, int]] = [(skeleton, "state", 0)]
    while stack:
        value, path, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise SkeletonError(f"state skeleton at {path[:200]} nests deeper than {MAX_DEPTH} levels")
        if value is None or isinstance(value, (bool, int, float, str, bytes)):
            continue
        if isinstance(value, list):
            stack.extend((v, f"{path}[{i}]", depth + 1) for i, v in enumerate(value))
            continue
        if not isinstance(value, dict):
            raise SkeletonError(f"state skeleton at {path}: a value of type {type(value).__name__}")
        if TENSOR in value:
            index = value[TENSOR]
            if len(value) != 1 or type(index) is not int or not 0 <= index < num_tensors or index in seen:
                raise SkeletonError(f"state skeleton at {path}: tensor reference {value!r:.80} is not one of "
                                    f"the {num_tensors} tensors, each named once")
            seen.add(index)
        elif TUPLE in value:
            items = value[TUPLE]
            if len(value) != 1 or not isinstance(items, list):
                raise SkeletonError(f"state skeleton at {path}: a tuple must be {{{TUPLE!r}: [items]}}")
            stack.extend((v, f"{path}[{i}]", depth + 1) for i, v in enumerate(items))
        elif DICT in value:
            pairs = value[DICT]
            if len(value) != 1 or not isinstance(pairs, list) or not all(
                    isinstance(p, list) and len(p) == 2 and (p[0] is None or isinstance(p[0], (str, int, float, bool)))
                    for p in pairs):
                raise SkeletonError(f"state skeleton at {path}: a keyed map must be {{{DICT!r}: [[key, value], ...]}} "
                                    "with plain keys")
            stack.extend((v, f"{path}[{k!r}]", depth + 1) for k, v in pairs)
        else:
            for k, v in value.items():
                if not isinstance(k, str):
                    raise SkeletonError(f"state skeleton at {path}: key {k!r:.40} of a plain map is not a string")
                stack.append((v, f"{path}.{k}", depth + 1))
    if len(seen) != num_tensors:
        raise SkeletonError(f"state skeleton names {len(seen)} of its {num_tensors} tensors; every tensor must be named")
