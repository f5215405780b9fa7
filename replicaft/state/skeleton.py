"""The shape of a state skeleton (replicaft/state/flat.py): plain values, with tensors, tuples and
non-string-keyed dicts as tagged maps. Torch-free, so the heal manifest (transfer/manifest.py)
can check a donor's skeleton when it decodes it, before any vote or allocation.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from lighthouse.errors import shown

TENSOR = "__tensor__"
TUPLE = "__tuple__"
DICT = "__dict__"
MAX_DEPTH = 200
"""Nesting deeper than this is refused: no state dict nests that deep, and a checker that
recursed would raise RecursionError on a hostile skeleton instead of saying what is wrong."""


class SkeletonError(ValueError):
    """A skeleton that no ``flatten`` could have produced."""


Where = tuple[Any, Any] | None
"""A place in a skeleton as a linked list: (the parent's place, the step from it) where the step
is a list index (int), a plain map's key (str) or a keyed map's key (a 1-tuple)."""
MAX_PATH_CHARS = 300


def check_skeleton(skeleton: Any, num_tensors: int) -> None:
    """Raise SkeletonError unless ``skeleton`` is a map of plain values whose tensor references
    name each of ``num_tensors`` tensors exactly once.

    A value's place is kept as a link to its parent's and spelled out only for an error: a
    path string per value copied its parent's, so a 100 KB key above 2000 values took 200 MB
    (a donor's manifest may be 64 MB; issue 19)."""
    if not isinstance(skeleton, dict):
        raise SkeletonError(f"the state skeleton must be a map, got {type(skeleton).__name__}")
    seen: set[int] = set()
    stack: list[tuple[Any, Where, int]] = [(skeleton, None, 0)]
    while stack:
        value, where, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise SkeletonError(f"state skeleton at {_path(where)} nests deeper than {MAX_DEPTH} levels")
        if value is None or isinstance(value, (bool, int, float, str, bytes)):
            continue
        if isinstance(value, list):
            stack.extend((v, (where, i), depth + 1) for i, v in enumerate(value))
            continue
        if not isinstance(value, dict):
            raise SkeletonError(f"state skeleton at {_path(where)}: a value of type {type(value).__name__}")
        if TENSOR in value:
            index = value[TENSOR]
            if len(value) != 1 or type(index) is not int or not 0 <= index < num_tensors or index in seen:
                raise SkeletonError(
                    f"state skeleton at {_path(where)}: tensor reference {shown(value)} is not one "
                    f"of the {num_tensors} tensors, each named once"
                )
            seen.add(index)
        elif TUPLE in value:
            items = value[TUPLE]
            if len(value) != 1 or not isinstance(items, list):
                raise SkeletonError(f"state skeleton at {_path(where)}: a tuple must be {{{TUPLE!r}: [items]}}")
            stack.extend((v, (where, i), depth + 1) for i, v in enumerate(items))
        elif DICT in value:
            pairs = value[DICT]
            if (
                len(value) != 1
                or not isinstance(pairs, list)
                or not all(
                    isinstance(p, list) and len(p) == 2 and (p[0] is None or isinstance(p[0], (str, int, float, bool)))
                    for p in pairs
                )
            ):
                raise SkeletonError(
                    f"state skeleton at {_path(where)}: a keyed map must be "
                    f"{{{DICT!r}: [[key, value], ...]}} with plain keys"
                )
            stack.extend((v, (where, (k,)), depth + 1) for k, v in pairs)
        else:
            for k, v in value.items():
                if not isinstance(k, str):
                    raise SkeletonError(
                        f"state skeleton at {_path(where)}: key {shown(k)} of a plain map is not a string"
                    )
                stack.append((v, (where, k), depth + 1))
    if len(seen) != num_tensors:
        raise SkeletonError(
            f"state skeleton names {len(seen)} of its {num_tensors} tensors; every tensor must be named"
        )


def _path(where: Where) -> str:
    """``state.model[3]['k']``: the place ``where`` spelled out, at most MAX_PATH_CHARS long."""
    text = "state"
    for step in _steps(where):
        if isinstance(step, int):
            text += f"[{step}]"
        elif isinstance(step, tuple):
            text += f"[{shown(step[0])}]"
        else:
            text += f".{step[:40]}" + ("..." if len(step) > 40 else "")
    return text if len(text) <= MAX_PATH_CHARS else "..." + text[-MAX_PATH_CHARS:]


def misplaced_tensor(skeleton: Any, names: Sequence[str]) -> tuple[int, str] | None:
    """The lowest-numbered tensor whose place in ``skeleton`` is not the name ``names`` gives it:
    (its index, its place as ``flatten`` spells names, cut short once it cannot match), or None
    when every tensor's name is its place. ``skeleton`` must have passed :func:`check_skeleton` for
    ``len(names)`` tensors.

    ``flatten`` names each tensor by its place (``state.model.weight``), so the two agree in
    any state it made. A heal manifest carries both, and the healer checks the tensors it
    receives by name (dtype, shape) but puts them where the skeleton says: a skeleton that
    places a tensor elsewhere than its name would load it into the wrong parameter, unseen by
    every check by name. Spelling a place stops one character past its name's length, so a
    hostile skeleton costs at most the length of the names it carries."""
    found: tuple[int, str] | None = None
    stack: list[tuple[Any, Where]] = [(skeleton, None)]
    while stack:
        value, where = stack.pop()
        if isinstance(value, list):
            stack.extend((v, (where, i)) for i, v in enumerate(value))
        elif isinstance(value, dict):
            if TENSOR in value:
                index = value[TENSOR]
                if found is not None and index > found[0]:
                    continue
                place = _place(where, len(names[index]) + 1)
                if place != names[index]:
                    found = index, place
            elif TUPLE in value:
                stack.extend((v, (where, i)) for i, v in enumerate(value[TUPLE]))
            elif DICT in value:
                stack.extend((v, (where, (k,))) for k, v in value[DICT])
            else:
                stack.extend((v, (where, k)) for k, v in value.items())
    return found


def _place(where: Where, limit: int) -> str:
    """``where`` spelled exactly as ``flatten`` names a tensor there, or its first ``limit`` characters."""
    text = "state"
    for step in _steps(where):
        if isinstance(step, int):
            text += f"[{step}]"
        elif isinstance(step, tuple):
            key = step[0]
            # A key longer than the limit cannot match; its repr would copy all of it.
            text += f"[{key[:limit]}" if isinstance(key, str) and len(key) > limit else f"[{key!r}]"
        else:
            text += f".{step[:limit]}"
        if len(text) >= limit:
            return text[:limit]
    return text


def _steps(where: Where) -> list[Any]:
    """The steps from the skeleton's root to ``where``, in order."""
    steps = []
    while where is not None:
        where, step = where
        steps.append(step)
    return steps[::-1]
