"""Named fault points: kill this process at a chosen point of a chosen step (for chaos tests).

``ManagerOptions.fault_points`` (``REPLICAFT_FAULT_POINTS``) is a comma-separated list of
``point@step`` entries, e.g. ``allreduce@5,heal@0``. When the manager reaches ``point`` while
at ``step``, the process sends itself SIGKILL: a real, unannounced death at an exact place,
which is what the chaos harness needs to test "killed mid-all-reduce" deterministically.

Points: ``allreduce`` (after the first bucket's collective was issued, before it completes),
``heal`` (a healer, after its transfer started), ``serve`` (a donor, after publishing its
snapshot), ``commit`` (after the vote, before the step is applied).
"""

from __future__ import annotations

import os
import signal

from replicaft.errors import OptionsError

POINTS = frozenset({"allreduce", "heal", "serve", "commit"})


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
