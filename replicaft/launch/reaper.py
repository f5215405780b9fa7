"""Stopping processes for good: a child, everything below it, and whatever it orphaned.

The launcher is a child subreaper (``PR_SET_CHILD_SUBREAPER``), so a process orphaned by a
dead child (a rank whose torchrun was killed) is re-parented to the launcher rather than to
init: a leftover. It belongs to a failed group and must go with it, so every stop takes the
leftovers too, found in ``/proc`` at the moment of the stop.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Callable, Sequence

from replicaft.launch.children import Child
from replicaft.process.process_tree import read_process_table, running_below, send_signal

logger = logging.getLogger(__name__)

TICK_S = 0.1
"""How often a stop looks whether the processes are gone."""
KILL_WAIT_S = 5.0
"""After SIGKILL only a process stuck in the kernel survives; we wait this long, then report it."""


class Reaper:
    """Stops children with SIGTERM, a grace period and SIGKILL; ``kill_now`` skips the grace.

    ``started`` lists every child the launcher holds, so that a leftover is told apart from
    a child of its own. ``leftovers=False`` for a supervisor that is no subreaper and holds
    other children of its own (the chaos runner's lighthouse): only what is below the children
    asked for is stopped."""

    def __init__(
        self, started: Callable[[], Sequence[Child]], kill_now: Callable[[], bool], *, leftovers: bool = True
    ) -> None:
        self._started = started
        self._kill_now = kill_now
        self._leftovers = leftovers

    def terminate(self, children: Sequence[Child], *, grace_s: float) -> None:
        """Stop ``children``, everything below them and every leftover (see :meth:`processes_of`).

        SIGTERM, then SIGKILL after ``grace_s`` or at once once ``kill_now``. Blocks for at
        most ``grace_s + KILL_WAIT_S`` plus a tick.
        """
        send_signal(self.processes_of(children), signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while self.processes_of(children) and time.monotonic() < deadline and not self._kill_now():
            time.sleep(TICK_S)
        self.kill(children)

    def kill(self, children: Sequence[Child]) -> None:
        """SIGKILL ``children``, everything below them and every leftover, and wait until they are
        gone: at most ``KILL_WAIT_S`` plus a tick, then the survivors are reported."""
        pids = self.processes_of(children)
        deadline = time.monotonic() + KILL_WAIT_S
        while pids and time.monotonic() < deadline:
            send_signal(pids, signal.SIGKILL)  # again each tick: it also reaches what they forked
            time.sleep(TICK_S)
            pids = self.processes_of(children)
        if pids:
            logger.error("processes %s survived SIGKILL for %gs (stuck in the kernel?)", pids, KILL_WAIT_S)
        for child in children:
            child.join_output(1.0)

    def processes_of(self, children: Sequence[Child]) -> list[int]:
        """The running processes of ``children`` and below them, plus every leftover.

        Reaps the children and leftovers that have exited (Popen reaps its own, waitpid the rest).
        """
        for child in children:
            child.popen.poll()
        table = read_process_table()
        started = {child.pid for child in self._started()}
        leftovers = [
            info for info in table.values() if self._leftovers and info.ppid == os.getpid() and info.pid not in started
        ]
        for info in leftovers:
            if info.zombie:
                try:
                    os.waitpid(info.pid, os.WNOHANG)
                except ChildProcessError:
                    pass
        return running_below([c.pid for c in children] + [info.pid for info in leftovers], table)
