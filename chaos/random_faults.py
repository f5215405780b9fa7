"""Randomly timed faults for long runs (the soak scenario), expanded into plain fault tables. Pure.

A ``[random_faults]`` table in a scenario file stands for many ``[[faults]]`` entries: faults
arrive as a Poisson process (exponential gaps with mean ``every_s``) from the first commit
until ``until_s``, each of a kind and at a group drawn uniformly. The expansion is seeded, so
a scenario file is still one fixed experiment: the same file gives the same faults, and
``summary.json`` lists every one of them.

Only kinds that need no further parameters than a target (and a duration for ``sigstop``) can
be drawn; the rest are placed by hand.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

DRAWABLE_KINDS = ("sigkill", "sigstop", "sigterm", "kill_lighthouse")


@dataclass(frozen=True, kw_only=True, slots=True)
class RandomFaults:
    every_s: float
    """Mean seconds between two faults."""
    until_s: float
    """No fault is placed later than this many seconds after the first commit."""
    kinds: tuple[str, ...] = field(default=DRAWABLE_KINDS)
    seed: int = 0
    sigstop_duration_s: float = 3.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "kinds", tuple(self.kinds))
        for name in ("every_s", "until_s", "sigstop_duration_s"):
            if not isinstance(getattr(self, name), int | float) or not getattr(self, name) > 0:
                raise ValueError(f"random_faults.{name}={getattr(self, name)!r}; it must be a positive number of seconds")
        bad = [k for k in self.kinds if k not in DRAWABLE_KINDS]
        if not self.kinds or bad:
            raise ValueError(f"random_faults.kinds={list(self.kinds)!r}; choose among {list(DRAWABLE_KINDS)}")

    def expand(self, group_ids: tuple[str, ...]) -> list[dict[str, Any]]:
        """The fault tables, in time order (``at_s`` rounded to 0.1 s)."""
        rng = random.Random(self.seed)
        out: list[dict[str, Any]] = []
        t = 0.0
        while True:
            t += rng.expovariate(1.0 / self.every_s)
            if t > self.until_s:
                return out
            kind = rng.choice(self.kinds)
            fault: dict[str, Any] = {"kind": kind, "at_s": round(t, 1)}
            if kind != "kill_lighthouse":
                fault["target"] = rng.choice(group_ids)
            if kind == "sigstop":
                fault["duration_s"] = self.sigstop_duration_s
            out.append(fault)


def random_faults_from_dict(raw: Any) -> RandomFaults:
    """Build from a parsed ``[random_faults]`` table; raises ValueError naming the bad key."""
    if not isinstance(raw, dict):
        raise ValueError(f"random_faults is {raw!r}; write it as a [random_faults] table")
    known = set(RandomFaults.__dataclass_fields__)
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ValueError(f"random_faults has unknown keys {unknown}; known keys are {sorted(known)}")
    try:
        return RandomFaults(**raw)
    except TypeError as e:
        raise ValueError(f"random_faults: {e}") from None
