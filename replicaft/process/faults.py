"""Named fault points: kill this process at a chosen point of a chosen step (for chaos tests).

``ManagerOptions.fault_points`` (``REPLICAFT_FAULT_POINTS``) is a comma-separated list of
``point@step`` entries, e.g. ``allreduce@5,heal@0``. When the manager reaches ``point`` while
at ``step``, the process sends itself SIGKILL: a real, unannounced death at an exact place,
which is what the chaos harness needs to test "killed mid-all-reduce" deterministically.

Points: ``allreduce`` (after the first bucket's collective was issued, before it completes),
``heal`` (a healer, after its transfer started), ``serve`` (a donor, after publishing its
snapshot), ``commit`` (after the vote, before the step is applied).

One point slows instead of killing: ``slow_serve@N`` makes this rank's state server wait
``SLOW_SERVE_S`` before each range it serves once the rank has reached step N — a slow donor
link, so a heal outlasts several steps (what the non-blocking heal must absorb).

One writes: ``write_served@N`` makes a donor write its largest optimizer tensor in place right
after publishing the first snapshot it serves at step N or later, as user code misusing the
state during forward would: the snapshot served live must then be withdrawn (live.py), and
no healer may apply it.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable

from replicaft.errors import OptionsError

POINTS = frozenset({"allreduce", "heal", "serve", "commit", "slow_serve", "write_served"})
SLOW_SERVE_S = 1.5
"""Per range: long against a test job's step (tens of ms; a restarted rank's first step, with
its lazy set-up, has taken over 0.5 s), so a slowed heal reliably outlasts a step or more."""


def parse_fault_points(spec: str | None) -> frozenset[tuple[str, int]]:
    if not spec:
        return frozenset()
    points = set()
    for item in spec.split(","):
        name, _, step = item.strip().partition("@")
        if name not in POINTS or not (step.isascii() and step.isdigit()):
            raise OptionsError(
                f"fault point {item!r} is not point@step with point in {sorted(POINTS)} (e.g. allreduce@5)"
            )
        points.add((name, int(step)))
    return frozenset(points)


def reached(points: frozenset[tuple[str, int]], name: str, step: int) -> None:
    if (name, step) in points:
        os.kill(os.getpid(), signal.SIGKILL)


def slow_serve_hook(
    points: frozenset[tuple[str, int]], current_step: Callable[[], int]
) -> Callable[[int, int, memoryview], memoryview] | None:
    """A state-server range hook that delays serving from the ``slow_serve`` step on, or None."""
    steps = [step for name, step in points if name == "slow_serve"]
    if not steps:
        return None
    first = min(steps)

    def hook(start: int, stop: int, data: memoryview) -> memoryview:
        if current_step() >= first:
            time.sleep(SLOW_SERVE_S)
        return data

    return hook


def write_served_due(points: frozenset[tuple[str, int]], step: int) -> bool:
    """Whether a snapshot served at ``step`` falls under a ``write_served`` point (the caller
    disarms it after the first write)."""
    return any(name == "write_served" and step >= at for name, at in points)
