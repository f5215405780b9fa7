"""Range checks for configuration numbers, shared by every options dataclass of the lighthouse.

A NaN compares false with everything, so ``value <= 0`` lets it through, and a NaN heartbeat
timeout then never expires: hung members were never dropped and quorums never formed (issue
19). Infinity does the same more honestly. So every number an option holds goes through
:func:`check_number` once, when the options are built: a real number (a bool is refused, it
would read as 0 or 1), finite, inside ``[lo, hi]``. The bounds are the edges of what the
system can act on, not taste: a timeout above a day is a typo for "never", and "never" is
not an option here.
"""

from __future__ import annotations

import math
from typing import Any

from lighthouse.errors import OptionsError

MAX_SECONDS = 24 * 3600.0
"""The longest any lighthouse timeout may be: a day. Longer reads as "never", which no wait
of the lighthouse may be."""


def check_number(
    name: str,
    value: Any,
    lo: float,
    hi: float,
    *,
    integer: bool = False,
    fix: str = "",
    error: type[Exception] = OptionsError,
) -> None:
    """Raise ``error`` naming ``name``, the value and the allowed range unless ``value`` is
    a finite number (an ``int`` when ``integer``) with ``lo <= value <= hi``.

    ``error`` lets replicaft's options raise their own ``OptionsError`` (a subclass of this
    package's) through the same rule, as ``check_replica_id`` does."""
    hint = f"; {fix}" if fix else ""
    kind = "an integer" if integer else "a number"
    if isinstance(value, bool) or not isinstance(value, int if integer else (int, float)):
        raise error(f"{name}={value!r} is {type(value).__name__}; expected {kind} in [{lo:g}, {hi:g}]{hint}")
    if not math.isfinite(value) or not lo <= value <= hi:
        raise error(f"{name}={value!r} is outside [{lo:g}, {hi:g}]; expected {kind} in that range{hint}")


def check_seconds(
    name: str, value: Any, lo: float = 0.001, hi: float = MAX_SECONDS, *, error: type[Exception] = OptionsError
) -> None:
    """A duration: finite, at least ``lo`` (a millisecond: zero or less would fire at once) and
    at most ``hi``."""
    check_number(name, value, lo, hi, fix=f"give {name} in seconds, e.g. 2.0", error=error)
