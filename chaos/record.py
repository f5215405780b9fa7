"""What a chaos run observed besides the groups' own event logs: faults injected, processes' exits.

These records are the harness's half of the evidence; the groups' JSON events are the other
half. Times are unix seconds (``time.time()``), the clock the groups stamp their events with,
so the two halves can be laid on one timeline. All records are plain frozen dataclasses, so
the invariant checks and figures that consume them are pure and tested with hand-written
values.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from chaos.scenario import Scenario

LIGHTHOUSE = "lighthouse"
"""The ``target`` of a ``kill_lighthouse`` fault."""
ALL_GROUPS = "all groups"
"""The ``target`` of ``kill_all_groups`` and ``corrupt_checkpoint``."""
DISK = "checkpoint disk"
"""The ``target`` of ``fill_disk``."""
JOB_TARGETS = frozenset({LIGHTHOUSE, ALL_GROUPS, DISK})
"""Targets that are not one group: every group's commits count as the job's recovery."""


@dataclass(frozen=True, slots=True)
class InjectedFault:
    kind: str
    """One of ``chaos.scenario.FAULT_KINDS``."""
    target: str
    """Replica id of the group hit, or ``"lighthouse"``."""
    ts: float
    """When the fault happened: the signal was sent, or (fault points, which the group fires
    itself) when the supervisor saw the process die, at most one poll interval later."""
    resumed_ts: float | None = None
    """When the target could run again: the group was respawned or got SIGCONT, or the
    lighthouse was restarted. None when it never came back (the run ended first)."""
    label: str = ""
    """The scenario's description of the fault, for reports."""
    detail: str = ""
    """What exactly was done, when the label does not say (the file and byte corrupted)."""
    checkpoint_step: int | None = None
    """``corrupt_checkpoint``: the step of the checkpoint that was damaged."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class ProcessExit:
    """A group process that ended while the run was still going."""

    group: str
    ts: float
    code: int
    """Exit status; negative = killed by that signal (``subprocess`` convention)."""
    caused_by: str | None
    """The injected fault kind that explains the exit, or None when nothing we did does."""
    step: int | None = None
    """The last step the job had committed when the exit was seen."""
    detail: str = ""
    """The last lines of the process's output, to show why an unexplained exit happened."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class RunRecord:
    """Everything the harness saw of one run, for the summary (the events are read from disk)."""

    scenario: Scenario
    out_dir: Path
    events_dir: Path
    started_ts: float
    ended_ts: float
    faults: tuple[InjectedFault, ...]
    skipped: tuple[tuple[str, str], ...]
    """(fault description, why it was not injected)."""
    exits: tuple[ProcessExit, ...]
    restarts: dict[str, int]
    stopped_at_end: tuple[str, ...]
    """Groups still running when the run ended (they were SIGKILLed)."""
    deadline_exceeded: bool
    environment: dict[str, str] = field(default_factory=dict)
    standby_restarts: dict[str, int] = field(default_factory=dict)
    """Of ``restarts``, those that ran in a warm standby (``warm_standby``)."""
    """How the run was placed: ``network`` (loopback, or the namespaces and addresses) and
    ``checkpoint_dir`` (where, and on what), for the summary's reader."""
