"""Structured events: one JSON object per line, per rank, for the chaos checker and benchmarks.

Schema (DESIGN.md, Conventions): every object has ``ts`` (unix seconds), ``event``,
``step``, ``quorum_id``, ``replica_id`` and ``group_rank``, plus event-specific fields:

=================  ==========================================================================
event              fields
=================  ==========================================================================
``start``          ``world_size``, ``pid``, ``metrics_url`` (None: no metrics endpoint)
``quorum``         ``latency_s``, ``num_replicas``, ``replica_rank``, ``max_step``,
                   ``healing``, ``participants``, ``reconfigured``
``collective_error`` ``error``, ``op``
``commit``         ``committed`` (bool), ``reason``, ``num_contributors``, ``healing``,
                   ``step_time_s``, plus what the step annotated (``Manager.annotate_commit``):
                   ``samples`` ([start, stop) of the global order, from the data sampler),
                   ``loss`` (from the training script)
``committed``      the state after committed step ``step``: ``digest`` (``state.flat.step_digest``,
                   comparable only with other events' digests, not a checkpoint manifest's)
``heal_start``     ``donors``, ``max_step``, ``hold`` (this attempt holds the donors, catchup.py)
``heal_end``       ``ok``, ``num_bytes``, ``in_place_bytes`` (received straight into this
                   rank's own tensors), ``seconds``, ``bytes_by_donor``, ``refetched_stripes``
                   (after a donor failed or sent a bad chunk), ``taken_over_stripes`` (from a
                   slower donor), ``replayed_steps``, ``base_step``, or ``error``
``serve_end``      a donor stopped serving its live state (transfer/live.py): ``served_step``,
                   ``readers`` (healers expected), ``waited_s`` (for them to be sent the
                   rest), ``kept_bytes`` (copied for them), ``reused_buffer`` (copied into
                   the spare host buffer a checkpoint also uses), ``shut``, ``ok``, ``error``
                   (withdrawn)
``drain``          at stop, a donor kept serving healers still fetching from it (heal/donor.py):
                   ``waited_s``, ``abandoned`` (healers not sent everything by
                   ``heal_timeout_s``; each fails its heal)
``checkpoint_start`` ``checkpoint_step``, ``background_copy_bytes`` (copied behind the next
                   step; 0: the whole snapshot was copied at the step boundary), ``host_bytes``
``checkpoint``     ``checkpoint_step``, ``ok``, ``status`` (published/refused/failed),
                   ``reason``, ``path``, ``num_bytes`` (written by this save), ``kind``
                   (base/increment), and the figures of checkpoint/telemetry.py: ``duration_s``,
                   ``blocked_s``, ``throughput_mb_s``, ``tier``, ``host_bytes``, ``free_bytes``
``checkpoint_anomaly`` a warning (checkpoint/telemetry.py): ``checkpoint_step``, ``kind``
                   (slow_save/disk_filling/tier_behind), ``reason``, ``value``, ``threshold``
``checkpoint_upload`` a checkpoint uploaded to the object-store tier (or not): ``checkpoint_step``,
                   ``name``, ``ok``, ``reason``, ``num_bytes`` (sent), ``seconds``, ``tier``
``resume``         ``checkpoint_step``, ``path``, ``digest`` (loaded from disk), and the
                   figures of a load: ``duration_s``, ``blocked_s``, ``num_bytes``,
                   ``throughput_mb_s``, ``tier``, ``host_bytes``
``resume_verdict`` after a resume from disk, the first ``resume_verify_steps`` losses against the
                   checkpoint's loss trajectory (resume_check.py): ``verdict``
                   (ok/diverged/not_enough_data), ``checkpoint_step``, ``reference_steps``,
                   ``reference_mean``, ``reference_spread``, ``new_losses``, ``new_mean``,
                   ``deviation``, ``allowed``, ``tolerance``, ``action`` (warn/stop), ``reason``
``resume_store_waiting`` at start, with no local checkpoint, the object store could not be asked whether
                   one exists (resume_question.py); the group waits, asking again at each quorum, and
                   does not train from scratch: ``store``, ``waited_s``, ``error``
``non_finite_metric`` a metric reported with ``Manager.report_metrics`` was NaN or infinite (a loss
                   that blew up): ``metric``, ``value`` (``"nan"``, ``"inf"``, ``"-inf"``); it is
                   not saved with the checkpoint, and training goes on
``checkpoint_cadence`` ``checkpoint_interval="auto"`` chose an interval (cadence.py): ``interval_s``,
                   ``rule_s`` (Young/Daly before the bounds), ``cost_s``, ``blocked_s``, ``write_s``,
                   ``num_saves_measured``, ``mtbf_s``, ``mtbf_source`` (prior/member_losses/observed),
                   ``min_s``, ``max_s``, ``prior_mtbf_s``, ``min_total_failures``, ``history``
                   (the failure counts), ``reason``
``catalog_rebuilt`` the checkpoint catalog (``DIR/catalog.sqlite``) was missing or unreadable at
                   start and was rebuilt from the manifests (checkpoint/catalog.py): ``reason``
``catalog_update_failed`` a published save's catalog row could not be written
                   (checkpoint/catalog.py; the save is published all the same):
                   ``checkpoint_step``, ``error``
``preemption_notice`` a preemption notice was read (preemption.py); the rank leaves at the next
                   step boundary, as after SIGTERM: ``source``, ``kind``, ``reason``
``preemption_source_error`` the notice source cannot be read (once, until it can again):
                   ``source``, ``kind``, ``error``
``preemption_sigterm`` SIGTERM came after a notice: ``after_notice_s`` (the warning it gave)
``state_size``     once per process, after its first commit: ``num_bytes`` of state, of them
                   ``cpu_bytes`` in host memory (the launcher sizes a standby's reserve by it);
                   ``reserve_bytes`` of memory this process had faulted in as a standby,
                   ``reserve_used_bytes`` of them taken by its buckets and heal (reserve.py)
``fenced``         ``reason``
``stop``           ``reason``
=================  ==========================================================================

A sink (``EventLog(sink=...)``, e.g. replicaft/telemetry/metrics.py) sees every event, with or without a
directory: the metrics are derived from the events, never measured a second time.

The writer is append-only with a flush per event, so a SIGKILL loses at most the event being
written. Readers (:class:`EventTail`, :func:`read_events_dir`, used by the launcher, the chaos
harness and the benchmarks) return complete lines only. A restarted rank ends a truncated line
before its first event; a line glued to a fragment anyway (written by something else) is
recovered from its last ``{"ts":``, which is how every event begins.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

logger = logging.getLogger(__name__)


class EventLog:
    """Appends events of one rank to ``<dir>/<replica_id>-<group_rank>.jsonl``.

    A log without a directory discards events, so library code can emit unconditionally.
    Thread-safe: the training thread and the quorum thread both emit. ``sink`` is called with
    every event's record, on the emitting thread; an exception from it is logged, never raised
    into training.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str] | None,
        replica_id: str,
        group_rank: int,
        *,
        sink: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        self.replica_id = replica_id
        self._sink = sink
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
        if self._file is None and self._sink is None:
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
        if self._sink is not None:
            try:
                self._sink(record)
            except Exception:  # a metrics bug must not stop a training step
                logger.exception("event sink failed on a %s event; the event is still logged", event)
        if self._file is None:
            return
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


_EVENT_START = '{"ts":'


def parse_line(line: str) -> dict[str, Any] | None:
    """One event from one line, recovering an event glued to a truncated predecessor."""
    for candidate in (line, line[line.rfind(_EVENT_START) :] if _EVENT_START in line else ""):
        if not candidate:
            continue
        try:
            obj = json.loads(candidate)
        except ValueError:
            continue
        if isinstance(obj, dict) and "event" in obj:
            return obj
    return None


class EventTail:
    """New events from every ``*.jsonl`` file in a directory, each file in its own order."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._offsets: dict[Path, int] = {}

    def poll(self) -> list[dict[str, Any]]:
        """Events appended since the last call (complete lines only). Does not block."""
        events: list[dict[str, Any]] = []
        for path in sorted(self.directory.glob("*.jsonl")):
            offset = self._offsets.get(path, 0)
            try:
                with open(path, "rb") as f:
                    f.seek(offset)
                    data = f.read()
            except OSError as e:
                logger.warning("cannot read event file %s: %s; retrying at the next poll", path, e)
                continue
            end = data.rfind(b"\n") + 1
            self._offsets[path] = offset + end
            for raw in data[:end].decode("utf-8", errors="replace").splitlines():
                event = parse_line(raw)
                if event is not None:
                    events.append(event)
        return events


def read_events_dir(directory: Path) -> list[dict[str, Any]]:
    """Every complete event in the directory, file by file (a truncated last line is dropped)."""
    return EventTail(directory).poll()
