"""Structured events: one JSON object per line, per rank, for the chaos checker and benchmarks.

Schema (DESIGN.md, Conventions): every object has ``ts`` (unix seconds), ``event``,
``step``, ``quorum_id``, ``replica_id`` and ``group_rank``, plus event-specific fields:

=================  ==========================================================================
event              fields
=================  ==========================================================================
``start``          ``world_size``, ``pid``
``quorum``         ``latency_s``, ``num_replicas``, ``replica_rank``, ``max_step``,
                   ``healing``, ``participants``, ``reconfigured``
``collective_error`` ``error``, ``op``
``commit``         ``committed`` (bool), ``reason``, ``num_contributors``, ``healing``,
                   ``step_time_s``, plus what the step annotated (``Manager.annotate_commit``):
                   ``samples`` ([start, stop) of the global order, from the data sampler),
                   ``loss`` (from the training script)
``committed``      the state after committed step ``step``: ``digest``
``heal_start``     ``donors``, ``max_step``
``heal_end``       ``ok``, ``num_bytes``, ``in_place_bytes`` (received straight into this
                   rank's own tensors), ``seconds``, ``bytes_by_donor``, ``replayed_steps``,
                   ``base_step``, or ``error``
``checkpoint_start`` ``checkpoint_step``, ``background_copy_bytes`` (copied behind the next
                   step; 0: the whole snapshot was copied at the step boundary)
``checkpoint``     ``checkpoint_step``, ``ok``, ``status`` (published/refused/failed),
                   ``reason``, ``path``, ``num_bytes``
``resume``         ``checkpoint_step``, ``path``, ``digest`` (loaded from disk)
``fenced``         ``reason``
``stop``           ``reason``
=================  ==========================================================================

The writer is append-only with a flush per event, so a SIGKILL loses at most the event being
written; readers must skip a truncated last line.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any, TextIO


class EventLog:
    """Appends events of one rank to ``<dir>/<replica_id>-<group_rank>.jsonl``.

    A log without a directory discards events, so library code can emit unconditionally.
    Thread-safe: the training thread and the quorum thread both emit.
    """

    def __init__(self, directory: str | os.PathLike[str] | None, replica_id: str, group_rank: int) -> None:
        self.replica_id = replica_id
        self.group_rank = group_rank
        self.path: Path | None = None
        self._file: TextIO | None = None
        self._lock = threading.Lock()
        if directory is not None:
            Path(directory).mkdir(parents=True, exist_ok=True)
            self.path = Path(directory) / f"{replica_id}-{group_rank}.jsonl"
            self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - owned until close()
            if self._file.tell() and _last_byte(self.path) != b"\n":
                # A previous incarnation was killed mid-line: end that line, so our first event
                # is not glued onto it (readers skip the truncated line, not ours).
                self._file.write("\n")

    def emit(self, event: str, *, step: int, quorum_id: int, **fields: Any) -> None:
        if self._file is None:
            return
        record = {
            "ts": time.time(),
            "event": event,
            "step": step,
            "quorum_id": quorum_id,
            "replica_id": self.replica_id,
            "group_rank": self.group_rank,
            **fields,
        }
        line = json.dumps(record, separators=(",", ":"), default=str)
        with self._lock:
            self._file.write(line + "\n")
            self._file.flush()

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None


def _last_byte(path: Path) -> bytes:
    with open(path, "rb") as f:
        f.seek(-1, os.SEEK_END)
        return f.read(1)


def read_events(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Read one rank's events, skipping a truncated last line (the rank was killed mid-write)."""
    events = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                events.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return events
