"""A group's departure: asked to leave, by SIGTERM or a preemption notice, it leaves at a boundary.

Neither the signal handler nor the notice's thread may act: the state is consistent only at a
step boundary. Both raise one flag (preemption.py's :class:`PreemptionFlag`, which takes no
lock, so a second SIGTERM inside the first one's handler cannot deadlock), and the step
carries it in the rank's vote, so every rank of a W > 1 group stops after the same step (the
persistence duties' module docstring, duties.py). What raised it first is kept as the reason
the stop event gives. When a notice came before the SIGTERM, the time between the two is
reported once, at close: it is the warning a notice bought.

Kept apart from the checkpoint duties because it is about the process, not the checkpoint:
it owns a signal handler (installed only on the main thread, restored at close) and the
notice's watcher thread, and is the same for a group that never writes a checkpoint.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from typing import Any

from replicaft.config.options import ManagerOptions
from replicaft.persistence.preemption import PreemptionFlag, PreemptionWatcher, parse_notice_source


class Departure:
    """One rank's request to leave. Built inactive; :meth:`start` installs the SIGTERM handler
    (main thread only) and starts the notice's watcher; :meth:`stop_watching` then
    :meth:`restore` undo them, in that order around the last checkpoint's close."""

    def __init__(self, options: ManagerOptions, emit: Callable[..., None]) -> None:
        self._emit = emit
        self.preempted = PreemptionFlag()
        self.reason = "SIGTERM"
        """What raised ``preempted`` first: SIGTERM, or a notice naming its source."""
        self._noticed_at: float | None = None
        self._sigterm_at: float | None = None
        source = parse_notice_source(options.preemption_notice, options.preemption_notice_kind)
        self._watcher = (
            PreemptionWatcher(
                source, options.preemption_poll_s, self.preempt, emit, f"{options.replica_id}/{options.group_rank}"
            )
            if source
            else None
        )
        self._previous_sigterm: Any = None

    def start(self) -> None:
        if threading.current_thread() is threading.main_thread():
            self._previous_sigterm = signal.signal(signal.SIGTERM, self._on_sigterm)
        if self._watcher is not None:
            self._watcher.start()

    def stop_watching(self) -> None:
        """No more notices: stop the watcher's thread (SIGTERM is still noted until :meth:`restore`)."""
        if self._watcher is not None:
            self._watcher.stop()

    def restore(self) -> None:
        """Put the previous SIGTERM handler back and report how long a notice came before the signal."""
        if self._previous_sigterm is not None:
            signal.signal(signal.SIGTERM, self._previous_sigterm)
            self._previous_sigterm = None
        if self._noticed_at is not None and self._sigterm_at is not None:
            # Reported here, not by the handler: emitting takes the event log's lock, which the
            # interrupted main thread may hold.
            self._emit("preemption_sigterm", after_notice_s=round(self._sigterm_at - self._noticed_at, 3))
            self._noticed_at = None  # reported once, should close() run twice

    def preempt(self, reason: str) -> None:
        """Any thread: leave at the next step boundary, as after SIGTERM. The first reason stays."""
        if not self.preempted.is_set():
            self.reason = reason
            self._noticed_at = time.monotonic()
        self.preempted.set()

    def _on_sigterm(self, *_: object) -> None:
        self._sigterm_at = time.monotonic()
        self.preempted.set()
