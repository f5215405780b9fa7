"""Warm standbys: interpreters that have imported torch and replicaft, waiting to become a
restarted group (``replicaft.standby``), each holding a memory reserve the size of a group's
state once the groups have told it.

They start only at quiet times (no group in its start-up), so their imports never compete
for the CPU with a group's start or heal; one that dies unused turns standbys off for the run.
"""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import Callable, Mapping

from replicaft.launch.children import Child
from replicaft.launch.options import LaunchOptions
from replicaft.restart_policy import describe_exit
from replicaft.standby import (
    READY_LINE,
    RESERVED_LINE,
    encode_activation,
    encode_reserve,
    reserve_bytes_for,
)

logger = logging.getLogger(__name__)

_RESERVED = re.compile(rf"{re.escape(RESERVED_LINE)} (\d+) bytes, pid (\d+)")


class StandbyPool:
    """``options.num_standbys()`` standbys at most; ``discard`` stops one that cannot be used."""

    def __init__(self, options: LaunchOptions, env: Callable[[], Mapping[str, str]],
                 write_line: Callable[[str], None], discard: Callable[[Child], None]) -> None:
        self.options = options
        self._env = env
        self._write_line = write_line
        self._discard = discard
        self.standbys: list[Child] = []
        self.off = options.num_standbys() == 0
        self.state_cpu_bytes = 0
        """The most host memory any group's state has reported (``state_size`` events)."""
        self._reserve_asked: dict[int, int] = {}
        """Standby pid -> the reserve it was asked for."""

    def take(self, variables: Mapping[str, str]) -> Child | None:
        """A live standby, activated with a group's ``variables``; None when there is none (the restart goes cold)."""
        while self.standbys:
            standby = self.standbys.pop(0)
            self._reserve_asked.pop(standby.pid, None)
            assert standby.popen.stdin is not None
            try:
                standby.popen.stdin.write(encode_activation(dict(variables)))
                standby.popen.stdin.close()
            except OSError as e:  # it died since the last tick
                logger.warning("warm standby pid %d could not be activated (%s); trying the next", standby.pid, e)
                self._discard(standby)
                continue
            return standby
        return None

    def note_state_size(self, cpu_bytes: int) -> None:
        self.state_cpu_bytes = max(self.state_cpu_bytes, cpu_bytes)

    def watch(self, *, quiet: bool) -> None:
        """Drop standbys that died unused (and stop starting them); start one when it is ``quiet``."""
        for standby in list(self.standbys):
            code = standby.popen.poll()
            if code is not None:
                self.standbys.remove(standby)
                self._reserve_asked.pop(standby.pid, None)
                self.off = True
                logger.warning("warm standby pid %d %s before it was used; restarts start cold from now on",
                               standby.pid, describe_exit(code))
        if self.off or not quiet:
            return
        self._ask_reserves()
        if len(self.standbys) >= self.options.num_standbys():
            return
        o = self.options
        argv = [sys.executable, "-m", "replicaft.standby", str(o.script), *o.script_args]
        standby = Child(argv, self._env(), self._on_line, stdin_pipe=True)
        self.standbys.append(standby)
        logger.info("starting warm standby pid %d", standby.pid)

    def _on_line(self, line: str) -> None:
        if line.startswith(READY_LINE):
            logger.info("warm standby pid %s ready", line.rsplit(" ", 1)[1])
        elif match := _RESERVED.fullmatch(line):
            logger.info("warm standby pid %s reserved %.1f MB for a restart", match.group(2), int(match.group(1)) / 1e6)
        else:
            self._write_line(f"[standby] {line}")

    def _ask_reserves(self) -> None:
        """Ask every standby for a reserve the size of the largest state reported, unless it has
        one that large; at quiet times only, as faulting it in takes a core for a second or two."""
        size = reserve_bytes_for(self.state_cpu_bytes) if self.options.standby_reserve else 0
        for standby in self.standbys:
            if size <= self._reserve_asked.get(standby.pid, 0):
                continue
            assert standby.popen.stdin is not None
            try:
                standby.popen.stdin.write(encode_reserve(size))
                standby.popen.stdin.flush()
            except OSError as e:  # it died since the last tick: dropped at the next one
                logger.warning("warm standby pid %d could not be asked for a reserve (%s)", standby.pid, e)
                continue
            self._reserve_asked[standby.pid] = size
