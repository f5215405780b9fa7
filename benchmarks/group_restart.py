"""What one replica group's restart costs, under whichever engine restarts it: the common part
of ``ray_restart`` and ``slurm_restart``, and their shared baseline, the same restart under
``replicaft-launch`` on this machine.

Every run is three groups of ``examples/train_ddp.py`` (paced by ``--step-delay``, so the
machine is not saturated by the survivors) writing their events to a folder. A restart is
measured from the moment the engine is told to take group ``g1`` down (a SIGKILL of its rank,
or Slurm's requeue) to three events of the group that comes back: its ``start`` (the engine's
part: detection, scheduling, a new process), its ``heal_end`` and its first ``committed`` step
(what the issue asks: kill to first commit). Between two restarts the group commits a few
steps, so each one starts from a group in the quorum.
"""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from replicaft.process.process_tree import dying_with_parent
from replicaft.telemetry.events import EventTail

REPO_ROOT = Path(__file__).resolve().parent.parent
SCRIPT = str(REPO_ROOT / "examples" / "train_ddp.py")
SCRIPT_ARGS = ("--steps", "1000000", "--step-delay", "0.05")
"""Runs until the benchmark stops it; 20 steps a second."""
VICTIM = "g1"
GROUPS = ("g0", "g1", "g2")
START_TIMEOUT_S = 240.0
RESTART_TIMEOUT_S = 400.0
"""A Slurm requeue waits 120 s (cred_expire) before the task may start again, on a loaded machine more."""
STEPS_BETWEEN_RESTARTS = 10


@dataclass(frozen=True)
class Restart:
    start_s: float
    """Kill to the new process's ``start`` event."""
    heal_s: float
    """Kill to its ``heal_end``."""
    commit_s: float
    """Kill to its first committed step."""


class Events:
    """The events of one run's folder, read as they are appended."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self._tail = EventTail(directory)
        self.seen: list[dict[str, Any]] = []

    def wait(
        self,
        predicate: Callable[[dict[str, Any]], bool],
        timeout_s: float,
        what: str,
        alive: Callable[[], bool] = lambda: True,
    ) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        for e in self.seen:
            if predicate(e):
                return e
        while time.monotonic() < deadline:
            new = self._tail.poll()
            self.seen.extend(new)
            for e in new:
                if predicate(e):
                    return e
            if not alive():
                raise RuntimeError(f"the run ended while waiting for {what}")
            time.sleep(0.05)
        raise RuntimeError(f"no event {what} within {timeout_s:g}s")

    def latest(self, event: str, replica_id: str) -> dict[str, Any]:
        self.wait(
            lambda e: e["event"] == event and e["replica_id"] == replica_id, START_TIMEOUT_S, f"{event} of {replica_id}"
        )
        return [e for e in self.seen if e["event"] == event and e["replica_id"] == replica_id][-1]

    def committed(
        self,
        replica_id: str,
        min_step: int,
        after_ts: float = 0.0,
        timeout_s: float = START_TIMEOUT_S,
        alive: Callable[[], bool] = lambda: True,
    ) -> dict[str, Any]:
        return self.wait(
            lambda e: (
                e["event"] == "committed"
                and e["replica_id"] == replica_id
                and e["step"] >= min_step
                and e["ts"] > after_ts
            ),
            timeout_s,
            f"{replica_id} committed step {min_step}",
            alive,
        )


def _victims(event: str, after_ts: float) -> Callable[[dict[str, Any]], bool]:
    return lambda e: e["event"] == event and e["replica_id"] == VICTIM and e["ts"] > after_ts


def measure_restarts(
    events: Events, take_down: Callable[[dict[str, Any]], None], count: int, alive: Callable[[], bool] = lambda: True
) -> list[Restart]:
    """Take ``VICTIM`` down ``count`` times (``take_down`` is given its latest ``start`` event)."""
    for rid in GROUPS:
        events.committed(rid, 3, alive=alive)
    restarts = []
    for _ in range(count):
        start = events.latest("start", VICTIM)
        at = time.time()
        take_down(start)
        new = events.wait(_victims("start", at), RESTART_TIMEOUT_S, f"{VICTIM} started again", alive)
        # After the new process's start: a group told to go (Slurm's requeue sends SIGTERM) commits
        # a step or two more before it leaves.
        heal = events.wait(_victims("heal_end", new["ts"]), RESTART_TIMEOUT_S, f"{VICTIM} healed", alive)
        first = events.committed(VICTIM, 0, new["ts"], RESTART_TIMEOUT_S, alive)
        restarts.append(Restart(new["ts"] - at, heal["ts"] - at, first["ts"] - at))
        events.committed(VICTIM, first["step"] + STEPS_BETWEEN_RESTARTS, at, RESTART_TIMEOUT_S, alive)
    return restarts


def sigkill_rank(start: dict[str, Any]) -> None:
    os.kill(start["pid"], signal.SIGKILL)


def summary(prefix: str, restarts: Sequence[Restart]) -> dict[str, float]:
    """``<prefix>_s`` (kill to first commit, median) and its parts, and the worst."""
    return {
        f"{prefix}_s": statistics.median(r.commit_s for r in restarts),
        f"{prefix}_max_s": max(r.commit_s for r in restarts),
        f"{prefix}_to_start_s": statistics.median(r.start_s for r in restarts),
        f"{prefix}_to_heal_s": statistics.median(r.heal_s for r in restarts),
    }


def spawn(args: Sequence[str], env: Mapping[str, str], log: Path, cwd: Path = REPO_ROOT) -> subprocess.Popen[bytes]:
    """A child in a session of its own (so its whole tree can be signalled), dying with us."""
    with open(log, "ab") as out:
        return subprocess.Popen(
            dying_with_parent(args),
            env=dict(env),
            cwd=cwd,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )


def stop(process: subprocess.Popen[bytes], timeout_s: float = 60.0) -> None:
    """SIGTERM, then SIGKILL to the child's session if it lingers."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout_s)


def launcher_restarts(root: Path, count: int, python: str) -> list[Restart]:
    """The baseline: ``replicaft-launch --groups 3`` with its defaults, ``g1``'s rank SIGKILLed."""
    events = Events(root / "launch-events")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    launcher = spawn(
        [
            python,
            "-m",
            "replicaft.launch",
            "--groups",
            "3",
            "--events-dir",
            str(events.directory),
            SCRIPT,
            *SCRIPT_ARGS,
        ],
        env,
        root / "launch.log",
    )
    try:
        return measure_restarts(events, sigkill_rank, count, alive=lambda: launcher.poll() is None)
    finally:
        stop(launcher)
