"""Tests of real training: starting a replica group, and what they read off its structured
event logs (events, digests, samples).

Shared by every test that runs real replica groups (test_training.py, test_checkpointing.py,
test_hsdp.py, test_multihost.py, test_launch.py, ...). Reading polls the logs under a
deadline; nothing here sleeps to synchronise.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from conftest import REPO_ROOT, ManagedProcess, spawn_python

EXAMPLE = str(REPO_ROOT / "examples" / "train_ddp.py")


def start_group(
    lighthouse: str,
    replica_id: str,
    events: Path,
    *args: str,
    fault_points: str | None = None,
    script: str = EXAMPLE,
    **options: str,
) -> ManagedProcess:
    """One replica group of ``script`` (one rank); ``options``: more ``REPLICAFT_*`` variables,
    e.g. ``REPLICAFT_HEAL_REPLAY_STEPS="1"``."""
    env = dict(os.environ)
    env.update(
        REPLICAFT_LIGHTHOUSE=lighthouse,
        REPLICAFT_REPLICA_ID=replica_id,
        REPLICAFT_EVENTS_DIR=str(events),
        REPLICAFT_COLLECTIVE_TIMEOUT_S="10",
        **options,
    )
    if fault_points:
        env["REPLICAFT_FAULT_POINTS"] = fault_points
    else:
        env.pop("REPLICAFT_FAULT_POINTS", None)
    return spawn_python(script, *args, name=replica_id, env=env)


def read_events(directory: Path) -> list[dict[str, Any]]:
    events = []
    for path in sorted(directory.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            try:
                events.append(json.loads(line))
            except ValueError:
                continue
    return events


class EventTail:
    """The events appended to a folder's logs since the last look: each call parses only the new
    complete lines. A long run's logs hold thousands of events, and parsing them all again
    every 50 ms (6 ms a time at 1500 events) took CPU from the processes under test."""

    def __init__(self, directory: Path) -> None:
        self._directory = directory
        self._offsets: dict[Path, int] = {}

    def new_events(self) -> list[dict[str, Any]]:
        events = []
        for path in sorted(self._directory.glob("*.jsonl")):
            offset = self._offsets.get(path, 0)
            with path.open("rb") as f:
                if f.seek(0, 2) < offset:  # rewritten from the start: read it again
                    offset = 0
                f.seek(offset)
                data = f.read()
            complete = data[: data.rfind(b"\n") + 1]  # a line still being written waits for the next look
            self._offsets[path] = offset + len(complete)
            for line in complete.decode("utf-8", errors="replace").splitlines():
                try:
                    events.append(json.loads(line))
                except ValueError:
                    continue
        return events


def wait_for_event(
    directory: Path,
    predicate: Callable[[dict[str, Any]], bool],
    timeout_s: float,
    what: str,
    process: ManagedProcess | None = None,
) -> dict[str, Any]:
    """The first event satisfying ``predicate``; polls the logs until the deadline, or until
    ``process`` (the launcher that writes them, say) exits, and then shows its output."""
    deadline = time.monotonic() + timeout_s
    tail = EventTail(directory)
    while time.monotonic() < deadline:
        exited = process is not None and process.popen.poll() is not None
        for e in tail.new_events():  # once more after an exit: what it wrote last is in the logs
            if predicate(e):
                return e
        if exited:
            break
        time.sleep(0.05)
    raise AssertionError(f"no event {what} within {timeout_s:g}s" + (f"\n{process.output_tail()}" if process else ""))


def kill_and_wait_for_heal(
    events: Path, pid: int, replica_id: str, timeout_s: float, process: ManagedProcess | None = None
) -> tuple[dict[str, Any], float]:
    """SIGKILL ``pid`` (a group's process) and wait for ``replica_id``'s first ``heal_end``
    after the kill, once a launcher has restarted it: returns that event and the kill's time
    (``time.time()``, the events' clock), from which the tests read the restarted group's events."""
    os.kill(pid, signal.SIGKILL)
    killed_at = time.time()
    heal = wait_for_event(
        events,
        lambda e: e["event"] == "heal_end" and e["replica_id"] == replica_id and e["ts"] > killed_at,
        timeout_s,
        f"{replica_id} healed after its restart",
        process,
    )
    return heal, killed_at


def commits(events: Path, replica_id: str) -> list[dict[str, Any]]:
    """``replica_id``'s committed steps' commit events."""
    return [
        e for e in read_events(events) if e["event"] == "commit" and e["replica_id"] == replica_id and e["committed"]
    ]


def final_history(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Events with the steps that a resume from disk rolled back removed.

    When every group dies, training resumes at checkpoint step k, and the steps after k that
    were committed before the failure are lost work, redone afterwards (possibly with other
    membership, so with other results): the run's history forks at k, and only the branch
    that continued counts.
    """
    resumes = [(e["ts"], e["checkpoint_step"]) for e in events if e["event"] == "resume"]
    return [
        e
        for e in events
        if not any(e["event"] in ("commit", "committed") and e["ts"] < ts and e["step"] > k for ts, k in resumes)
    ]


def assert_digests_agree(directory: Path, min_steps: int = 1) -> int:
    """Every group that committed a step holds the same state, rank by rank (column by column)."""
    by_step: dict[tuple[int, int], dict[str, str]] = defaultdict(dict)
    for e in final_history(read_events(directory)):
        if e["event"] == "committed":
            key = (e["step"], e["group_rank"])
            by_step[key].setdefault(e["replica_id"], e["digest"])
            assert by_step[key][e["replica_id"]] == e["digest"], (
                f"{e['replica_id']}/{e['group_rank']} committed step {e['step']} twice with different states"
            )
    steps = {step for step, _ in by_step}
    assert len(steps) >= min_steps, f"only {len(steps)} committed steps have digests"
    for (step, rank), digests in by_step.items():
        assert len(set(digests.values())) == 1, f"groups diverged at step {step}, rank {rank}: {digests}"
    return len(steps)


def assert_samples_exactly_once(directory: Path, min_steps: int = 1) -> None:
    """Every committed step covers the positions right after the previous one: none skipped,
    none repeated, whichever groups committed it."""
    ranges: dict[int, tuple[int, int]] = {}
    for e in final_history(read_events(directory)):
        if e["event"] == "commit" and e["committed"]:
            r = tuple(e["samples"])
            assert ranges.setdefault(e["step"], r) == r, f"step {e['step']} committed with {ranges[e['step']]} and {r}"
    steps = sorted(ranges)
    assert len(steps) >= min_steps and steps == list(range(1, len(steps) + 1)), f"committed steps {steps}"
    position = 0
    for step in steps:
        start, stop = ranges[step]
        assert start == position and stop > start, (
            f"step {step} trained positions {start}..{stop}, expected to start at {position}"
        )
        position = stop


CHECKPOINT_INTERVAL_STEPS = 10
"""How often the checkpointing groups of the tests save."""


def start_checkpointing_group(
    lighthouse: str, replica_id: str, tmp: Path, *args: str, **options: str
) -> ManagedProcess:
    """``options``: more ``REPLICAFT_*`` variables, e.g. ``REPLICAFT_RESUME_VERIFY_ACTION="stop"``."""
    env = dict(os.environ)
    env.update(
        REPLICAFT_LIGHTHOUSE=lighthouse,
        REPLICAFT_REPLICA_ID=replica_id,
        REPLICAFT_EVENTS_DIR=str(tmp / "events"),
        REPLICAFT_CHECKPOINT_DIR=str(tmp / "ckpt"),
        REPLICAFT_CHECKPOINT_INTERVAL_STEPS=str(CHECKPOINT_INTERVAL_STEPS),
        **options,
    )
    env.pop("REPLICAFT_FAULT_POINTS", None)
    return spawn_python(EXAMPLE, *args, name=replica_id, env=env)


def committed_digest(events: Path, step: int) -> str:
    for e in read_events(events):
        if e["event"] == "committed" and e["step"] == step:
            return e["digest"]
    raise AssertionError(f"no committed digest for step {step}")
