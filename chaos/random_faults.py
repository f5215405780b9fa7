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

from lighthouse.errors import shown

DRAWABLE_KINDS = ("sigkill", "sigstop", "sigterm", "kill_lighthouse")
MAX_SECONDS = 1e9
"""No run lasts 30 years; a larger number (or inf, or NaN) is a typo."""
MAX_EXPECTED_FAULTS = 10_000
"""``until_s / every_s``, the mean number of faults drawn: the expansion is a loop over them
and every one becomes a fault table, so a ratio of 1e12 would hang the loader (issue 19)."""


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
        for name in ("every_s", "until_s", "sigstop_duration_s"):
            value = getattr(self, name)
            if type(value) not in (int, float) or not 0 < value <= MAX_SECONDS:
                raise ValueError(
                    f"random_faults.{name}={shown(value)}; it must be a positive number of seconds, "
                    f"at most {MAX_SECONDS:g}"
                )
        if self.until_s / self.every_s > MAX_EXPECTED_FAULTS:
            raise ValueError(
                f"random_faults: until_s={self.until_s:g} / every_s={self.every_s:g} expects "
                f"{self.until_s / self.every_s:.3g} faults; at most {MAX_EXPECTED_FAULTS} (raise every_s)"
            )
        if type(self.seed) is not int:
            raise ValueError(f"random_faults.seed={shown(self.seed)}; it must be a whole number")
        if not isinstance(self.kinds, list | tuple) or not all(isinstance(k, str) for k in self.kinds):
            raise ValueError(f"random_faults.kinds={shown(self.kinds)}; it must be an array of kind names")
        object.__setattr__(self, "kinds", tuple(self.kinds))
        bad = [k for k in self.kinds if k not in DRAWABLE_KINDS]
        if not self.kinds or bad:
            raise ValueError(f"random_faults.kinds={shown(list(self.kinds))}; choose among {list(DRAWABLE_KINDS)}")

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
        raise ValueError(f"random_faults is {shown(raw)}; write it as a [random_faults] table")
    known = set(RandomFaults.__dataclass_fields__)
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ValueError(f"random_faults has unknown keys {shown(unknown)}; known keys are {sorted(known)}")
    try:
        return RandomFaults(**raw)
    except TypeError as e:
        raise ValueError(f"random_faults: {e}") from None
